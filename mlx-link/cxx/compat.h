/* Grove: force-included (-include) into every C++ file of mlx-c on Linux.
 *
 * 1. mlx-c's half.h only names float16_t/bfloat16_t on aarch64, yet mlx-rs calls
 *    the float16/bfloat16 accessors everywhere. We claim half.h's include guard and
 *    give both names MLX's own half types, on every architecture.
 * 2. GCC 12's libstdc++ has no <format>; mlx-c only uses std::format with plain
 *    "{}" placeholders, so a small fallback covers it.
 * CMake compiles its own probe programs with these flags and without MLX's include
 * path, so everything taken from MLX sits behind __has_include. */
#ifndef GROVE_MLX_COMPAT_H
#define GROVE_MLX_COMPAT_H

#ifdef __cplusplus
#if __has_include(<mlx/types/half_types.h>)
#include <mlx/types/half_types.h>
#define MLX_HALF_H
#define HAS_FLOAT16
#define HAS_BFLOAT16
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#endif

#if !__has_include(<format>)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
namespace grove_format_detail {
inline void put(std::ostringstream& out, std::string_view& fmt) {
  out << fmt;
  fmt = {};
}
template <typename T, typename... Rest>
void put(std::ostringstream& out, std::string_view& fmt, const T& value,
         const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    put(out, fmt);
    return;
  }
  out << fmt.substr(0, at) << value;
  fmt = fmt.substr(at + 2);
  put(out, fmt, rest...);
}
} // namespace grove_format_detail
template <typename... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  grove_format_detail::put(out, fmt, args...);
  return out.str();
}
} // namespace std
#endif
#endif /* __cplusplus */

#endif /* GROVE_MLX_COMPAT_H */
