// The base of the library's MLX primitives (decode.cu, pick.cu): each runs on
// a CUDA GPU only, so its CPU evaluation refuses by the primitive's name,
// and that name is what MLX (and the pick, for the step's logits) sees.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace grove_fd {

class CudaOnly : public mlx::core::Primitive {
 public:
  CudaOnly(mlx::core::Stream s, const char* name) : mlx::core::Primitive(s), name_(name) {}

  void eval_cpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw std::runtime_error(std::string("[") + name_ + "] runs on a CUDA GPU only");
  }
  const char* name() const override { return name_; }
  bool is_equivalent(const mlx::core::Primitive&) const override { return false; }

 private:
  const char* name_;  // a string literal
};

}  // namespace grove_fd
