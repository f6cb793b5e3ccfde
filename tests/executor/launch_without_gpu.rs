//! `parsim execute --backend cuda` as a launcher and as a rank, on a machine without a GPU:
//! the rendezvous completes through the binary, then every rank stops with the CUDA driver's
//! own error (naming the library and where the loader looked), never a panic; bad launcher
//! variables and flags are named. Every process has a deadline and is killed by a guard.

use parsim_executor::backend::cuda::Library;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SMALL: &str = "tests/fixtures/executor_small.toml";
const OUTER_VARS: [&str; 12] = [
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
    "SLURM_NODELIST",
];

/// Kills every child still running when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    fn wait_all(mut self, limit: Duration) -> Vec<Output> {
        let deadline = Instant::now() + limit;
        while self
            .0
            .iter_mut()
            .any(|c| c.try_wait().expect("try_wait").is_none())
        {
            assert!(
                Instant::now() < deadline,
                "a parsim process ran past {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|c| c.wait_with_output().expect("output"))
            .collect()
    }
}

fn parsim(args: &[&str], vars: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_parsim"));
    cmd.args([
        "execute",
        "--config",
        SMALL,
        "--gpus",
        "4",
        "--backend",
        "cuda",
    ])
    .args(args);
    for v in OUTER_VARS {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parsim")
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn torchrun(rank: u32, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", "4".into()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", "4".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
    ]
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Tests that expect the driver to be missing skip (saying why) where it is present.
fn no_driver() -> bool {
    if Library::Driver.present() {
        eprintln!(
            "skipped: a CUDA driver is installed here; this test checks the error without one"
        );
        return false;
    }
    true
}

const DRIVER_ERROR: &str = "CUDA driver (libcuda.so.1) not found";

#[test]
fn nproc_per_node_without_a_driver_gives_the_drivers_error() {
    if !no_driver() {
        return;
    }
    let port = free_port().to_string();
    let start = Instant::now();
    let procs = Procs(vec![parsim(
        &[
            "--nproc-per-node",
            "4",
            "--master-port",
            &port,
            "--rendezvous-timeout",
            "10",
        ],
        &[],
    )]);
    let out = procs.wait_all(Duration::from_secs(30));
    assert!(start.elapsed() < Duration::from_secs(20));
    let e = stderr(&out[0]);
    assert_eq!(out[0].status.code(), Some(1), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // The launcher's last line is the failing rank's own error.
    let last = e.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: rank ") && last.contains(DRIVER_ERROR),
        "{e}"
    );
    assert!(
        last.contains("/usr/lib") && last.contains("install the NVIDIA driver"),
        "{last}"
    );
}

#[test]
fn four_ranks_under_torchrun_meet_then_stop_at_the_driver() {
    if !no_driver() {
        return;
    }
    let port = free_port();
    let procs = Procs(
        (0..4)
            .map(|r| parsim(&["--rendezvous-timeout", "10"], &torchrun(r, port)))
            .collect(),
    );
    for (r, o) in procs.wait_all(Duration::from_secs(30)).iter().enumerate() {
        let e = stderr(o);
        assert_eq!(o.status.code(), Some(1), "rank {r}: {e}");
        assert!(!e.contains("panicked"), "{e}");
        // Past the rendezvous (no timeout, no missing rank): the driver is what stops them.
        assert!(e.contains(DRIVER_ERROR), "rank {r}: {e}");
        assert!(!e.contains("rendezvous"), "rank {r}: {e}");
    }
}

#[test]
fn a_missing_rank_is_named_through_the_binary() {
    let port = free_port();
    let start = Instant::now();
    let procs = Procs(
        [0, 1, 2]
            .map(|r| {
                parsim(
                    &["--rendezvous-timeout", if r == 0 { "1" } else { "8" }],
                    &torchrun(r, port),
                )
            })
            .into(),
    );
    let outs = procs.wait_all(Duration::from_secs(20));
    assert!(start.elapsed() < Duration::from_secs(10));
    for o in outs {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains("rank(s) 3 of 4 never connected"), "{e}");
    }
}

/// Flags, variables, and what the error must say.
type Case<'a> = (&'a [&'a str], Vec<(&'a str, String)>, &'a str);

#[test]
fn bad_launcher_input_is_named() {
    let mut rank4 = torchrun(0, 29500);
    rank4[0].1 = "4".into();
    let mut slurm = vec![
        ("SLURM_PROCID", "1".to_string()),
        ("SLURM_NTASKS", "4".to_string()),
        ("SLURM_LOCALID", "1".to_string()),
        ("SLURM_NODEID", "0".to_string()),
        ("SLURM_NNODES", "1".to_string()),
        ("SLURM_TASKS_PER_NODE", "4".to_string()),
    ];
    slurm.push(("SLURM_NODELIST", "gpu[1-".to_string()));
    let mut world2 = torchrun(0, 29500);
    world2[1].1 = "2".into();
    world2[3].1 = "2".into();
    let cases: [Case; 7] = [
        (&[], rank4, "RANK=\"4\": must be less than WORLD_SIZE (4)"),
        (&[], world2, "the launcher's world size (2, from torchrun's RANK / WORLD_SIZE) differs from the configuration's 4 ranks"),
        (&[], slurm, "SLURM_NODELIST=\"gpu[1-\""),
        (
            &["--nproc-per-node", "2"],
            vec![],
            "--nproc-per-node 2 x --nnodes 1 = 2 processes, but the configuration has 4 ranks",
        ),
        (
            &["--nproc-per-node", "2", "--nnodes", "2"],
            vec![],
            "--master-addr: needed with --nnodes 2",
        ),
        (
            &["--nproc-per-node", "4", "--rendezvous-timeout", "0"],
            vec![],
            "--rendezvous-timeout",
        ),
        (
            &[
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--master-addr",
                "h",
            ],
            vec![],
            "--node-rank=\"2\": must be less than --nnodes (2)",
        ),
    ];
    let procs = Procs(cases.iter().map(|(a, v, _)| parsim(a, v)).collect());
    for (o, (_, _, want)) in procs.wait_all(Duration::from_secs(20)).iter().zip(&cases) {
        let e = stderr(o);
        assert!(!o.status.success(), "{want}");
        assert!(e.contains(want), "{e}");
    }
    // The cpu backend takes no launcher flags.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_parsim"));
    let o = cmd
        .args([
            "execute",
            "--config",
            SMALL,
            "--gpus",
            "4",
            "--nproc-per-node",
            "4",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("the cpu backend runs every rank as a thread"));
}
