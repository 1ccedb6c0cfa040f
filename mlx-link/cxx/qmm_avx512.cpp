// The kernel for x86-64 CPUs with AVX-512 F/BW (built with -mavx512f -mavx512bw
// -mfma; called only where the CPU reports them).
#define GROVE_QMM_NS avx512
#define GROVE_VL 16
#include "qmm_kernel.h"
