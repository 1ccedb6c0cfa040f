// MLX's CUDA headers include <fmt/format.h> for error messages in templates
// that Grove's decode step never instantiates; the mlx-cuda wheel ships no
// fmt. This declares the one name those templates use, so that they parse.
#pragma once
#include <string>
namespace fmt {
template <class... Args>
std::string format(const char* pattern, Args&&... args);
}  // namespace fmt
