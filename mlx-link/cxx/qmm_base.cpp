// The kernels (quantized matmul, attention, gated activations) for the compiler's baseline: SSE2
// on x86-64, NEON on arm64.
#define GROVE_QMM_NS base
#define GROVE_VL 8
#include "qmm_kernel.h"
#include "attn_kernel.h"
#include "act_kernel.h"
