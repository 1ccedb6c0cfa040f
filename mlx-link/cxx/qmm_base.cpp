// The kernels (quantized matmul, attention) for the compiler's baseline: SSE2
// on x86-64, NEON on arm64.
#define GROVE_QMM_NS base
#define GROVE_VL 8
#include "qmm_kernel.h"
#include "attn_kernel.h"
