/* Grove: force-included into bindgen's parse of the mlx-c headers. Claims half.h's
 * guard and declares both half types as 2-byte integers; the Rust names mlx-rs
 * expects (a tuple struct float16_t and bfloat16_t = u16) come from src/lib.rs. */
#ifndef MLX_HALF_H
#define MLX_HALF_H
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
typedef uint16_t float16_t;
typedef uint16_t bfloat16_t;
#endif
