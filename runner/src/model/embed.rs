//! A model's embeddings of token lists: one forward pass over the rows
//! right-padded to the longest, the last hidden states pooled as the model
//! says ([`super::pooling`]). A decoder attends causally, so its padding
//! (after every real token) changes none of the real positions; a row longer
//! than [`CHUNK`] goes through a decoder alone, in chunks over its KV cache,
//! as a prefill does, so no pass holds more than a chunk's activations.
use mlx_rs::Array;

use super::{Model, Network, pooling};
use crate::error::{MlxPhase, Result, RunnerError};

/// Most tokens of one row in one decoder pass.
pub const CHUNK: usize = 2048;

impl Model {
    /// Whether it generates text (an encoder only embeds).
    pub fn generates(&self) -> bool {
        !matches!(self.decoder, Network::Bert(_))
    }

    /// Embeds each of `rows` (token ids, at least one each): their vectors
    /// cut to `dims` values (at most the hidden size) and normalized as
    /// [`Model::embedding`] says, `[rows, dims]` float32.
    pub fn embed(&self, rows: &[Vec<u32>], dims: i32) -> Result<Array> {
        if let Some(&t) = rows
            .iter()
            .flatten()
            .find(|&&t| t as i64 >= self.dims.vocab as i64)
        {
            return Err(RunnerError::Request(format!(
                "token id {t} is outside the vocabulary of {}",
                self.dims.vocab
            )));
        }
        let dims = dims.clamp(1, self.dims.hidden);
        let long = rows.iter().any(|r| r.len() > CHUNK);
        let out = if long && !matches!(self.decoder, Network::Bert(_)) {
            let each = rows
                .iter()
                .map(|r| self.embed_in_chunks(r, dims, CHUNK))
                .collect::<Result<Vec<_>>>()?;
            mlx_rs::ops::concatenate(&each, 0).phase("embedding")?
        } else {
            self.embed_padded(rows, dims)?
        };
        let out = out.contiguous().phase("embedding")?;
        mlx_rs::transforms::eval([&out]).phase("embedding")?;
        Ok(out)
    }

    /// All rows in one pass, right-padded to the longest.
    fn embed_padded(&self, rows: &[Vec<u32>], dims: i32) -> Result<Array> {
        let b = rows.len();
        let l = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut ids = vec![0i32; b * l];
        let mut mask = vec![0f32; b * l];
        for (r, row) in rows.iter().enumerate() {
            for (i, &t) in row.iter().enumerate() {
                ids[r * l + i] = t as i32;
                mask[r * l + i] = 1.0;
            }
        }
        let lengths: Vec<i32> = rows.iter().map(|r| r.len() as i32).collect();
        let shape = [b as i32, l as i32];
        let tokens = Array::from_slice(&ids, &shape);
        let mask = Array::from_slice(&mask, &shape);
        let hidden = match &self.decoder {
            Network::Bert(m) => m.forward(&tokens, &mask),
            network => network.forward(&tokens, &mut self.new_caches()),
        }
        .phase("embedding")?;
        pooling::pool(self.embedding, &hidden, &mask, &lengths, dims).phase("pooling")
    }

    /// One row through a decoder, `chunk` tokens a pass over its KV cache;
    /// the hidden states of every chunk (evaluated as it goes) pooled
    /// together: `[1, dims]`.
    pub fn embed_in_chunks(&self, row: &[u32], dims: i32, chunk: usize) -> Result<Array> {
        if matches!(self.decoder, Network::Bert(_)) || row.is_empty() {
            return Err(RunnerError::Request(
                "only a decoder embeds a non-empty row in chunks".into(),
            ));
        }
        let mut caches = self.new_caches();
        let mut hidden = Vec::new();
        for chunk in row.chunks(chunk.max(1)) {
            let ids: Vec<i32> = chunk.iter().map(|&t| t as i32).collect();
            let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
            let h = self
                .decoder
                .forward(&tokens, &mut caches)
                .and_then(|h| h.as_dtype(mlx_rs::Dtype::Float32))
                .phase("embedding")?;
            mlx_rs::transforms::eval([&h]).phase("embedding")?;
            hidden.push(h);
        }
        let hidden = mlx_rs::ops::concatenate(&hidden, 1).phase("embedding")?;
        let mask = Array::ones::<f32>(&[1, row.len() as i32]).phase("embedding")?;
        pooling::pool(self.embedding, &hidden, &mask, &[row.len() as i32], dims).phase("pooling")
    }
}
