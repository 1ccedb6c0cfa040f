// MLX's arrays in Grove's CPU primitives: reading them, and queueing a
// primitive's work on the CPU stream.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

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

// Gives `outputs` their buffers, registers them and `inputs` with stream
// `s`'s encoder (which holds them until the task ran), and queues
// task(in, out) on it over weak copies of both, as MLX's own CPU ops do.
template <class F>
void dispatch(mlx::core::Stream s, const std::vector<mlx::core::array>& inputs,
              std::vector<mlx::core::array>& outputs, F&& task) {
  using mlx::core::array;
  auto& encoder = mlx::core::cpu::get_command_encoder(s);
  for (auto& out : outputs) out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  for (auto& in : inputs) encoder.set_input_array(in);
  for (auto& out : outputs) encoder.set_output_array(out);
  std::vector<array> in, out;
  for (auto& a : inputs) in.push_back(array::unsafe_weak_copy(a));
  for (auto& a : outputs) out.push_back(array::unsafe_weak_copy(a));
  encoder.dispatch([in = std::move(in), out = std::move(out),
                    task = std::forward<F>(task)]() mutable { task(in, out); });
}

// The same for a primitive of one output.
template <class F>
void dispatch(mlx::core::Stream s, const std::vector<mlx::core::array>& inputs,
              mlx::core::array& output, F&& task) {
  std::vector<mlx::core::array> outputs{output};  // shares output's data
  dispatch(s, inputs, outputs, std::forward<F>(task));
}

}  // namespace grove_cpu
