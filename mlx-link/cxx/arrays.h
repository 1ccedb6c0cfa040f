// Reading MLX's arrays in Grove's CPU primitives.
#pragma once
#include <cstdint>
#include <vector>

#include "mlx/array.h"

namespace grove_cpu {

// The elements of `a` in row-major order: its own buffer when row-contiguous,
// else gathered into `tmp` by its strides.
template <class T>
inline const T* row_major(const mlx::core::array& a, std::vector<T>& tmp) {
  if (a.flags().row_contiguous) return a.data<T>();
  tmp.resize(a.size());
  const T* src = a.data<T>();
  const int nd = a.ndim();
  std::vector<int> idx(nd, 0);
  for (size_t i = 0; i < a.size(); i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += (int64_t)idx[d] * a.strides()[d];
    tmp[i] = src[off];
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < a.shape(d)) break;
      idx[d] = 0;
    }
  }
  return tmp.data();
}

}  // namespace grove_cpu
