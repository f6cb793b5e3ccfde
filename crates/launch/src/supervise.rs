//! The local supervisor of `--nproc-per-node N`: starts N workers (this program again, with
//! torchrun's variables set), forwards their output, and when one fails kills the others and
//! returns that worker's own error. Children are killed when the supervisor returns or
//! unwinds (a drop guard), and a worker ends by itself when the supervisor's end of its stdin
//! closes.

use super::worker::{FailureLine, FAILURE_PREFIX, WORKER_MARKER};
use super::LaunchError;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The most workers one node starts (one per GPU; the largest nodes have 8-16 GPUs).
pub const MAX_LOCAL_WORKERS: u32 = 256;

/// This node's share of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLaunch {
    pub nproc_per_node: u32,
    pub nnodes: u32,
    pub node_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// Further variables for every worker.
    pub env: Vec<(String, String)>,
}

impl LocalLaunch {
    /// Positive counts, a node rank inside the nodes, a world that fits in u32.
    pub fn validate(&self) -> Result<u32, LaunchError> {
        let flag = |name: &str, value: u32, rule: String| LaunchError::Variable {
            name: name.into(),
            value: value.to_string(),
            rule,
        };
        if self.nproc_per_node == 0 {
            return Err(flag("--nproc-per-node", 0, "must be at least 1".into()));
        }
        if self.nproc_per_node > MAX_LOCAL_WORKERS {
            return Err(flag(
                "--nproc-per-node",
                self.nproc_per_node,
                format!("at most {MAX_LOCAL_WORKERS} worker processes on one node (one per GPU)"),
            ));
        }
        if self.nnodes == 0 {
            return Err(flag("--nnodes", 0, "must be at least 1".into()));
        }
        if self.node_rank >= self.nnodes {
            return Err(flag(
                "--node-rank",
                self.node_rank,
                format!("must be less than --nnodes ({})", self.nnodes),
            ));
        }
        if self.master_port == 0 {
            return Err(flag(
                "--master-port",
                0,
                "must be a TCP port, 1..=65535".into(),
            ));
        }
        self.nproc_per_node
            .checked_mul(self.nnodes)
            .ok_or_else(|| flag("--nnodes", self.nnodes, "world size overflows".into()))
    }

    /// The variables of local worker `local_rank` (torchrun's names).
    pub fn worker_env(&self, local_rank: u32) -> Vec<(&'static str, String)> {
        let world = self.nproc_per_node * self.nnodes;
        vec![
            (WORKER_MARKER, "1".into()),
            (
                "RANK",
                (self.node_rank * self.nproc_per_node + local_rank).to_string(),
            ),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("PARSIM_NNODES", self.nnodes.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ]
    }
}

/// Kills and reaps every child still running when dropped.
struct Children(Vec<Option<Child>>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts this node's workers (`program args`, each with its rank variables) and waits for
/// them. `Ok` when every worker exits 0; otherwise the failing worker's own error.
pub fn supervise(
    program: &Path,
    args: &[OsString],
    launch: &LocalLaunch,
) -> Result<(), LaunchError> {
    launch.validate()?;
    let failures = Arc::new(Mutex::new(Vec::<FailureLine>::new()));
    let mut children = Children(Vec::new());
    let mut pumps: Vec<Vec<JoinHandle<()>>> = Vec::new();
    // NCCL installed only as libnccl.so.2: a libnccl.so link first on the workers' path.
    let shim = super::nccl_shim::prepare();
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    for local in 0..launch.nproc_per_node {
        let mut cmd = Command::new(program);
        if let Some(s) = &shim {
            cmd.env("LD_LIBRARY_PATH", s.ld_library_path(ld.as_deref()));
        }
        cmd.args(args)
            .envs(launch.worker_env(local))
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            local_rank: local,
            source,
        })?;
        let rank = launch.node_rank * launch.nproc_per_node + local;
        let mut threads = Vec::new();
        if let Some(out) = child.stdout.take() {
            threads.push(std::thread::spawn(move || forward_stdout(out)));
        }
        if let Some(err) = child.stderr.take() {
            let f = failures.clone();
            threads.push(std::thread::spawn(move || forward_stderr(rank, err, f)));
        }
        children.0.push(Some(child));
        pumps.push(threads);
    }
    let failed = wait_first_failure(&mut children)?;
    let Some((local, status)) = failed else {
        for t in pumps.into_iter().flatten() {
            let _ = t.join();
        }
        return Ok(());
    };
    // The failing worker's stderr ends with its process: read it to the end, then stop the
    // rest and collect what they said.
    for t in std::mem::take(&mut pumps[local]) {
        let _ = t.join();
    }
    drop(children);
    for t in pumps.into_iter().flatten() {
        let _ = t.join();
    }
    let lines = failures.lock().map(|f| f.clone()).unwrap_or_default();
    let rank = launch.node_rank * launch.nproc_per_node + local as u32;
    Err(pick_error(&lines, rank, status))
}

/// Polls the children until one exits with a failure (its index and status) or all exit 0.
fn wait_first_failure(children: &mut Children) -> Result<Option<(usize, ExitStatus)>, LaunchError> {
    loop {
        let mut running = 0;
        for (i, slot) in children.0.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    *slot = None;
                    if !status.success() {
                        return Ok(Some((i, status)));
                    }
                }
                Ok(None) => running += 1,
                Err(source) => {
                    return Err(LaunchError::Spawn {
                        local_rank: i as u32,
                        source,
                    })
                }
            }
        }
        if running == 0 {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error to report: the first rank's own failure, else the first stop (which carries the
/// failing rank's message from rank 0), else the exit status of the first worker that failed.
pub fn pick_error(lines: &[FailureLine], rank: u32, status: ExitStatus) -> LaunchError {
    if let Some(l) = lines.iter().find(|l| l.own) {
        return LaunchError::RankFailed {
            rank: l.rank,
            message: l.message.clone(),
        };
    }
    if let Some(l) = lines.first() {
        return LaunchError::Stopped(l.message.clone());
    }
    LaunchError::RankFailed {
        rank,
        message: format!("the worker process exited with {status} without an error message"),
    }
}

fn forward_stdout(out: impl Read) {
    let mut r = BufReader::new(out);
    let mut line = Vec::new();
    while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(&line);
        let _ = o.flush();
        line.clear();
    }
}

/// Forwards a worker's stderr with its rank in front, keeping its failure line for the
/// supervisor.
fn forward_stderr(rank: u32, err: impl Read, failures: Arc<Mutex<Vec<FailureLine>>>) {
    for line in BufReader::new(err).lines() {
        let Ok(line) = line else { break };
        if line.starts_with(FAILURE_PREFIX) {
            if let (Some(f), Ok(mut v)) = (FailureLine::parse(&line), failures.lock()) {
                v.push(f);
            }
            continue;
        }
        eprintln!("[rank {rank}] {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(n: u32, nnodes: u32, node: u32) -> LocalLaunch {
        LocalLaunch {
            nproc_per_node: n,
            nnodes,
            node_rank: node,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            env: Vec::new(),
        }
    }

    #[test]
    fn worker_variables_follow_torchrun() {
        // Node 1 of 2 with 4 processes each: local rank 3 is global rank 1 * 4 + 3 = 7.
        let env: std::collections::HashMap<_, _> =
            local(4, 2, 1).worker_env(3).into_iter().collect();
        assert_eq!(env["RANK"], "7");
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["LOCAL_RANK"], "3");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "4");
        assert_eq!(env["GROUP_RANK"], "1");
        // And the worker reads them back as the same rank.
        let e =
            crate::RankEnv::from_vars(&|n| env.get(n).cloned(), &crate::env::Overrides::default())
                .unwrap()
                .unwrap();
        assert_eq!((e.rank, e.world_size, e.node_rank, e.nnodes), (7, 8, 1, 2));
    }

    #[cfg(unix)]
    #[test]
    fn the_reported_error_is_the_failing_ranks_own() {
        use std::os::unix::process::ExitStatusExt;
        let status = ExitStatus::from_raw(9 << 8); // exit code 9
        let stop = FailureLine {
            rank: 1,
            own: false,
            message: "rank 3 failed: boom".into(),
        };
        let own = FailureLine {
            rank: 3,
            own: true,
            message: "boom".into(),
        };
        let e = pick_error(&[stop.clone(), own], 1, status).to_string();
        assert_eq!(e, "rank 3 failed: boom");
        let e = pick_error(&[stop], 1, status).to_string();
        assert_eq!(e, "stopped by rank 0: rank 3 failed: boom");
        let e = pick_error(&[], 2, status).to_string();
        assert!(
            e.starts_with("rank 2 failed: the worker process exited with exit status: 9"),
            "{e}"
        );
    }

    #[test]
    fn bad_flags_name_the_flag() {
        for (l, want) in [
            (local(0, 1, 0), "--nproc-per-node"),
            (local(1, 0, 0), "--nnodes"),
            (
                local(2, 2, 2),
                "--node-rank=\"2\": must be less than --nnodes (2)",
            ),
            (local(257, 1, 0), "at most 256 worker processes"),
            (local(2, u32::MAX, 0), "overflows"),
        ] {
            let e = l.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
