//! Numbers at the edges of their types through the `parsim` binary: the reported wrap is a
//! refusal by field, and flags drawn two and three at a time from each command's own
//! `--help` at 0, 1, 2, 2^16, 2^31, 2^32-1 and 2^53 end in a documented exit status, never a
//! panic, with finite JSON. The in-process property over every configuration field is in the
//! fuzz suite (tests/fuzz/extreme_numbers_rules.rs); this is its smaller set through the binary.

use crate::common;
use assert_cmd::cargo::cargo_bin_cmd;
use common::non_numbers;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestCaseError, TestRng};
use proptest::test_runner::{TestError, TestRunner};
use serde_json::Value;
use std::time::Duration;

/// The values every numeric flag is drawn from.
const EDGES: [u64; 7] = [0, 1, 2, 1 << 16, 1 << 31, u32::MAX as u64, 1 << 53];

/// The statuses `parsim --help` documents but 130 (a Ctrl-C the test never sends): 0 success,
/// 1 invalid input (a refused configuration is one), 2 a flag the parser refuses, 3 does not
/// fit.
const STATUSES: [i32; 4] = [0, 1, 2, 3];

/// The commands drawn, each with the flags it always gets: `execute` only builds and
/// validates its Plan (never a run), `search` lists one mix.
const COMMANDS: [(&str, &[&str]); 5] = [
    ("estimate", &[]),
    ("search", &["--top", "1"]),
    ("schedule", &[]),
    ("layout", &[]),
    ("execute", &["--plan-only"]),
];

/// Flags not drawn: those that start other work than the command's answer (a calibration
/// sweep, a search that simulates every mix), and `--gbs` of `search`, whose 2^31 makes every
/// pipelined mix extrapolate 2^30 microbatches (a minute per search; the in-process property
/// draws it under a cancel budget).
const NOT_DRAWN: [&str; 5] = [
    "--calibrate",
    "--exhaustive",
    "--help",
    "--version",
    "--gbs",
];

/// A command's flags: (flag, takes a value).
type Flags = Vec<(String, bool)>;

/// `command`'s flags from its `--help`.
fn flags_of(command: &str) -> Flags {
    let out = cargo_bin_cmd!("parsim")
        .args([command, "--help"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // An option's line starts with it (`  -c, --config <FILE>`, `      --pp <PP>`).
            let l = l.trim_start();
            if !l.starts_with('-') {
                return None;
            }
            let flag = l.split([' ', ',']).find(|w| w.starts_with("--"))?;
            let value = l.contains(&format!("{flag} <"));
            let keep = !NOT_DRAWN.contains(&flag) || (command != "search" && flag == "--gbs");
            keep.then(|| (flag.to_string(), value))
        })
        .collect()
}

#[test]
fn the_reported_wrap_is_refused_by_field() {
    // (pp - 2) x vpp wrapped to 0 in u32 and the layer split divided by it.
    let out = cargo_bin_cmd!("parsim")
        .args([
            "estimate",
            "--pp",
            "2147483648",
            "--vpp",
            "2",
            "--gpus",
            "16",
        ])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("parallel.pp: must be at most 16777216"),
        "{stderr}"
    );
    assert!(
        stderr.contains("parallel.vpp: parallel.pp x parallel.vpp = 2147483648 x 2"),
        "{stderr}"
    );
}

/// The schedule's own limits hold for any 32-bit counts: pp x vpp x microbatches (three u32s
/// overflowed u64) and pp x vpp for the extrapolation are refused as too large.
#[test]
fn schedules_of_any_32_bit_size_are_refused_not_wrapped() {
    use parsim::schedule::{
        base_microbatches, generate, simulate_extrapolated, Costs, ScheduleError, ScheduleKind,
    };
    for kind in ScheduleKind::ALL.iter().copied() {
        let e = generate(kind, u32::MAX, u32::MAX, u32::MAX).unwrap_err();
        assert!(matches!(e, ScheduleError::TooLarge { .. }), "{kind}: {e}");
        assert!(base_microbatches(kind, u32::MAX, 7) >= 4);
    }
    let costs = Costs::uniform(2, 1, 1.0, 2.0, None, 0.0).unwrap();
    let e =
        simulate_extrapolated(ScheduleKind::Gpipe, 1 << 20, 1 << 10, u32::MAX, &costs).unwrap_err();
    assert!(matches!(e, ScheduleError::TooLarge { .. }), "{e}");
}

/// One drawn command line.
#[derive(Debug, Clone)]
struct Line {
    args: Vec<String>,
}

fn lines() -> impl Strategy<Value = Line> {
    let per_command: Vec<(&str, &[&str], Flags)> = COMMANDS
        .iter()
        .map(|&(c, fixed)| (c, fixed, flags_of(c)))
        .collect();
    proptest::sample::select(per_command).prop_flat_map(|(command, fixed, flags)| {
        proptest::sample::subsequence(flags, 2..=3).prop_flat_map(move |picked| {
            let values: Vec<BoxedStrategy<Vec<String>>> = picked
                .into_iter()
                .map(|(flag, takes)| {
                    if takes {
                        proptest::sample::select(EDGES.to_vec())
                            .prop_map(move |v| vec![flag.clone(), v.to_string()])
                            .boxed()
                    } else {
                        Just(vec![flag]).boxed()
                    }
                })
                .collect();
            values.prop_map(move |vs| {
                let mut args = vec![command.to_string()];
                args.extend(fixed.iter().map(|s| s.to_string()));
                args.extend(vs.into_iter().flatten());
                Line { args }
            })
        })
    })
}

/// Runs `line` with `--json` where the command takes it: a documented status, no panic, and
/// finite JSON from every command that answered.
fn check(line: &Line) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut args = line.args.clone();
    if !args.iter().any(|a| a == "--json" || a == "--csv") {
        args.push("--json".into());
    }
    let out = cargo_bin_cmd!("parsim")
        .args(&args)
        .current_dir(dir.path())
        .timeout(Duration::from_secs(60))
        .output()
        .map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let input = format!("parsim {}", args.join(" "));
    let code = out.status.code();
    if !code.is_some_and(|c| STATUSES.contains(&c)) || stderr.contains("panicked") {
        return Err(format!("{input}: status {:?}\n{stderr}", out.status));
    }
    if matches!(code, Some(0 | 3)) && args.contains(&"--json".to_string()) {
        let v: Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("{input}: not JSON ({e})"))?;
        if let Some(bad) = non_numbers(&v) {
            return Err(format!("{input}: {bad}"));
        }
    }
    Ok(())
}

/// The seed `PARSIM_FUZZ_SEED` names (default 18, the fuzz suite's).
fn seed() -> (u64, [u8; 32]) {
    let seed: u64 = std::env::var("PARSIM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(18);
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes(),
        );
    }
    (seed, bytes)
}

#[test]
fn flags_at_the_edges_through_the_binary() {
    let (seed, bytes) = seed();
    let cases = std::env::var("PARSIM_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(40, |n: u32| n.min(400));
    eprintln!("{cases} command lines, seed {seed} (PARSIM_FUZZ_SEED={seed} replays them)");
    let mut runner = TestRunner::new_with_rng(
        RunnerConfig {
            cases,
            failure_persistence: None,
            max_shrink_iters: 32,
            ..RunnerConfig::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    match runner.run(&lines(), |line| check(&line).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(why, line)) => {
            panic!("seed {seed}: {why}\nsmallest failing line: {:?}", line.args)
        }
        Err(e) => panic!("seed {seed}: {e}"),
    }
}
