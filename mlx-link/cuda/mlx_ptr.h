// The device address of an MLX array's data on its CUDA backend, shared by
// the library's primitives (decode.cu, pick.cu).
#pragma once
#include "mlx/array.h"
#include "mlx/backend/cuda/allocator.h"

namespace grove_fd {

inline const void* ptr(const mlx::core::array& a) {
  // offset() counts bytes, as MLX's own gpu_ptr takes it.
  auto& buf = const_cast<mlx::core::array&>(a).buffer();
  return static_cast<const char*>(static_cast<mlx::core::cu::CudaBuffer*>(buf.ptr())->data) + a.offset();
}
inline void* mut_ptr(mlx::core::array& a) { return const_cast<void*>(ptr(a)); }

}  // namespace grove_fd
