//! Grove's greedy pick (`model::layers::cuda_pick`) against MLX's own
//! `argmax(x - logsumexp(x))`, token for token. On a CUDA GPU (the GPU
//! machine runs this test binary) it checks the pick on bfloat16, float16
//! and float32 rows of several lengths (a block's 4096 values and one more,
//! Llama's and Qwen's vocabularies), ties (the first index wins), rows of
//! -inf, rows with NaN and +inf, each evaluated first, and that logits not
//! yet evaluated (made by MLX's operations, which it could overtake) are
//! left to MLX; everywhere else it checks that the pick is not taken and
//! `greedy_tokens` gives MLX's tokens.
use mlx_rs::{Array, Dtype};

use grove_runner::model::layers::cuda_lib;
use grove_runner::model::layers::cuda_pick::greedy_pick;
use grove_runner::sample::greedy_tokens;

fn mlx_tokens(x: &Array) -> Vec<u32> {
    let lse = x.logsumexp_axis(-1, true).unwrap();
    let t = mlx_rs::ops::indexing::argmax_axis(x.subtract(&lse).unwrap(), -1, None).unwrap();
    t.as_slice::<u32>().to_vec()
}

fn random_rows(rows: i32, n: i32, seed: u64, dtype: Dtype) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(&[rows, n], None, 3.0, &key)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

fn rows_of(values: Vec<Vec<f32>>, dtype: Dtype) -> Array {
    let n = values[0].len() as i32;
    let flat: Vec<f32> = values.iter().flatten().copied().collect();
    Array::from_slice(&flat, &[values.len() as i32, n])
        .as_dtype(dtype)
        .unwrap()
}

#[test]
fn greedy_pick_matches_mlx_or_is_not_taken() {
    let cuda = cuda_lib::wanted();
    let n = 70_001;
    let mut ties = vec![0.5f32; n];
    for i in [60_000, 5_000, 9_000] {
        ties[i] = 7.0;
    }
    let mut nan = vec![1.0f32; n];
    nan[10] = f32::NAN;
    nan[20_000] = 4.0;
    let mut inf = vec![1.0f32; n];
    inf[30_000] = f32::INFINITY;
    let special = vec![ties, vec![f32::NEG_INFINITY; n], nan, inf];
    let mut cases = vec![
        ("bf16 2x128256", random_rows(2, 128_256, 1, Dtype::Bfloat16)),
        ("f16 1x151936", random_rows(1, 151_936, 2, Dtype::Float16)),
        ("f32 3x4097", random_rows(3, 4097, 3, Dtype::Float32)),
        ("bf16 5x4096", random_rows(5, 4096, 4, Dtype::Bfloat16)),
        ("bf16 1x7", random_rows(1, 7, 5, Dtype::Bfloat16)),
    ];
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        cases.push(("special rows", rows_of(special.clone(), dtype)));
    }
    // Not evaluated yet: left to MLX's operations.
    let lazy = random_rows(1, 1000, 6, Dtype::Bfloat16);
    assert!(
        greedy_pick(&lazy).unwrap().is_none(),
        "the pick took logits not on the stream yet"
    );
    for (name, x) in &cases {
        mlx_rs::transforms::eval([x]).unwrap();
        let want = mlx_tokens(x);
        match greedy_pick(x).unwrap() {
            None => {
                assert!(
                    !cuda,
                    "{name} ({:?}): the pick was not taken on a CUDA GPU",
                    x.dtype()
                );
                let got = greedy_tokens(x).unwrap();
                assert_eq!(
                    got.as_slice::<u32>(),
                    want.as_slice(),
                    "{name}: off CUDA MLX's tokens"
                );
            }
            Some(got) => {
                assert!(cuda, "{name}: the pick was taken off a CUDA GPU");
                assert_eq!(got.shape(), &[x.dim(0)], "{name}");
                assert_eq!(got.dtype(), Dtype::Uint32, "{name}");
                let got = got.as_slice::<u32>().to_vec();
                eprintln!("{name} ({:?}): {got:?} (MLX {want:?})", x.dtype());
                assert_eq!(got, want, "{name} ({:?})", x.dtype());
            }
        }
    }
    // The first of the tied largest values, as MLX's argmax gives it; a row
    // of -inf gives 0.
    let special_tokens = mlx_tokens(&cases[cases.len() - 1].1);
    assert_eq!(special_tokens[..2], [5_000, 0]);
}
