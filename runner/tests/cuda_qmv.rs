//! Grove's CUDA quantized matvec (`model::layers::cuda_qmv`) against MLX's own
//! `quantized_matmul` and against the float product of the dequantized
//! weights. On a CUDA GPU (the GPU machine runs this test binary) it checks
//! the kernel for 4- and 8-bit weights, groups of 32/64/128, 1-4 rows of x
//! and an odd number of 16-byte steps per row; everywhere else it checks
//! that the kernel is not used and the product is MLX's, bit for bit.
use mlx_rs::{Array, Dtype};

use grove_runner::model::config::{QuantMode, QuantParams};
use grove_runner::model::layers::cuda_qmv;
use grove_runner::model::layers::quant_ops::{QuantRef, quantized_matmul};

fn max_abs(a: &Array) -> f32 {
    a.abs().unwrap().max(None).unwrap().item_cast::<f32>()
}

#[test]
fn grove_qmv_matches_mlx_or_is_not_used() {
    // Every covered product, not only large ones (read once, before first use).
    // SAFETY: this binary's only test sets it before any thread reads it.
    unsafe { std::env::set_var("GROVE_CUDA_QMV", "all") };
    let cuda = cuda_qmv::on_cuda_gpu();
    // (rows of x, N, K, bits, group); K = 1536 gives 4-bit rows of 48 steps.
    let cases = [
        (1, 256, 1024, 4, 64),
        (1, 256, 1536, 4, 32),
        (3, 128, 2048, 4, 128),
        (4, 64, 1024, 8, 64),
        (2, 130, 512, 8, 32),
        (1, 96, 4096, 8, 128),
    ];
    for (m, n, k, bits, group) in cases {
        let key = mlx_rs::random::key(u64::from((m * 31 + n + k + bits) as u32)).unwrap();
        let w = mlx_rs::random::normal::<f32>(&[n, k], None, 0.02, &key).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[1, m, k], None, None, &key)
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let w = w.as_dtype(Dtype::Bfloat16).unwrap();
        let (wq, scales, biases) = mlx_rs::ops::quantize(&w, group, bits).unwrap();
        let q = QuantRef {
            weight: &wq,
            scales: &scales,
            biases: Some(&biases),
            params: QuantParams {
                group_size: group,
                bits,
                mode: QuantMode::Affine,
            },
        };
        let mlx =
            mlx_rs::ops::quantized_matmul(&x, &wq, &scales, &biases, true, group, bits).unwrap();
        let ours = quantized_matmul(&x, &q).unwrap();
        assert_eq!(
            ours.shape(),
            &[1, m, n],
            "case {m}x{n}x{k} {bits}-bit g{group}"
        );
        match cuda_qmv::qmv(&x, &q) {
            None => {
                assert!(!cuda, "the kernel covers {m}x{n}x{k} {bits}-bit g{group}");
                let same = ours
                    .eq(&mlx)
                    .unwrap()
                    .all(None)
                    .unwrap()
                    .item_cast::<bool>();
                assert!(same, "off CUDA the product is MLX's own");
            }
            Some(got) => {
                let got = got.unwrap().as_dtype(Dtype::Float32).unwrap();
                let deq = mlx_rs::ops::dequantize(&wq, &scales, &biases, group, bits)
                    .unwrap()
                    .as_dtype(Dtype::Float32)
                    .unwrap();
                let exact = x.as_dtype(Dtype::Float32).unwrap().matmul(deq.t()).unwrap();
                let scale = max_abs(&exact);
                let err = max_abs(&got.subtract(&exact).unwrap()) / scale;
                let err_mlx = max_abs(
                    &mlx.as_dtype(Dtype::Float32)
                        .unwrap()
                        .subtract(&exact)
                        .unwrap(),
                ) / scale;
                eprintln!(
                    "{m}x{n}x{k} {bits}-bit g{group}: max rel error {err:.1e} (MLX's {err_mlx:.1e})"
                );
                // bfloat16 output: 2^-8 of the largest value, plus MLX's own error.
                assert!(err <= 8e-3, "{m}x{n}x{k} {bits}-bit g{group}: error {err}");
            }
        }
    }
}
