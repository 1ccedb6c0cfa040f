//! The state of a recurrent (linear-attention) layer: mlx-lm's two-slot
//! `ArraysCache` of a gated delta-net, the last `kernel - 1` inputs of its
//! causal convolution and its recurrent state. It does not grow with the
//! sequence and cannot be taken back to an earlier token: the prompt cache
//! keeps a copy at reuse points instead (see `engine::prompt_cache`).
//!
//! The same struct serves one sequence (`B = 1`) and a batch, whose rows
//! may be left-padded while a group of prompts is prefilled together: the
//! mask of a chunk then hides each row's pad slots, as mlx-lm's
//! `ArraysCache.make_mask` does with `left_padding`.
use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::concatenate;

use super::AttentionMask;

/// Convolution and recurrent state of one layer, for one row or many.
#[derive(Clone, Default)]
pub struct RecurrentCache {
    /// `[B, kernel - 1, channels]`, once a token has been seen.
    conv: Option<Array>,
    /// `[B, value heads, value dim, key dim]`, float32.
    state: Option<Array>,
    /// Tokens seen (a batch: time slots written, the longest row's length).
    offset: i32,
    /// A batch's pad slots before each row's first token (empty: none).
    left_padding: Vec<i32>,
}

impl RecurrentCache {
    /// No state yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch of rows left-padded by `left_padding` slots each.
    pub fn with_padding(left_padding: Vec<i32>) -> Self {
        Self {
            left_padding,
            ..Self::default()
        }
    }

    /// Tokens seen (time slots, for a batch).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The convolution and recurrent states, if any token was seen.
    pub fn state(&self) -> (Option<&Array>, Option<&Array>) {
        (self.conv.as_ref(), self.state.as_ref())
    }

    /// Records the states after `n` more tokens.
    pub fn update(&mut self, conv: Array, state: Array, n: i32) {
        self.conv = Some(conv);
        self.state = Some(state);
        self.offset += n;
    }

    /// `[B, n]` true where slot `offset + j` of a row is a real token, when
    /// some row's padding reaches into the next `n` slots.
    pub fn mask(&self, n: i32) -> Result<AttentionMask, Exception> {
        if !self.left_padding.iter().any(|&l| l > self.offset) {
            return Ok(AttentionMask::None);
        }
        let b = self.left_padding.len() as i32;
        let slots =
            Array::arange::<_, i32>(self.offset, self.offset + n, None)?.reshape(&[1, -1])?;
        let left = Array::from_slice(&self.left_padding, &[b, 1]);
        Ok(AttentionMask::Array(slots.ge(&left)?))
    }

    /// Rows of the batch (1 for a sequence's own).
    pub fn rows(&self) -> usize {
        self.left_padding.len().max(1)
    }

    /// Appends the rows of `other` (sequences joining a batch; their own
    /// padding, shifted to this batch's slots). Both must hold state.
    pub fn merge(&mut self, other: &RecurrentCache) -> Result<(), Exception> {
        let (Some(c), Some(s)) = (&other.conv, &other.state) else {
            return Err(Exception::custom("joining an empty recurrent state"));
        };
        let mine = self.rows_padding();
        let new_offset = self.offset.max(other.offset);
        let theirs = other.rows_padding();
        let (conv, state) = match (&self.conv, &self.state) {
            (Some(mc), Some(ms)) => (concatenate(&[mc, c], 0)?, concatenate(&[ms, s], 0)?),
            _ if self.left_padding.is_empty() => (c.clone(), s.clone()),
            _ => return Err(Exception::custom("joining a batch without state")),
        };
        self.left_padding = mine
            .iter()
            .map(|l| l + new_offset - self.offset)
            .chain(theirs.iter().map(|l| l + new_offset - other.offset))
            .collect();
        self.offset = new_offset;
        self.conv = Some(conv);
        self.state = Some(state);
        Ok(())
    }

    /// Each row's padding, a sequence's own being none.
    fn rows_padding(&self) -> Vec<i32> {
        if self.left_padding.is_empty() && self.conv.is_some() {
            vec![0]
        } else {
            self.left_padding.clone()
        }
    }

    /// Keeps only the rows `keep`, in that order.
    pub fn filter(&mut self, keep: &[usize]) -> Result<(), Exception> {
        if keep.is_empty() {
            *self = Self::new();
            return Ok(());
        }
        let pads = self.rows_padding();
        let rows: Vec<i32> = keep.iter().map(|&b| b as i32).collect();
        let rows = Array::from_slice(&rows, &[rows.len() as i32]);
        if let (Some(c), Some(s)) = (&self.conv, &self.state) {
            let (c, s) = (c.take_axis(&rows, 0)?, s.take_axis(&rows, 0)?);
            self.conv = Some(c);
            self.state = Some(s);
        }
        let left: Vec<i32> = keep
            .iter()
            .map(|&b| pads.get(b).copied().unwrap_or(0))
            .collect();
        let cut = left.iter().copied().min().unwrap_or(0).max(0);
        self.left_padding = left.into_iter().map(|l| l - cut).collect();
        self.offset -= cut;
        Ok(())
    }

    /// Row `b` as a sequence's own state (copied), holding its tokens.
    pub fn extract(&self, b: usize) -> Result<Self, Exception> {
        let pad = self.rows_padding().get(b).copied().unwrap_or(0);
        let row = b as i32;
        let take = |x: &Option<Array>| -> Result<Option<Array>, Exception> {
            x.as_ref()
                .map(|a| {
                    use mlx_rs::ops::indexing::TryIndexOp;
                    a.try_index(row..row + 1)?.copy()
                })
                .transpose()
        };
        Ok(Self {
            conv: take(&self.conv)?,
            state: take(&self.state)?,
            offset: self.offset - pad,
            left_padding: Vec::new(),
        })
    }

    /// Tokens row `b` holds.
    pub fn len_of(&self, b: usize) -> i32 {
        self.offset - self.rows_padding().get(b).copied().unwrap_or(0)
    }

    /// The arrays held.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.state.iter())
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
}

/// A copy in a buffer of its own (a row of a batch would otherwise keep the
/// whole batch's buffer alive). Computed, not copied: MLX's copy and slice
/// update may share the source's buffer.
trait CopyArray {
    fn copy(&self) -> Result<Array, Exception>;
}

impl CopyArray for Array {
    fn copy(&self) -> Result<Array, Exception> {
        self.multiply(Array::from_f32(1.0).as_dtype(self.dtype())?)
    }
}
