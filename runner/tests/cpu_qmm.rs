//! Grove's CPU quantized matmul (`model::layers::cpu_qmm`, an MLX primitive)
//! against MLX's own `quantized_matmul` on the CPU, on random matrices: 4 and
//! 8 bits, groups of 32/64/128, 1-17 rows of x (the decode path below 4 rows,
//! the tiled path with its 3-row and 1-row tails above), N not a multiple of
//! the 16-row blocks or 4-row tiles, K over several 1024-value blocks with a
//! short last one, batch dimensions, a transposed (strided) x, and float16 and
//! bfloat16 scales and biases. Only the order of float32 sums differs from
//! MLX's kernel, so the two agree to float32 rounding. Products it does not
//! cover are left to MLX (`None`).
use mlx_rs::{Array, Dtype};

use grove_runner::model::config::{QuantMode, QuantParams};
use grove_runner::model::layers::cpu_qmm;
use grove_runner::model::layers::quant_ops::QuantRef;

fn max_abs(a: &Array) -> f32 {
    a.abs().unwrap().max(None).unwrap().item_cast::<f32>()
}

struct Case {
    x_shape: Vec<i32>,
    n: i32,
    bits: i32,
    group: i32,
    scale_dtype: Dtype,
    transposed_x: bool,
}

fn check(c: &Case, seed: u64) {
    let k = *c.x_shape.last().unwrap();
    let what = format!(
        "x {:?} N {} {}-bit g{} scales {:?}{}",
        c.x_shape,
        c.n,
        c.bits,
        c.group,
        c.scale_dtype,
        if c.transposed_x { " (x strided)" } else { "" }
    );
    let key = mlx_rs::random::key(seed).unwrap();
    let (k1, k2) = mlx_rs::random::split(&key, 2).unwrap();
    let w = mlx_rs::random::normal::<f32>(&[c.n, k], None, 0.05, &k1).unwrap();
    let x = if c.transposed_x {
        // A view with strides (1, k): MLX's own kernel copies it first.
        let mut shape = c.x_shape.clone();
        shape.reverse();
        mlx_rs::random::normal::<f32>(&shape, None, None, &k2)
            .unwrap()
            .t()
    } else {
        mlx_rs::random::normal::<f32>(&c.x_shape, None, None, &k2).unwrap()
    };
    let (wq, scales, biases) = mlx_rs::ops::quantize(&w, c.group, c.bits).unwrap();
    let scales = scales.as_dtype(c.scale_dtype).unwrap();
    let biases = biases.as_dtype(c.scale_dtype).unwrap();
    let q = QuantRef {
        weight: &wq,
        scales: &scales,
        biases: Some(&biases),
        params: QuantParams {
            group_size: c.group,
            bits: c.bits,
            mode: QuantMode::Affine,
        },
    };
    let mlx =
        mlx_rs::ops::quantized_matmul(&x, &wq, &scales, &biases, true, c.group, c.bits).unwrap();
    let ours = cpu_qmm::qmm_always(&x, &q)
        .unwrap_or_else(|| panic!("{what}: not covered"))
        .unwrap();
    assert_eq!(ours.shape(), mlx.shape(), "{what}: shape");
    assert_eq!(ours.dtype(), Dtype::Float32, "{what}: dtype");
    let scale = max_abs(&mlx).max(1e-6);
    let err = max_abs(&ours.subtract(&mlx).unwrap()) / scale;
    // float32 sums of K products in a different order: a few ulps of the
    // largest output per sqrt(K) terms.
    let bound = 2e-6 * (k as f32).sqrt();
    assert!(
        err <= bound,
        "{what}: max error {err:.2e} of the largest output, over {bound:.1e}"
    );
}

#[test]
fn grove_cpu_qmm_matches_mlx_on_every_covered_shape() {
    if !mlx_rs::Device::default()
        .get_type()
        .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Cpu))
    {
        eprintln!("not on the CPU backend: the kernel is not used");
        return;
    }
    let mut seed = 1;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            for (rows, n, k) in [
                (1, 96, 256),
                (2, 37, 1024),
                (3, 130, 1536),
                (4, 64, 2176),
                (5, 21, 384),
                (7, 200, 640),
                (17, 35, 1152),
            ] {
                for scale_dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                    if scale_dtype != Dtype::Float32 && rows != 5 {
                        continue;
                    }
                    seed += 1;
                    check(
                        &Case {
                            x_shape: vec![rows, k],
                            n,
                            bits,
                            group,
                            scale_dtype,
                            transposed_x: false,
                        },
                        seed,
                    );
                }
            }
        }
    }
    // Batch dimensions, and a strided x, at both paths.
    for (shape, transposed_x) in [
        (vec![2, 3, 512], false),
        (vec![1, 1, 512], false),
        (vec![6, 512], true),
        (vec![2, 512], true),
    ] {
        seed += 1;
        check(
            &Case {
                x_shape: shape,
                n: 48,
                bits: 4,
                group: 64,
                scale_dtype: Dtype::Float32,
                transposed_x,
            },
            seed,
        );
    }
}

#[test]
fn products_it_does_not_cover_are_left_to_mlx() {
    let key = mlx_rs::random::key(7).unwrap();
    let w = mlx_rs::random::normal::<f32>(&[64, 256], None, 0.05, &key).unwrap();
    let x = mlx_rs::random::normal::<f32>(&[2, 256], None, None, &key).unwrap();
    for (bits, x) in [
        (2, x.clone()),
        (3, x.clone()),
        (6, x.clone()),
        (4, x.as_dtype(Dtype::Float16).unwrap()),
        (4, x.as_dtype(Dtype::Bfloat16).unwrap()),
    ] {
        let (wq, scales, biases) = mlx_rs::ops::quantize(&w, 64, bits).unwrap();
        let q = QuantRef {
            weight: &wq,
            scales: &scales,
            biases: Some(&biases),
            params: QuantParams {
                group_size: 64,
                bits,
                mode: QuantMode::Affine,
            },
        };
        assert!(
            cpu_qmm::qmm_always(&x, &q).is_none(),
            "{bits}-bit, x {:?}: should be left to MLX",
            x.dtype()
        );
    }
}
