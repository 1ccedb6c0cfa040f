// The kernels (quantized matmul, attention, gated activations) for x86-64 CPUs with AVX2 and FMA
// (built with -mavx2 -mfma -mf16c; called only where the CPU reports both).
#define GROVE_QMM_NS avx2
#define GROVE_VL 8
#include "qmm_kernel.h"
#include "attn_kernel.h"
#include "act_kernel.h"
