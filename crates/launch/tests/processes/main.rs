//! The launcher across real processes; a binary of its own, as it runs itself as the workers.
//!
//! The launcher across real processes, without a GPU: this test binary runs itself as the
//! workers (`worker_entry` does the work when PARSIM_TEST_WORKER is set), under torchrun's
//! variables, Slurm's, and the local supervisor. Every wait has a deadline; the timeouts that
//! are meant to expire are short (1.5 s), those that must not are generous (8-10 s, a loaded
//! machine), and a drop guard kills stray children.

use parsim_executor::backend::cuda::comm::nccl_id::nccl_unique_id;
use parsim_executor::backend::cuda::Library;
use parsim_executor::error::ExecError;
use parsim_launch::env::Overrides;
use parsim_launch::{
    run_worker, supervise, LaunchError, LaunchInfo, LocalLaunch, RankEnv, UniqueId, WorkerOptions,
};
use parsim_plan::run_report::{RankReport, RunReport};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Rank 0's id as `parsim execute` makes it: NCCL's where the library loads, else a stand-in.
fn new_id() -> Result<UniqueId, String> {
    let bytes = nccl_unique_id().map_err(|e| e.to_string())?;
    Ok(UniqueId::nccl_or_stand_in(bytes))
}

/// Variables of the outer environment that would confuse a worker.
const LAUNCH_VARS: [&str; 20] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PARSIM_NNODES",
    "PARSIM_LAUNCH_WORKER",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODELIST",
    "SLURM_STEP_NODELIST",
];

fn rank_report(world: u32, rank: u32) -> RunReport {
    RunReport {
        world,
        loss: vec![1.0],
        aux_loss: vec![0.0],
        ranks: vec![RankReport {
            rank,
            step_s: vec![0.01],
            ..RankReport::default()
        }],
        ..RunReport::default()
    }
}

/// Rank `rank`'s report; under `pieces` (or `pieces-gap:R`, where rank R leaves its share
/// out) with its shard of an exported 4 x 4 tensor `w` (column `rank` of 4 ranks: elements
/// rank, rank + 4, .., value 1.5 x index) and the whole of a replicated `g` of 3.
fn sharded_report(mode: &str, world: u32, rank: u32) -> RunReport {
    let mut r = rank_report(world, rank);
    let gap = mode
        .strip_prefix("pieces-gap:")
        .map(|x| x.parse::<u32>().expect("pieces-gap:R"));
    if mode != "pieces" && gap.is_none() {
        return r;
    }
    let mut elements: Vec<(String, usize, f32)> =
        (0..3).map(|i| ("g".into(), i, 2.0 * i as f32)).collect();
    if gap != Some(rank) {
        elements.extend((0..4).map(|row| {
            let i = row * 4 + rank as usize;
            ("w".to_string(), i, 1.5 * i as f32)
        }));
    }
    r.param_pieces = Some(parsim_plan::pieces::pieces_of(&elements));
    r
}

/// The workers' side. PARSIM_TEST_WORKER: `ok`, `fail:R` (rank R's work returns an error
/// after the rendezvous while the others work for a minute, so they must be stopped), or
/// `crash:R` (rank R's process exits without a word).
#[test]
fn worker_entry() {
    let Ok(mode) = std::env::var("PARSIM_TEST_WORKER") else {
        return;
    };
    let out = PathBuf::from(std::env::var("PARSIM_TEST_OUT").expect("PARSIM_TEST_OUT"));
    let timeout_ms: u64 = std::env::var("PARSIM_TEST_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let env = match RankEnv::from_process(&Overrides::default()) {
        Ok(Some(e)) => e,
        Ok(None) => {
            eprintln!("error: no launcher variables");
            std::process::exit(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    };
    let opts = WorkerOptions {
        rendezvous_timeout: Duration::from_millis(timeout_ms),
        exit_with_supervisor: std::env::var("PARSIM_LAUNCH_WORKER").is_ok(),
        new_id,
    };
    let work = |info: &LaunchInfo| -> Result<RunReport, ExecError> {
        let hex: String = info.unique_id.iter().map(|b| format!("{b:02x}")).collect();
        let line = format!(
            "{hex} {:?} {} {}",
            info.id_source, info.local_rank, info.master_addr
        );
        std::fs::write(out.join(format!("rank{}.id", info.rank)), line).expect("write id");
        if let Some(r) = mode.strip_prefix("crash:") {
            if r.parse::<u32>().expect("crash:R") == info.rank {
                // Dies without a word to rank 0, as a segfault or an OOM kill would.
                std::thread::sleep(Duration::from_millis(200));
                std::process::exit(9);
            }
            std::thread::sleep(Duration::from_secs(60));
            return Ok(rank_report(info.world_size, info.rank));
        }
        match mode
            .strip_prefix("fail:")
            .map(|r| r.parse::<u32>().expect("fail:R"))
        {
            Some(r) if r == info.rank => {
                std::thread::sleep(Duration::from_millis(200));
                Err(ExecError::Rank {
                    rank: r,
                    message: format!("injected failure on rank {r}"),
                })
            }
            Some(_) => {
                std::thread::sleep(Duration::from_secs(60));
                Ok(rank_report(info.world_size, info.rank))
            }
            None => Ok(sharded_report(&mode, info.world_size, info.rank)),
        }
    };
    match run_worker(&env, &opts, work) {
        Ok(Some(run)) => {
            let ranks: Vec<String> = run.ranks.iter().map(|r| r.rank.to_string()).collect();
            std::fs::write(
                out.join("combined"),
                format!("{} {}", run.world, ranks.join(",")),
            )
            .expect("write combined");
            if let Some(params) = run.params {
                std::fs::write(
                    out.join("params.json"),
                    serde_json::to_string(&params).expect("params as JSON"),
                )
                .expect("write params");
            }
            std::process::exit(0)
        }
        Ok(None) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// Kills every child still running when the test ends, however it ends.
struct Procs(Vec<(u32, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    /// Waits for every process until `limit`; (label, output) in spawn order.
    fn wait_all(mut self, limit: Duration) -> Vec<(u32, Output)> {
        let deadline = Instant::now() + limit;
        let mut done = Vec::new();
        while !self.0.is_empty() {
            let mut i = 0;
            while i < self.0.len() {
                if self.0[i].1.try_wait().expect("try_wait").is_some() {
                    let (label, c) = self.0.remove(i);
                    done.push((label, c.wait_with_output().expect("output")));
                } else {
                    i += 1;
                }
            }
            let labels: Vec<u32> = self.0.iter().map(|p| p.0).collect();
            assert!(
                Instant::now() < deadline || labels.is_empty(),
                "processes {labels:?} still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        done.sort_by_key(|d| d.0);
        done
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn worker_args() -> Vec<OsString> {
    [
        "worker_entry",
        "--exact",
        "--nocapture",
        "--test-threads",
        "1",
    ]
    .map(OsString::from)
    .to_vec()
}

fn spawn(vars: &[(&str, String)], out: &Path, mode: &str, timeout_ms: u64) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.args(worker_args());
    for v in LAUNCH_VARS {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PARSIM_TEST_WORKER", mode)
        .env("PARSIM_TEST_OUT", out)
        .env("PARSIM_TEST_TIMEOUT_MS", timeout_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker")
}

fn torchrun_vars(rank: u32, world: u32, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
    ]
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Four launched ranks (torchrun variables) each export only their shard of `w`: rank 0's
/// report holds the whole tensor, 1.5 x index over 16 elements, and the replicated `g` once;
/// where rank 2 holds nothing of `w`, rank 0 fails naming the tensor and its first missing
/// elements (index 2, then 6, ...) and exits nonzero.
#[test]
fn launched_ranks_export_their_shards_and_rank_0_merges_them() {
    for (mode, ok) in [("pieces", true), ("pieces-gap:2", false)] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let procs = Procs(
            (0..4)
                .map(|r| {
                    (
                        r,
                        spawn(&torchrun_vars(r, 4, port), dir.path(), mode, 10000),
                    )
                })
                .collect(),
        );
        let outs = procs.wait_all(Duration::from_secs(20));
        let rank0 = &outs[0].1;
        if !ok {
            assert!(!rank0.status.success(), "{mode}: rank 0 succeeded");
            let e = stderr(rank0);
            assert!(
                e.contains("exported tensor w: elements 2..3 of 16"),
                "{mode}: {e}"
            );
            continue;
        }
        for (r, o) in &outs {
            assert!(o.status.success(), "{mode} rank {r}: {}", stderr(o));
        }
        let params: std::collections::BTreeMap<String, Vec<f32>> = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("params.json")).expect("rank 0's params"),
        )
        .unwrap();
        let want: Vec<f32> = (0..16).map(|i| 1.5 * i as f32).collect();
        assert_eq!(params["w"], want);
        assert_eq!(params["g"], vec![0.0, 2.0, 4.0]);
    }
}

/// Every rank wrote the same id, of the kind rank 0 can make here; rank 0 combined 0..world.
fn check_ids(out: &Path, world: u32) {
    let lines: Vec<String> = (0..world)
        .map(|r| {
            std::fs::read_to_string(out.join(format!("rank{r}.id"))).expect("an id file per rank")
        })
        .collect();
    let ids: BTreeSet<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(ids.len(), 1, "ranks received different ids: {lines:?}");
    let id = ids.first().unwrap();
    assert_eq!(id.len(), 256, "128 bytes in hex");
    assert!(id.chars().any(|c| c != '0'), "an id of zeros");
    let want = if Library::Nccl.present() {
        "Nccl"
    } else {
        "StandIn"
    };
    assert!(
        lines.iter().all(|l| l.split(' ').nth(1) == Some(want)),
        "{lines:?}"
    );
    let combined = std::fs::read_to_string(out.join("combined")).expect("rank 0's combined report");
    let ranks: Vec<String> = (0..world).map(|r| r.to_string()).collect();
    assert_eq!(combined, format!("{world} {}", ranks.join(",")));
}

#[test]
fn torchrun_variables_four_ranks_get_rank_zeros_id() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let procs = Procs(
        (0..4)
            .map(|r| {
                (
                    r,
                    spawn(&torchrun_vars(r, 4, port), dir.path(), "ok", 10000),
                )
            })
            .collect(),
    );
    for (r, o) in procs.wait_all(Duration::from_secs(20)) {
        assert!(o.status.success(), "rank {r}: {}", stderr(&o));
    }
    check_ids(dir.path(), 4);
}

#[test]
fn slurm_variables_four_ranks_get_rank_zeros_id() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Two "nodes" of two tasks, both on this machine; rank 0 lives on the first host of the
    // compressed list, `localhost`.
    let vars = |r: u32| {
        vec![
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "4".to_string()),
            ("SLURM_LOCALID", (r % 2).to_string()),
            ("SLURM_NODEID", (r / 2).to_string()),
            ("SLURM_NNODES", "2".to_string()),
            ("SLURM_TASKS_PER_NODE", "2(x2)".to_string()),
            ("SLURM_NODELIST", "localhost,gpu[02-03]".to_string()),
            ("MASTER_PORT", port.to_string()),
        ]
    };
    let procs = Procs(
        (0..4)
            .map(|r| (r, spawn(&vars(r), dir.path(), "ok", 10000)))
            .collect(),
    );
    for (r, o) in procs.wait_all(Duration::from_secs(20)) {
        assert!(o.status.success(), "rank {r}: {}", stderr(&o));
    }
    check_ids(dir.path(), 4);
    let rank3 = std::fs::read_to_string(dir.path().join("rank3.id")).unwrap();
    assert!(
        rank3.ends_with(" 1 localhost"),
        "local rank 1 on node 1, master localhost: {rank3}"
    );
}

#[test]
fn a_missing_rank_zero_ends_every_rank_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = Instant::now();
    let procs = Procs(
        (1..4)
            .map(|r| (r, spawn(&torchrun_vars(r, 4, port), dir.path(), "ok", 1500)))
            .collect(),
    );
    for (r, o) in procs.wait_all(Duration::from_secs(15)) {
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(
            e.contains(&format!(
                "rank {r}: rank 0 at 127.0.0.1:{port} never accepted a connection"
            )),
            "{e}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_missing_peer_is_named_and_the_others_stop() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut procs = Procs(vec![(
        0,
        spawn(&torchrun_vars(0, 4, port), dir.path(), "ok", 1500),
    )]);
    // The others wait longer than rank 0, so rank 0's verdict reaches them first.
    for r in [1, 2] {
        procs
            .0
            .push((r, spawn(&torchrun_vars(r, 4, port), dir.path(), "ok", 8000)));
    }
    let start = Instant::now();
    let outs = procs.wait_all(Duration::from_secs(15));
    assert!(start.elapsed() < Duration::from_secs(10));
    for (r, o) in outs {
        assert!(!o.status.success(), "rank {r}");
        let e = stderr(&o);
        assert!(
            e.contains("rank(s) 3 of 4 never connected"),
            "rank {r}: {e}"
        );
        if r > 0 {
            assert!(e.contains("stopped by rank 0"), "rank {r}: {e}");
        }
    }
}

#[test]
fn bad_variables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut rank_too_big = torchrun_vars(0, 4, port);
    rank_too_big[0].1 = "4".into();
    let mut no_addr = torchrun_vars(1, 4, port);
    no_addr.retain(|(k, _)| *k != "MASTER_ADDR");
    let mut not_a_number = torchrun_vars(1, 4, port);
    not_a_number[1].1 = "four".into();
    let slurm_bad_list = vec![
        ("SLURM_PROCID", "0".to_string()),
        ("SLURM_NTASKS", "2".to_string()),
        ("SLURM_LOCALID", "0".to_string()),
        ("SLURM_NODEID", "0".to_string()),
        ("SLURM_NNODES", "1".to_string()),
        ("SLURM_NTASKS_PER_NODE", "2".to_string()),
        ("SLURM_NODELIST", "node[01-".to_string()),
    ];
    let cases = [
        (rank_too_big, "RANK=\"4\": must be less than WORLD_SIZE (4)"),
        (no_addr, "MASTER_ADDR is not set"),
        (not_a_number, "WORLD_SIZE=\"four\": must be a whole number"),
        (slurm_bad_list, "SLURM_NODELIST=\"node[01-\""),
    ];
    let procs = Procs(
        cases
            .iter()
            .enumerate()
            .map(|(i, (v, _))| (i as u32, spawn(v, dir.path(), "ok", 3000)))
            .collect(),
    );
    for (i, o) in procs.wait_all(Duration::from_secs(10)) {
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(e.contains(cases[i as usize].1), "{e}");
    }
}

#[test]
fn a_failing_worker_stops_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = Instant::now();
    let procs = Procs(
        (0..4)
            .map(|r| {
                (
                    r,
                    spawn(&torchrun_vars(r, 4, port), dir.path(), "fail:2", 10000),
                )
            })
            .collect(),
    );
    // The others would work for 60 s: they end because rank 2 failed.
    let outs = procs.wait_all(Duration::from_secs(20));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    for (r, o) in outs {
        assert!(!o.status.success(), "rank {r}");
        let e = stderr(&o);
        assert!(e.contains("injected failure on rank 2"), "rank {r}: {e}");
        if r != 2 {
            assert!(e.contains("rank 2 failed"), "rank {r}: {e}");
        }
    }
}

fn local(port: u16, mode: &str, out: &Path) -> LocalLaunch {
    LocalLaunch {
        nproc_per_node: 4,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        env: vec![
            ("PARSIM_TEST_WORKER".into(), mode.into()),
            ("PARSIM_TEST_OUT".into(), out.display().to_string()),
            ("PARSIM_TEST_TIMEOUT_MS".into(), "10000".into()),
        ],
    }
}

#[test]
fn the_supervisor_runs_four_workers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    supervise(&exe, &worker_args(), &local(free_port(), "ok", dir.path())).expect("a clean run");
    check_ids(dir.path(), 4);
}

#[test]
fn the_supervisor_returns_the_failing_workers_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let err = supervise(
        &exe,
        &worker_args(),
        &local(free_port(), "fail:3", dir.path()),
    )
    .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    match err {
        LaunchError::RankFailed { rank, message } => {
            assert_eq!(rank, 3);
            assert!(message.contains("injected failure on rank 3"), "{message}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_worker_ends_when_its_supervisor_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Rank 1 of 2 waits up to 20 s for a rank 0 that never comes; closing its stdin (what the
    // supervisor's death does) ends it at once.
    let mut vars = torchrun_vars(1, 2, port);
    vars.push(("PARSIM_LAUNCH_WORKER", "1".into()));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(worker_args());
    for v in LAUNCH_VARS {
        cmd.env_remove(v);
    }
    let child = cmd
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PARSIM_TEST_WORKER", "ok")
        .env("PARSIM_TEST_OUT", dir.path())
        .env("PARSIM_TEST_TIMEOUT_MS", "20000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut procs = Procs(vec![(1, child)]);
    std::thread::sleep(Duration::from_millis(300));
    drop(procs.0[0].1.stdin.take());
    let start = Instant::now();
    let out = procs.wait_all(Duration::from_secs(5));
    assert!(start.elapsed() < Duration::from_secs(3));
    let e = stderr(&out[0].1);
    assert!(!out[0].1.status.success());
    assert!(e.contains("the local supervisor went away"), "{e}");
}

#[test]
fn a_crashed_process_stops_the_others() {
    // Rank 2 dies: rank 0 sees its connection close. Rank 0 dies: the others see theirs close.
    for (crash, want_others) in [
        (2, "rank 2 failed: its process ended without a report"),
        (0, "rank 0's connection closed"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mode = format!("crash:{crash}");
        let start = Instant::now();
        let procs = Procs(
            (0..4)
                .map(|r| {
                    (
                        r,
                        spawn(&torchrun_vars(r, 4, port), dir.path(), &mode, 10000),
                    )
                })
                .collect(),
        );
        let outs = procs.wait_all(Duration::from_secs(20));
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{:?}",
            start.elapsed()
        );
        for (r, o) in outs {
            assert!(!o.status.success(), "rank {r}");
            if r == crash {
                assert_eq!(o.status.code(), Some(9));
            } else {
                let e = stderr(&o);
                assert!(e.contains(want_others), "crash {crash}, rank {r}: {e}");
            }
        }
    }
}
