//! The MLX distributed group a runner joins (mlx-c's `mlx_distributed_*`):
//! the ring backend (TCP, loopback or between hosts) on CPUs and Macs, NCCL
//! where MLX computes on a CUDA GPU. MLX reads the group's addresses from
//! its own variables ([`super::launch`] sets them): `MLX_RANK` and
//! `MLX_HOSTFILE` for the ring, `MLX_RANK`, `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP` and `NCCL_PORT` for NCCL.
use std::ffi::CStr;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype, Stream};

use crate::error::{Result, RunnerError};

/// mlx-c's signature of a collective: result, input, group, stream.
type Collective = unsafe extern "C" fn(
    *mut mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_distributed_group,
    mlx_sys::mlx_stream,
) -> std::os::raw::c_int;

/// The transport MLX's collectives run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets between every neighbour of a ring (CPU collectives).
    Ring,
    /// NVIDIA's NCCL (collectives on the GPU).
    Nccl,
}

impl Backend {
    /// NCCL where MLX computes on a CUDA GPU and its NCCL backend is there,
    /// the ring everywhere else.
    pub fn for_this_host() -> Self {
        if !crate::model::dtypes::cpu_backend() && Self::Nccl.available() {
            Self::Nccl
        } else {
            Self::Ring
        }
    }

    /// The backend GROVE_SHARD_BACKEND names (`ring` or `nccl`), else the
    /// one for this host ([`Backend::for_this_host`]).
    pub fn from_env() -> Result<Self> {
        match std::env::var(super::BACKEND_VAR).as_deref() {
            Err(_) | Ok("") => Ok(Self::for_this_host()),
            Ok("ring") => Ok(Self::Ring),
            Ok("nccl") => Ok(Self::Nccl),
            Ok(other) => Err(RunnerError::Shard {
                phase: "starting the group",
                message: format!("{}={other:?} is not ring or nccl", super::BACKEND_VAR),
            }),
        }
    }

    /// MLX's name of the backend.
    pub fn name(self) -> &'static CStr {
        match self {
            Self::Ring => c"ring",
            Self::Nccl => c"nccl",
        }
    }

    /// Whether this build of MLX has the backend.
    pub fn available(self) -> bool {
        // SAFETY: a static C string; the call only looks the name up.
        unsafe { mlx_sys::mlx_distributed_is_available(self.name().as_ptr()) }
    }

    /// The stream its collectives run on.
    fn stream(self) -> Stream {
        match self {
            Self::Ring => Stream::cpu(),
            Self::Nccl => Stream::gpu(),
        }
    }
}

/// This process's membership of a group.
pub struct Comm {
    group: mlx_sys::mlx_distributed_group,
    backend: Backend,
    rank: i32,
    size: i32,
    /// How an idle rank 0 wakes the others ([`super::bell`]); `None`: a
    /// group not started by Grove's launcher (its followers wait in the
    /// collective).
    bell: Option<super::bell::Bell>,
}

// SAFETY: the group handle is an immutable reference-counted object that MLX
// uses from whichever thread evaluates a collective; Grove uses it from the
// engine thread only, after creating it anywhere.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    /// Joins the group MLX's variables describe (strictly: a missing or
    /// unreachable peer is an error, never a silent group of one).
    pub fn join(backend: Backend) -> Result<Self> {
        let fail = |message: String| RunnerError::Shard {
            phase: "joining the group",
            message,
        };
        if !backend.available() {
            return Err(fail(format!(
                "MLX was built without its {} backend",
                backend.name().to_string_lossy()
            )));
        }
        // SAFETY: `group` is a fresh handle that init fills; on failure it is
        // freed here, on success owned by the returned Comm.
        unsafe {
            let mut group = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut group, true, backend.name().as_ptr()) != 0
                || group.ctx.is_null()
            {
                mlx_sys::mlx_distributed_group_free(group);
                return Err(fail(format!(
                    "MLX could not start its {} group (see the message above)",
                    backend.name().to_string_lossy()
                )));
            }
            let rank = mlx_sys::mlx_distributed_group_rank(group);
            let size = mlx_sys::mlx_distributed_group_size(group);
            Ok(Self {
                group,
                backend,
                rank,
                size,
                bell: None,
            })
        }
    }

    /// Gives the group its doorbell.
    pub fn with_bell(mut self, bell: Option<super::bell::Bell>) -> Self {
        // (Not `Self { bell, ..self }`: that copies the group's handle out
        // of a value whose drop then frees it.)
        self.bell = bell;
        self
    }

    /// Rank 0, idle no more: wakes the followers waiting in
    /// [`Comm::wait_bell`].
    pub fn ring_bell(&self) -> Result<()> {
        self.bell.as_ref().map_or(Ok(()), super::bell::Bell::ring)
    }

    /// A follower, the group idle: waits for rank 0's [`Comm::ring_bell`]
    /// (at once without a doorbell: the next collective waits instead).
    pub fn wait_bell(&self) -> Result<()> {
        self.bell.as_ref().map_or(Ok(()), super::bell::Bell::wait)
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn size(&self) -> i32 {
        self.size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The element-wise sum of `x` over every rank (lazy, like any op).
    pub fn all_sum(&self, x: &Array) -> std::result::Result<Array, Exception> {
        let n = x.size() as i32;
        if self.backend == Backend::Ring && n > 0 && n < self.size {
            // MLX's ring reduces an array of fewer elements than ranks by
            // another, much slower path: padded to one element per rank,
            // a lone sampled token went from 107-176 to 307-583 tok/s of
            // decode on 2 CPU ranks. (The padding is computed from `x`, so
            // the collective still waits for `x`.)
            let pad = mlx_rs::ops::zeros_dtype(&[self.size - n], x.dtype())?;
            let padded = mlx_rs::ops::concatenate(&[x.reshape(&[-1])?, pad], 0)?;
            return self
                .all_sum_whole(&padded)?
                .try_index(..n)?
                .reshape(x.shape());
        }
        self.all_sum_whole(x)
    }

    /// One of mlx-c's collectives (`mlx_distributed_all_sum`, `_all_gather`,
    /// `_all_min`: the same signature) of `x` over the group, lazy.
    fn collective(
        &self,
        name: &str,
        op: Collective,
        x: &Array,
    ) -> std::result::Result<Array, Exception> {
        let stream = self.backend.stream();
        // SAFETY: `res` is a fresh handle the op fills; on success it is owned
        // by the returned Array, on failure freed here.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = op(&mut res, x.as_ptr(), self.group, stream.as_ptr());
            if status != 0 {
                mlx_sys::mlx_array_free(res);
                return Err(Exception::custom(format!(
                    "{name} failed (MLX status {status})"
                )));
            }
            Ok(Array::from_ptr(res))
        }
    }

    /// [`Comm::all_sum`] as MLX does it, whatever the size.
    fn all_sum_whole(&self, x: &Array) -> std::result::Result<Array, Exception> {
        self.collective("all_sum", mlx_sys::mlx_distributed_all_sum, x)
    }

    /// Every rank's `x` stacked along the first axis, in rank order.
    pub fn all_gather(&self, x: &Array) -> std::result::Result<Array, Exception> {
        self.collective("all_gather", mlx_sys::mlx_distributed_all_gather, x)
    }

    /// `x`, whose last axis is split over the group (rank order), whole on
    /// every rank (mlx-lm's `gather_last_axis`).
    pub fn gather_last_axis(&self, x: &Array) -> std::result::Result<Array, Exception> {
        let shape = x.shape().to_vec();
        let last = shape.last().copied().unwrap_or(1);
        let parts = self.all_gather(&x.reshape(&[-1, last])?)?;
        // (ranks * rows, last) to (rows, ranks * last).
        let parts = parts
            .reshape(&[self.size, -1, last])?
            .transpose_axes(&[1, 0, 2])?;
        let mut out = shape;
        if let Some(l) = out.last_mut() {
            *l = last * self.size;
        }
        parts.reshape(&out)
    }

    /// Rank 0's `x` on every rank: the sum of rank 0's values and the
    /// others' `x * 0`. (The zeros must be computed from `x`: a fresh array
    /// of zeros has no inputs, so MLX would run its collective before the
    /// ones `x` waits for, and the ranks' collectives would pair up wrongly.)
    pub fn from_rank0(&self, x: &Array) -> std::result::Result<Array, Exception> {
        if self.rank == 0 {
            self.all_sum(x)
        } else {
            let zero = Array::from_int(0).as_dtype(x.dtype())?;
            self.all_sum(&x.multiply(&zero)?)
        }
    }

    /// [`Comm::from_rank0`] of `tokens` (`[B]`) and, in the same
    /// collective, one more value: rank 0's `flag` (the engine's "news
    /// follows", see `engine::lockstep`). Returns the tokens and the flag
    /// (`[1]`) as every rank sees them.
    pub fn from_rank0_flagged(
        &self,
        tokens: &Array,
        flag: bool,
    ) -> std::result::Result<(Array, Array), Exception> {
        let flag = Array::from_slice(&[u32::from(flag && self.rank == 0)], &[1])
            .as_dtype(tokens.dtype())?;
        let both = mlx_rs::ops::concatenate(&[tokens.clone(), flag], 0)?;
        let sum = self.from_rank0(&both)?;
        let n = tokens.dim(0);
        Ok((sum.try_index(..n)?, sum.try_index(n..)?))
    }

    /// Rank 0's bytes on every rank (`bytes` is ignored elsewhere): its
    /// length first, then the bytes.
    pub fn broadcast_bytes(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let phase = "sending rank 0's step to the group";
        let mine = if self.rank == 0 { bytes.len() } else { 0 };
        let len = i32::try_from(mine).map_err(|_| RunnerError::Shard {
            phase,
            message: format!("{mine} bytes do not fit one message"),
        })?;
        let len = self
            .all_sum(&Array::from_slice(&[len], &[1]))
            .map_err(|e| shard_err(phase, e))?;
        len.eval().map_err(|e| shard_err(phase, e))?;
        let n = len.as_slice::<i32>().first().copied().unwrap_or(0);
        if n <= 0 {
            return Ok(Vec::new());
        }
        let data = if self.rank == 0 {
            Array::from_slice(bytes, &[n])
        } else {
            mlx_rs::ops::zeros::<u8>(&[n]).map_err(|e| shard_err(phase, e))?
        };
        let data = self.all_sum(&data).map_err(|e| shard_err(phase, e))?;
        data.eval().map_err(|e| shard_err(phase, e))?;
        Ok(data.as_slice::<u8>().to_vec())
    }

    /// The least of each value over every rank.
    pub fn all_min(&self, values: &[i64]) -> Result<Vec<i64>> {
        let phase = "agreeing on limits";
        let x = Array::from_slice(values, &[values.len() as i32]);
        let out = self
            .collective("all_min", mlx_sys::mlx_distributed_all_min, &x)
            .map_err(|e| shard_err(phase, e))?;
        out.eval().map_err(|e| shard_err(phase, e))?;
        debug_assert_eq!(out.dtype(), Dtype::Int64);
        Ok(out.as_slice::<i64>().to_vec())
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Comm(rank {} of {}, {:?})",
            self.rank, self.size, self.backend
        )
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the handle was made by init and is freed once.
        unsafe { mlx_sys::mlx_distributed_group_free(self.group) };
    }
}

fn shard_err(phase: &'static str, e: impl std::fmt::Display) -> RunnerError {
    RunnerError::Shard {
        phase,
        message: e.to_string(),
    }
}
