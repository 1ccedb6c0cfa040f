// Which per-instruction-set build of Grove's CPU kernels runs here, chosen
// once for all of them.
#pragma once
#include <cstdlib>
#include <cstring>

namespace grove_cpu {

enum class Isa { Base, Avx2, Avx512 };

// AVX2+FMA where the CPU has them. AVX-512 only when GROVE_CPU_ISA=avx512
// asks (and the CPU has F, BW and VL): on the Xeon this was measured on, the
// quantized matmul's AVX-512 build was slower than AVX2's on every path
// (decode from memory 8.2 vs 8.8 Gweights/s per thread, from L2 11 vs 13,
// prefill 65 vs 85 GFLOP/s); only that kernel has one, the others run AVX2.
// The baseline (SSE2 on x86-64, NEON on arm64) with GROVE_CPU_ISA=sse2 or
// where nothing better runs.
inline Isa cpu_isa() {
  static const Isa isa = [] {
#if defined(__x86_64__)
    const char* forced = std::getenv("GROVE_CPU_ISA");
    const bool want512 = forced && std::strcmp(forced, "avx512") == 0;
    const bool want_base = forced && std::strcmp(forced, "sse2") == 0;
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx512 && want512) return Isa::Avx512;
    if (avx2 && !want_base) return Isa::Avx2;
#endif
    return Isa::Base;
  }();
  return isa;
}

}  // namespace grove_cpu
