//! The gated delta-net, Qwen3-Next's linear attention (mlx-lm's
//! `Qwen3NextGatedDeltaNet` and `gated_delta.py`, its ops path): projections
//! to q, k, v, an output gate z and the per-head decay and write strength
//! inputs a and b; a causal depthwise convolution over q, k and v (its last
//! `kernel - 1` inputs kept between passes); L2-normalised q and k; and the
//! recurrence, token by token,
//!
//! ```text
//! S = S * g;  S += k ⊗ ((v - S k) * beta);  y = S q
//! ```
//!
//! with `g = exp(-exp(A_log) * softplus(a + dt_bias))`, `beta = sigmoid(b)`
//! and `S` a float32 `[value dim, key dim]` state per value head. The output
//! is RMS-normalised, gated by `silu(z)` and projected back.
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{
    concatenate, conv1d, exp, logaddexp, repeat_axis, select, sigmoid, split_at_indices, stack,
    zeros_dtype,
};
use mlx_rs::{Array, Dtype};

use super::linear::Linear;
use crate::cache::{AttentionMask, LayerCache};
use crate::error::{Result, RunnerError};
use crate::model::config::Quantization;
use crate::model::weights::Weights;

/// The sizes of one gated delta-net layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaShape {
    pub hidden: i32,
    pub key_heads: i32,
    pub value_heads: i32,
    pub key_dim: i32,
    pub value_dim: i32,
    pub conv_kernel: i32,
    pub eps: f32,
    /// Qwen3.5's four input projections (`in_proj_qkv`, `_z`, `_b`, `_a`)
    /// instead of Qwen3-Next's two grouped per key head.
    pub split_projections: bool,
}

impl DeltaShape {
    /// Rejects sizes the layer cannot run with.
    pub fn check(&self) -> std::result::Result<(), String> {
        let all = [
            ("linear_num_key_heads", self.key_heads),
            ("linear_num_value_heads", self.value_heads),
            ("linear_key_head_dim", self.key_dim),
            ("linear_value_head_dim", self.value_dim),
            ("linear_conv_kernel_dim", self.conv_kernel),
        ];
        if let Some((name, v)) = all.iter().find(|(_, v)| *v < 1) {
            return Err(format!("{name} must be positive, not {v}"));
        }
        if self.conv_kernel < 2 {
            return Err(format!(
                "linear_conv_kernel_dim must be at least 2, not {}",
                self.conv_kernel
            ));
        }
        if self.value_heads % self.key_heads != 0 {
            return Err(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.value_heads, self.key_heads
            ));
        }
        Ok(())
    }

    /// Channels of the convolution: q, k and v.
    pub fn conv_channels(&self) -> i32 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Values the layer's state holds per sequence: the convolution's
    /// (in the compute dtype) and the recurrence's (float32).
    pub fn state_elements(&self) -> (u64, u64) {
        let conv = (self.conv_kernel - 1) as u64 * self.conv_channels() as u64;
        let rec = self.value_heads as u64 * self.value_dim as u64 * self.key_dim as u64;
        (conv, rec)
    }
}

/// The input projections.
enum InProj {
    /// Qwen3-Next: q, k, v, z and b, a grouped per key head.
    Grouped { qkvz: Linear, ba: Linear },
    /// Qwen3.5: q k v in order, and z, b, a apart.
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
}

/// One loaded gated delta-net.
pub struct GatedDeltaNet {
    shape: DeltaShape,
    in_proj: InProj,
    /// `[channels, kernel, 1]` (depthwise).
    conv: Array,
    dt_bias: Array,
    a_log: Array,
    norm: Array,
    out: Linear,
}

/// `v` as a scalar array of `dtype` (as mlx turns a Python float into one).
fn scalar(v: f32, dtype: Dtype) -> Result<Array, Exception> {
    Array::from_f32(v).as_dtype(dtype)
}

impl GatedDeltaNet {
    /// Loads `{prefix}.{in_proj_qkvz,in_proj_ba,conv1d,dt_bias,A_log,norm,out_proj}`.
    pub fn load(w: &mut Weights, q: &Quantization, prefix: &str, s: DeltaShape) -> Result<Self> {
        s.check()
            .map_err(|m| RunnerError::Weights(format!("{prefix}: {m}")))?;
        let (key_all, value_all) = (s.key_heads * s.key_dim, s.value_heads * s.value_dim);
        let channels = s.conv_channels();
        let p = |n: &str| format!("{prefix}.{n}");
        Ok(Self {
            in_proj: if s.split_projections {
                InProj::Split {
                    qkv: Linear::load(w, q, &p("in_proj_qkv"), s.hidden, channels, false)?,
                    z: Linear::load(w, q, &p("in_proj_z"), s.hidden, value_all, false)?,
                    b: Linear::load(w, q, &p("in_proj_b"), s.hidden, s.value_heads, false)?,
                    a: Linear::load(w, q, &p("in_proj_a"), s.hidden, s.value_heads, false)?,
                }
            } else {
                InProj::Grouped {
                    qkvz: Linear::load(
                        w,
                        q,
                        &p("in_proj_qkvz"),
                        s.hidden,
                        2 * key_all + 2 * value_all,
                        false,
                    )?,
                    ba: Linear::load(w, q, &p("in_proj_ba"), s.hidden, 2 * s.value_heads, false)?,
                }
            },
            conv: w.take_float(&p("conv1d.weight"), &[channels, s.conv_kernel, 1])?,
            dt_bias: w.take_float(&p("dt_bias"), &[s.value_heads])?,
            a_log: w.take_float(&p("A_log"), &[s.value_heads])?,
            norm: w.take_float(&p("norm.weight"), &[s.value_dim])?,
            out: Linear::load(w, q, &p("out_proj"), value_all, s.hidden, false)?,
            shape: s,
        })
    }

    /// Runs `x` (`[B, S, hidden]`) on from the cache's state, which it
    /// updates; `mask` (`[B, S]`, a batch's real tokens) keeps pad slots
    /// out of the state.
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut impl LayerCache,
        mask: &AttentionMask,
    ) -> Result<Array, Exception> {
        let s = &self.shape;
        let (b, len) = (x.dim(0), x.dim(1));
        let dtype = x.dtype();
        let mask = match mask {
            AttentionMask::Array(m) => Some(m.clone()),
            _ => None,
        };
        let state = cache
            .recurrent()
            .ok_or_else(|| Exception::custom("a gated delta-net needs a recurrent cache"))?;
        // 1. Project: q k v (the convolution's input), the gate z, and b, a
        //    (Qwen3-Next's grouped per key head: mlx-lm's
        //    fix_query_key_value_ordering).
        let (nk, dk, nv, dv) = (s.key_heads, s.key_dim, s.value_heads, s.value_dim);
        let (mut mixed, z, beta_in, a) = match &self.in_proj {
            InProj::Grouped { qkvz, ba } => {
                let per = nv / nk;
                let qkvz = qkvz.forward(x)?.reshape(&[b, len, nk, -1])?;
                let parts = split_at_indices(&qkvz, &[dk, 2 * dk, 2 * dk + per * dv], -1)?;
                let v = parts[2].reshape(&[b, len, -1, dv])?;
                let z = parts[3].reshape(&[b, len, -1, dv])?;
                let ba = ba.forward(x)?.reshape(&[b, len, nk, -1])?;
                let ba = split_at_indices(&ba, &[per], -1)?;
                let mixed = concatenate(
                    &[
                        parts[0].reshape(&[b, len, -1])?,
                        parts[1].reshape(&[b, len, -1])?,
                        v.reshape(&[b, len, -1])?,
                    ],
                    -1,
                )?;
                (
                    mixed,
                    z,
                    ba[0].reshape(&[b, len, nv])?,
                    ba[1].reshape(&[b, len, nv])?,
                )
            }
            InProj::Split {
                qkv,
                z,
                b: proj_b,
                a: proj_a,
            } => (
                qkv.forward(x)?,
                z.forward(x)?.reshape(&[b, len, nv, dv])?,
                proj_b.forward(x)?,
                proj_a.forward(x)?,
            ),
        };
        // 2. The causal convolution over [kept inputs, q k v], pad slots zeroed.
        let (conv_state, rec_state) = state.state();
        let conv_state = match conv_state {
            Some(c) => c.clone(),
            None => zeros_dtype(&[b, s.conv_kernel - 1, s.conv_channels()], dtype)?,
        };
        let rec_state = rec_state.cloned();
        if let Some(m) = &mask {
            mixed = select(&m.expand_dims(-1)?, &mixed, scalar(0.0, dtype)?)?;
        }
        let conv_in = concatenate(&[&conv_state, &mixed], 1)?;
        let keep = s.conv_kernel - 1;
        let total = conv_in.dim(1);
        // Computed into a buffer of its own: a copy or slice update may
        // share the slice's buffer, which would keep the whole chunk's input
        // alive as long as the state.
        let new_conv = conv_in
            .try_index((.., (total - keep)..total, ..))?
            .multiply(scalar(1.0, dtype)?)?;
        let conv_out = conv1d(&conv_in, &self.conv, 1, 0, 1, s.conv_channels())?;
        let conv_out = conv_out.multiply(sigmoid(&conv_out)?)?;
        let key_all = nk * dk;
        let qkv = split_at_indices(&conv_out, &[key_all, 2 * key_all], -1)?;
        let q = qkv[0].reshape(&[b, len, nk, dk])?;
        let k = qkv[1].reshape(&[b, len, nk, dk])?;
        let v = qkv[2].reshape(&[b, len, nv, dv])?;
        // 3. L2-normalised q and k, the readout scale folded into q
        //    (mlx-lm's normalize_qk with eps 1e-6).
        let inv = (dk as f32).powf(-0.5);
        let eps = 1e-6 * inv * inv;
        let q =
            scalar(inv * inv, q.dtype())?.multiply(super::cpu_fast::rms_norm(&q, None, eps)?)?;
        let k = scalar(inv, k.dtype())?.multiply(super::cpu_fast::rms_norm(&k, None, eps)?)?;
        // 4. The recurrence, token by token.
        let beta = sigmoid(&beta_in)?;
        let zero = scalar(0.0, a.dtype())?;
        let g = exp(exp(self.a_log.as_dtype(Dtype::Float32)?)?
            .negative()?
            .multiply(logaddexp(a.add(&self.dt_bias)?, &zero)?)?)?;
        let (y, rec_state) = recurrence(&q, &k, &v, &g, &beta, rec_state, mask.as_ref())?;
        state.update(new_conv, rec_state, len);
        // 5. RMS norm gated by silu(z) (in float32), then out.
        let normed = super::cpu_fast::rms_norm(&y, Some(&self.norm), s.eps)?;
        let z32 = z.as_dtype(Dtype::Float32)?;
        let gated = z32
            .multiply(sigmoid(&z32)?)?
            .multiply(normed.as_dtype(Dtype::Float32)?)?
            .as_dtype(y.dtype())?;
        self.out.forward(&gated.reshape(&[b, len, -1])?)
    }

    /// The arrays this layer holds.
    pub fn parameters(&self) -> Vec<&Array> {
        let mut out = match &self.in_proj {
            InProj::Grouped { qkvz, ba } => [qkvz, ba]
                .into_iter()
                .flat_map(Linear::parameters)
                .collect::<Vec<_>>(),
            InProj::Split { qkv, z, b, a } => [qkv, z, b, a]
                .into_iter()
                .flat_map(Linear::parameters)
                .collect(),
        };
        out.extend([&self.conv, &self.dt_bias, &self.a_log, &self.norm]);
        out.extend(self.out.parameters());
        out
    }

    /// The layer's shape.
    pub fn shape(&self) -> DeltaShape {
        self.shape
    }
}

/// mlx-lm's `gated_delta_ops`: q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`,
/// g and beta `[B, T, Hv]`, state `[B, Hv, Dv, Dk]` (float32, zeros when
/// `None`); returns y `[B, T, Hv, Dv]` and the state after the last token.
/// A masked step (`mask[b, t]` false) leaves row b's state as it was.
fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array), Exception> {
    let (b, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let mut state = match state {
        Some(s) => s,
        None => zeros_dtype(&[b, hv, dv, dk], Dtype::Float32)?,
    };
    let (q, k) = if hv / hk > 1 {
        (
            repeat_axis::<f32>(q.clone(), hv / hk, -2)?,
            repeat_axis::<f32>(k.clone(), hv / hk, -2)?,
        )
    } else {
        (q.clone(), k.clone())
    };
    let mut ys = Vec::with_capacity(t.max(0) as usize);
    for i in 0..t {
        let (qt, kt, vt) = (
            q.try_index((.., i))?,
            k.try_index((.., i))?,
            v.try_index((.., i))?,
        );
        let (gt, bt) = (g.try_index((.., i))?, beta.try_index((.., i))?);
        let old = state.clone();
        // Decay, read what the state holds for k, write the correction.
        let decayed = state.multiply(gt.expand_dims_axes(&[-1, -2])?)?;
        let k_row = kt.expand_dims(-2)?;
        let kv_mem = decayed.multiply(&k_row)?.sum_axis(-1, None)?;
        let delta = vt.subtract(&kv_mem)?.multiply(bt.expand_dims(-1)?)?;
        let mut next = decayed.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
        let y = next
            .multiply(qt.expand_dims(-2)?)?
            .sum_axis(-1, None)?
            .as_dtype(qt.dtype())?;
        if let Some(m) = mask {
            let mt = m.try_index((.., i))?.reshape(&[-1, 1, 1, 1])?;
            next = select(&mt, &next, &old)?;
        }
        state = next;
        ys.push(y);
    }
    Ok((stack(&ys, 1)?, state))
}
