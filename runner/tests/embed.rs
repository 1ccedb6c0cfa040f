//! A decoder's embedding of a long row in chunks over its KV cache (as the
//! runner embeds rows past `embed::CHUNK`) equals the one-pass embedding,
//! for last-token and mean pooling.
mod common;
use common::fixture;

use grove_runner::model::{self, pooling};

fn values(a: &mlx_rs::Array) -> Vec<f32> {
    a.as_slice::<f32>().to_vec()
}

#[test]
fn chunked_equals_one_pass() {
    let mut model = model::load(&fixture("qwen3-f32")).expect("load");
    let hidden = model.dims.hidden;
    let row: Vec<u32> = (0..300).map(|i| 5 + (i * 37 % 900) as u32).collect();
    for pooling in [pooling::Pooling::LastToken, pooling::Pooling::Mean] {
        model.embedding = pooling::EmbedSpec {
            pooling,
            normalize: true,
        };
        let whole = values(
            &model
                .embed(std::slice::from_ref(&row), hidden)
                .expect("embed"),
        );
        let chunked = values(&model.embed_in_chunks(&row, hidden, 64).expect("chunks"));
        assert_eq!(whole.len(), hidden as usize);
        let diff = whole
            .iter()
            .zip(&chunked)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-5, "{pooling:?}: chunks differ by {diff}");
    }
}
