// Host-side launching shared by the library's primitives (decode.cu,
// pick.cu): errors, whether the GPU takes programmatic dependent launches,
// and a launch as one.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace grove_fd {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("[grove decode] ") + what + ": " + cudaGetErrorString(e));
}

// An attribute of the current GPU.
inline int device_attr(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&value, attr, dev), "device");
  return value;
}

// Whether the GPU takes programmatic dependent launches (Hopper on).
inline bool pdl_supported() { return device_attr(cudaDevAttrComputeCapabilityMajor) >= 9; }

// kernel<<<grid, block, smem, s>>>(args...), launched as a programmatic
// dependent of the stream's last kernel where `dependent` says so.
template <class... P, class... A>
void launch(bool dependent, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            A&&... args) {
  cudaLaunchConfig_t c{};
  c.gridDim = grid;
  c.blockDim = block;
  c.dynamicSmemBytes = smem;
  c.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = dependent ? 1 : 0;
  c.attrs = at;
  c.numAttrs = 1;
  check(cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...), "launch");
}

}  // namespace grove_fd
