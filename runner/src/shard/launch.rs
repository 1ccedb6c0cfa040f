//! A group on one host: its addresses (loopback ports held until the group
//! ends, so no other process can take one between the pick and the rank's
//! bind), the variables
//! each rank is started with (MLX's and Grove's), and a launcher that starts
//! the ranks as child processes, as `mlx.launch` does, and ends them
//! together: a rank that fails takes the others down, and a rank whose
//! launcher dies gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`).
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{BACKEND_VAR, Backend, RANK_VAR, SIZE_VAR};
use crate::error::{Result, RunnerError};

/// How long the other ranks get to end by themselves once one has failed.
const PEER_GRACE: Duration = Duration::from_secs(5);

/// The most ranks a group on one host may have.
pub const MAX_RANKS: i32 = 16;

/// Where the ranks of a group on one host meet.
pub struct Plan {
    size: i32,
    backend: Backend,
    /// The ring's host file (MLX_HOSTFILE), removed with the plan.
    hostfile: Option<PathBuf>,
    /// NCCL's rendezvous port on rank 0.
    nccl_port: u16,
    /// The sockets that hold the group's ports (see [`held_ports`]).
    _held: Vec<socket2::Socket>,
}

fn launch_err(message: String) -> RunnerError {
    RunnerError::Shard {
        phase: "starting the group",
        message,
    }
}

/// `n` distinct loopback ports, each held by a socket bound to it (not
/// listening) until the socket is dropped. The sockets set SO_REUSEADDR and
/// SO_REUSEPORT, as MLX's ring does (its NCCL rendezvous sets
/// SO_REUSEADDR), so a rank binds its port beside the held socket, while
/// the kernel hands the port to no one else: neither an automatic bind
/// (port 0, as every other test or daemon picks a port) nor an outgoing
/// connection's local port takes a port a socket is bound to. Picking ports
/// by binding port 0 and closing the listener left a gap in which another
/// process could take the port before the rank bound it.
pub fn held_ports(n: usize) -> Result<Vec<(u16, socket2::Socket)>> {
    use socket2::{Domain, Socket, Type};
    (0..n)
        .map(|_| {
            let hold = || -> std::io::Result<(u16, Socket)> {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                s.set_reuse_address(true)?;
                s.set_reuse_port(true)?;
                s.bind(&SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0).into())?;
                let port = s
                    .local_addr()?
                    .as_socket()
                    .map(|a| a.port())
                    .ok_or_else(|| std::io::Error::other("not an IP socket"))?;
                Ok((port, s))
            };
            hold().map_err(|e| launch_err(format!("no free loopback port: {e}")))
        })
        .collect()
}

impl Plan {
    /// A group of `size` ranks on this host over `backend`.
    pub fn local(size: i32, backend: Backend) -> Result<Self> {
        if !(2..=MAX_RANKS).contains(&size) {
            return Err(launch_err(format!(
                "a group has 2 to {MAX_RANKS} ranks, not {size}"
            )));
        }
        match backend {
            Backend::Ring => {
                let held = held_ports(size as usize)?;
                let hosts: Vec<Vec<String>> = held
                    .iter()
                    .map(|(p, _)| vec![format!("127.0.0.1:{p}")])
                    .collect();
                let text = serde_json::to_string(&hosts).map_err(|e| launch_err(e.to_string()))?;
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let path = std::env::temp_dir()
                    .join(format!("grove-ring-{}-{nanos}.json", std::process::id()));
                std::fs::write(&path, text).map_err(|source| RunnerError::Read {
                    path: path.clone(),
                    source,
                })?;
                Ok(Self {
                    size,
                    backend,
                    hostfile: Some(path),
                    nccl_port: 0,
                    _held: held.into_iter().map(|(_, s)| s).collect(),
                })
            }
            Backend::Nccl => {
                let (port, socket) = held_ports(1)?.remove(0);
                Ok(Self {
                    size,
                    backend,
                    hostfile: None,
                    nccl_port: port,
                    _held: vec![socket],
                })
            }
        }
    }

    pub fn size(&self) -> i32 {
        self.size
    }

    /// The variables rank `rank` is started with.
    pub fn env(&self, rank: i32) -> Vec<(String, String)> {
        let mut env = vec![
            (RANK_VAR.to_string(), rank.to_string()),
            (SIZE_VAR.to_string(), self.size.to_string()),
            ("MLX_RANK".to_string(), rank.to_string()),
        ];
        match self.backend {
            Backend::Ring => {
                env.push((BACKEND_VAR.into(), "ring".into()));
                if let Some(path) = &self.hostfile {
                    env.push(("MLX_HOSTFILE".into(), path.display().to_string()));
                }
            }
            Backend::Nccl => {
                env.push((BACKEND_VAR.into(), "nccl".into()));
                env.push(("MLX_WORLD_SIZE".into(), self.size.to_string()));
                env.push(("NCCL_HOST_IP".into(), "127.0.0.1".into()));
                env.push(("NCCL_PORT".into(), self.nccl_port.to_string()));
                // One GPU per rank; NVLink multicast stays off (it needs
                // fabric support the lent hosts do not give).
                env.push(("CUDA_VISIBLE_DEVICES".into(), rank.to_string()));
                env.push(("NCCL_NVLS_ENABLE".into(), "0".into()));
            }
        }
        env
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        if let Some(path) = self.hostfile.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Makes the child die with its parent (Linux; elsewhere the launcher's
/// own cleanup is all there is).
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; it only sets this child's
    // parent-death signal between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Runs this executable with `args` as every rank of a group of `size`
/// over `backend`: rank 0's output is this process's, the others' standard
/// output is dropped. Returns when every rank has ended; the first rank
/// that fails ends the others, and its failure is the result.
pub fn run_local(size: i32, backend: Backend, args: &[OsString]) -> Result<()> {
    let plan = Plan::local(size, backend)?;
    let pipes = super::bell::Pipes::new(size)?;
    let exe = std::env::current_exe().map_err(|e| launch_err(e.to_string()))?;
    let mut children: Vec<(i32, Child)> = Vec::new();
    for rank in 0..size {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .envs(plan.env(rank))
            .env(super::bell::VAR, pipes.var(rank));
        if rank != 0 {
            cmd.stdout(Stdio::null());
        }
        die_with_parent(&mut cmd);
        let others = pipes.keep_only(rank);
        // SAFETY: close() is async-signal-safe; between fork and exec it
        // drops the other ranks' ends of the doorbell's pipes.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &others {
                    libc::close(fd);
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                end_all(&mut children);
                return Err(launch_err(format!("starting rank {rank}: {e}")));
            }
        }
    }
    // The ranks hold their ends; the launcher's copies would keep a
    // follower's pipe open after rank 0 is gone.
    drop(pipes);
    let result = supervise(&mut children);
    end_all(&mut children);
    drop(plan);
    result
}

/// Waits for every rank; the first failure ends the group. Once rank 0 has
/// succeeded, the others get a grace period to finish.
fn supervise(children: &mut [(i32, Child)]) -> Result<()> {
    let mut done: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let mut rank0_done_at: Option<Instant> = None;
    loop {
        // Every rank that has failed by now is named (the one that died
        // first, and those that lost their peer).
        let mut failed = Vec::new();
        for (i, (rank, child)) in children.iter_mut().enumerate() {
            if done[i].is_some() {
                continue;
            }
            let status = child.try_wait().map_err(|e| launch_err(e.to_string()))?;
            if let Some(status) = status {
                if !status.success() {
                    failed.push(format!("rank {rank} ended with {status}"));
                }
                done[i] = Some(status);
                if *rank == 0 {
                    rank0_done_at = Some(Instant::now());
                }
            }
        }
        if !failed.is_empty() {
            // Rank 0 is told (SIGUSR1: its server fails the requests in
            // flight as UNAVAILABLE and stops, even where a collective
            // never returns: MLX's ring can wait forever on a dead peer).
            if let Some((_, rank0)) = children.first_mut()
                && matches!(rank0.try_wait(), Ok(None))
            {
                // SAFETY: a signal to a child process this launcher started.
                unsafe { libc::kill(rank0.id() as i32, libc::SIGUSR1) };
            }
            // The others see the broken group in their next collective and
            // end on their own (rank 0 failing its requests as
            // UNAVAILABLE first); those that do not are killed after a
            // grace period.
            let until = Instant::now() + PEER_GRACE;
            while Instant::now() < until {
                let running = children
                    .iter_mut()
                    .filter_map(|(_, c)| c.try_wait().ok())
                    .filter(Option::is_none)
                    .count();
                if running == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return Err(launch_err(failed.join("; ")));
        }
        if done.iter().all(Option::is_some) {
            return Ok(());
        }
        if rank0_done_at.is_some_and(|t| t.elapsed() > Duration::from_secs(30)) {
            return Err(launch_err(
                "rank 0 finished but another rank did not end within 30 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills and reaps every rank still running.
fn end_all(children: &mut [(i32, Child)]) {
    for (_, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Socket, Type};

    /// A held port is never handed out by an automatic bind, and a rank's
    /// socket (MLX's options) binds it and accepts a connection on it.
    #[test]
    fn a_held_port_is_taken_by_the_rank_and_by_no_one_else() {
        let held = held_ports(1).expect("held port");
        let port = held[0].0;
        for _ in 0..2000 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            assert_ne!(l.local_addr().expect("addr").port(), port);
        }
        let rank = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        rank.set_reuse_address(true).expect("reuseaddr");
        rank.set_reuse_port(true).expect("reuseport");
        rank.bind(&SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into())
            .expect("the rank binds its held port");
        rank.listen(1).expect("listen");
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        rank.accept()
            .expect("the rank's socket gets the connection");
    }
}
