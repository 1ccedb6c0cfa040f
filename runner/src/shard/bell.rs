//! The group's doorbell: how an idle rank 0 wakes the others. MLX's ring
//! backend busy-polls its sockets while a receive is pending (and NCCL's
//! kernels spin on the GPU while they wait for a peer), so a follower that
//! waited for rank 0's next tick inside a collective spun a core (or a GPU)
//! for as long as the group was idle. Instead, when the group goes idle the
//! followers wait on a pipe, and rank 0 writes one byte to each follower's
//! pipe when work arrives. The pipes carry no data: the ticks themselves
//! still go through the group.
//!
//! The launcher makes one pipe per follower before it starts the ranks;
//! each rank inherits only its own ends (named in [`VAR`]): rank 0 every
//! write end, follower `r` the read end of pipe `r`. A follower whose pipe
//! reaches its end knows rank 0 is gone.
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Result, RunnerError};

/// The variable that gives a rank its ends of the pipes: `w:FD,FD,...` for
/// rank 0, `r:FD` for a follower.
pub const VAR: &str = "GROVE_SHARD_BELL";

fn bell_err(phase: &'static str, message: String) -> RunnerError {
    RunnerError::Shard { phase, message }
}

/// The launcher's pipes, one per follower (ranks 1 to N-1).
pub struct Pipes {
    /// (read end, write end) of follower `i + 1`'s pipe.
    ends: Vec<(OwnedFd, OwnedFd)>,
}

impl Pipes {
    /// One pipe per follower of a group of `size`. The ends are inherited
    /// by the ranks (no close-on-exec); [`Pipes::keep_only`] closes the
    /// others' in each rank.
    pub fn new(size: i32) -> Result<Self> {
        let mut ends = Vec::new();
        for _ in 1..size {
            let mut fds = [0 as RawFd; 2];
            // SAFETY: `fds` has room for the two descriptors pipe() writes.
            if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
                return Err(bell_err(
                    "starting the group",
                    format!("making a pipe: {}", std::io::Error::last_os_error()),
                ));
            }
            // SAFETY: pipe() just opened both; nothing else owns them.
            ends.push(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) });
        }
        Ok(Self { ends })
    }

    /// The descriptors rank `rank` keeps.
    fn kept(&self, rank: i32) -> Vec<RawFd> {
        if rank == 0 {
            self.ends.iter().map(|(_, w)| w.as_raw_fd()).collect()
        } else {
            self.ends
                .get(rank as usize - 1)
                .map(|(r, _)| vec![r.as_raw_fd()])
                .unwrap_or_default()
        }
    }

    /// The value of [`VAR`] for rank `rank`.
    pub fn var(&self, rank: i32) -> String {
        let fds: Vec<String> = self.kept(rank).iter().map(|fd| fd.to_string()).collect();
        let side = if rank == 0 { "w" } else { "r" };
        format!("{side}:{}", fds.join(","))
    }

    /// The descriptors rank `rank` must close after fork (every other end).
    pub fn keep_only(&self, rank: i32) -> Vec<RawFd> {
        let kept = self.kept(rank);
        self.ends
            .iter()
            .flat_map(|(r, w)| [r.as_raw_fd(), w.as_raw_fd()])
            .filter(|fd| !kept.contains(fd))
            .collect()
    }
}

/// This rank's side of the doorbell.
pub enum Bell {
    /// Rank 0: a write end per follower.
    Ring(Vec<File>),
    /// A follower: its read end.
    Wait(File),
}

impl Bell {
    /// The ends this rank was started with ([`VAR`]), if any.
    pub fn from_env() -> Result<Option<Self>> {
        let Ok(value) = std::env::var(VAR) else {
            return Ok(None);
        };
        let bad = || bell_err("joining the group", format!("{VAR}={value:?} is malformed"));
        let (side, list) = value.split_once(':').ok_or_else(bad)?;
        let mut files = Vec::new();
        for fd in list.split(',').filter(|s| !s.is_empty()) {
            let fd: RawFd = fd.parse().map_err(|_| bad())?;
            // Only a descriptor that is open here is taken.
            // SAFETY: F_GETFD only reads the descriptor's flags.
            if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
                return Err(bad());
            }
            // SAFETY: the launcher opened it for this rank alone (the
            // others' ends were closed here before exec); it is owned now.
            files.push(unsafe { File::from_raw_fd(fd) });
        }
        match side {
            "w" => Ok(Some(Self::Ring(files))),
            "r" if files.len() == 1 => Ok(files.pop().map(Self::Wait)),
            _ => Err(bad()),
        }
    }

    /// Rank 0: wakes every follower.
    pub fn ring(&self) -> Result<()> {
        if let Self::Ring(files) = self {
            for mut f in files {
                f.write_all(&[1]).map_err(|e| {
                    bell_err("waking the group", format!("a follower is gone ({e})"))
                })?;
            }
        }
        Ok(())
    }

    /// A follower: waits until rank 0 rings. Its end of the pipe means
    /// rank 0 is gone.
    pub fn wait(&self) -> Result<()> {
        let Self::Wait(f) = self else {
            return Ok(());
        };
        let mut byte = [0u8; 1];
        loop {
            match (&*f).read(&mut byte) {
                Ok(1) => return Ok(()),
                Ok(_) => {
                    return Err(bell_err("waiting for rank 0", "rank 0 is gone".into()));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(bell_err("waiting for rank 0", e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_keeps_its_own_ends() {
        let pipes = Pipes::new(3).expect("pipes");
        let w1 = pipes.ends[0].1.as_raw_fd();
        let (r2, w2) = (pipes.ends[1].0.as_raw_fd(), pipes.ends[1].1.as_raw_fd());
        assert_eq!(pipes.var(0), format!("w:{w1},{w2}"));
        assert_eq!(pipes.var(2), format!("r:{r2}"));
        let mut closed = pipes.keep_only(1);
        closed.sort_unstable();
        let mut want = vec![w1, r2, w2];
        want.sort_unstable();
        assert_eq!(closed, want);
        // A ring reaches the follower; the end of the pipe says rank 0 left.
        let ring = Bell::Ring(vec![File::from(pipes.ends[0].1.try_clone().expect("dup"))]);
        let wait = Bell::Wait(File::from(pipes.ends[0].0.try_clone().expect("dup")));
        ring.ring().expect("ring");
        wait.wait().expect("woken");
        drop(ring);
        drop(pipes);
        let err = wait.wait().expect_err("rank 0 gone");
        assert!(err.to_string().contains("rank 0 is gone"), "{err}");
    }
}
