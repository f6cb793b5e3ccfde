//! `parsim execute --trace --trace-predicted`: the recorded timeline of the small fixture
//! (PP 2, DP 2) under 1F1B, interleaved 1F1B and ZB-V is valid Trace Event JSON holding every
//! action of the Plan once per timed step, sends before their receives complete, one compute
//! action at a time per rank, actions plus waits summing to the measured step; the predicted
//! tracks are the timeline `parsim schedule --config` draws for the same configuration.

use assert_cmd::Command;
use parsim::config::{Config, Layer, Resolved};
use parsim::lower::{lower, LowerOptions};
use parsim_plan::plan::Action;
use parsim_plan::GroupKind;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

fn parsim() -> Command {
    Command::cargo_bin("parsim").expect("binary")
}

const STEPS: u32 = 3;
const WARMUP: u32 = 1;

/// The executor's small model on 4 ranks (PP 2 x DP 2) on the CPU profile in fp32, so that
/// `parsim schedule --config` and `parsim execute` predict with the same costs.
fn config(schedule: &str, vpp: u32) -> String {
    format!(
        r#"[model]
num_layers = 8
hidden_size = 64
num_attention_heads = 8
num_query_groups = 4
ffn_hidden_size = 128
vocab_size = 128
make_vocab_size_divisible_by = 1
tied_embeddings = false
hidden_dropout = 0.0
attention_dropout = 0.0
[cluster]
num_gpus = 4
gpu = "cpu"
[parallel]
tp = 1
pp = 2
vpp = {vpp}
schedule = "{schedule}"
zero = 1
[training]
seq_length = 32
micro_batch_size = 1
global_batch_size = 16
precision = "fp32"
grad_dtype = "fp32"
recompute = "selective"
"#
    )
}

fn run_ok(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Complete events (`ph` X) of process `pid` and thread `tid`, by start.
fn spans(events: &[Value], pid: u64, tid: Option<u64>) -> Vec<&Value> {
    let mut v: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && tid.is_none_or(|t| e["tid"] == t))
        .collect();
    v.sort_by(|a, b| num(a, "ts").total_cmp(&num(b, "ts")));
    v
}

fn num(e: &Value, k: &str) -> f64 {
    e[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {e}"))
}

fn end(e: &Value) -> f64 {
    num(e, "ts") + num(e, "dur")
}

/// The schedule's letter, stage and microbatch of a compute action of the Plan.
fn compute_key(a: &Action) -> Option<(&'static str, u32, u32)> {
    match *a {
        Action::Forward { stage, mb } => Some(("F", stage, mb)),
        Action::Backward { stage, mb } => Some(("B", stage, mb)),
        Action::BackwardInput { stage, mb } => Some(("I", stage, mb)),
        Action::BackwardWeight { stage, mb } => Some(("W", stage, mb)),
        _ => None,
    }
}

fn check(schedule: &str, vpp: u32, dir: &Path) {
    let cfg = dir.join(format!("{schedule}.toml"));
    std::fs::write(&cfg, config(schedule, vpp)).unwrap();
    let trace_path = dir.join(format!("{schedule}.trace.json"));
    let stdout = run_ok(parsim().args([
        "execute",
        "--config",
        cfg.to_str().unwrap(),
        "--steps",
        &STEPS.to_string(),
        "--warmup",
        &WARMUP.to_string(),
        "--json",
        "--trace",
        trace_path.to_str().unwrap(),
        "--trace-predicted",
    ]));
    let report: Value = serde_json::from_slice(&stdout).expect("execute json");
    let trace: Value =
        serde_json::from_slice(&std::fs::read(&trace_path).unwrap()).expect("trace json");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    // Trace Event Format: every event has a name, a phase, a pid; complete events a
    // non-negative duration in microseconds.
    for e in events {
        assert!(e["name"].is_string() && e["pid"].is_u64(), "{e}");
        match e["ph"].as_str() {
            Some("M") => assert!(e["args"].is_object(), "{e}"),
            Some("X") => {
                assert!(e["tid"].is_u64() && num(e, "ts").is_finite(), "{e}");
                assert!(num(e, "dur") >= 0.0, "{e}");
            }
            p => panic!("unexpected phase {p:?} in {e}"),
        }
    }
    let resolved =
        Resolved::new(Config::from_layers(&[Layer::from_file(&cfg).unwrap()]).unwrap()).unwrap();
    let plan = lower(&resolved, &LowerOptions::default()).unwrap();
    let timed = (STEPS - WARMUP) as usize;
    for rp in &plan.ranks {
        let pid = rp.rank as u64;
        let all = spans(events, pid, None);
        // Every action of the Plan exactly once per timed step, with its stage and microbatch.
        let mut seen: HashMap<(u64, u64), &Value> = HashMap::new();
        for e in all
            .iter()
            .filter(|e| e["args"]["index"].is_u64() && e["cat"] != "wait")
        {
            let key = (
                e["args"]["step"].as_u64().unwrap(),
                e["args"]["index"].as_u64().unwrap(),
            );
            assert!(seen.insert(key, e).is_none(), "{schedule}: {key:?} twice");
        }
        assert_eq!(
            seen.len(),
            timed * rp.actions.len(),
            "{schedule} rank {}",
            rp.rank
        );
        for step in 0..timed as u64 {
            for (i, a) in rp.actions.iter().enumerate() {
                let e = seen[&(step, i as u64)];
                if let Some((k, s, m)) = compute_key(a) {
                    assert_eq!(e["cat"], k, "{schedule}: {e}");
                    assert_eq!(e["args"]["stage"], s);
                    assert_eq!(e["args"]["microbatch"], m);
                }
            }
        }
        // One compute action at a time on the rank's compute thread.
        let compute = spans(events, pid, Some(0));
        for w in compute.windows(2) {
            assert!(
                num(w[1], "ts") >= end(w[0]) - 1e-3,
                "{schedule} rank {}: {} overlaps {}",
                rp.rank,
                w[0]["name"],
                w[1]["name"]
            );
        }
        // ZeRO-1 over DP 2 with Megatron-Core's overlapped gradient reduction (one bucket a
        // stage: the default 40M parameters): per step one reduce-scatter of each of this
        // rank's stages over its DP group, inside that stage's last backward (its last W under
        // ZB-V), then one all-gather of the parameters inside the optimizer step.
        let collectives = spans(events, pid, Some(1));
        let ops: Vec<&str> = collectives
            .iter()
            .map(|e| e["cat"].as_str().unwrap())
            .collect();
        let mut per_step = vec!["reduce_scatter"; rp.stages.len()];
        per_step.push("all_gather");
        assert_eq!(ops, per_step.repeat(timed), "{schedule}");
        for c in &collectives {
            let group: Vec<u32> = serde_json::from_value(c["args"]["group"].clone()).unwrap();
            assert_eq!(group, rp.groups.get(GroupKind::DpCp), "{schedule}: {c}");
            assert!(c["args"]["bytes"].as_u64().unwrap() > 0);
            let inside = compute
                .iter()
                .find(|e| {
                    e["args"]["step"] == c["args"]["step"]
                        && num(c, "ts") >= num(e, "ts")
                        && end(c) <= end(e) + 1e-3
                })
                .unwrap_or_else(|| panic!("{schedule}: {c} inside no compute action"));
            if c["cat"] == "all_gather" {
                assert_eq!(inside["cat"], "optimizer", "{schedule}: {c}");
                continue;
            }
            let weights = |e: &Value| e["cat"] == "B" || e["cat"] == "W";
            assert!(weights(inside), "{schedule}: {c} in {inside}");
            let later = compute.iter().any(|e| {
                weights(e)
                    && e["args"]["step"] == c["args"]["step"]
                    && e["args"]["stage"] == inside["args"]["stage"]
                    && num(e, "ts") > num(inside, "ts")
            });
            assert!(!later, "{schedule}: {c} before the stage's last backward");
        }
        // Actions (compute and pipeline threads) plus waits make the measured step (the
        // median of two timed steps is their mean); the steps' own spans are not summed.
        let sum_us: f64 = all
            .iter()
            .filter(|e| e["tid"] != 1 && e["cat"] != "user_annotation")
            .map(|e| num(e, "dur"))
            .sum();
        let step_s = report["ranks"][rp.rank as usize]["step_s"]
            .as_f64()
            .unwrap();
        let per_step_s = sum_us * 1e-6 / timed as f64;
        assert!(
            (per_step_s - step_s).abs() <= 0.02 * step_s,
            "{schedule} rank {}: actions + waits {per_step_s} s vs step {step_s} s",
            rp.rank
        );
    }
    // Each receive completes after its send started.
    for rp in &plan.ranks {
        for e in spans(events, rp.rank as u64, Some(2)) {
            let name = e["name"].as_str().unwrap();
            let Some((what, from)) = name
                .strip_prefix("recv ")
                .and_then(|r| r.split_once(" <- "))
            else {
                continue;
            };
            let send_name = format!("send {what} -> {}", rp.rank);
            let from: u64 = from.parse().unwrap();
            let send = spans(events, from, Some(2))
                .into_iter()
                .find(|s| s["name"] == send_name.as_str() && s["args"]["step"] == e["args"]["step"])
                .unwrap_or_else(|| panic!("{schedule}: no {send_name} on rank {from}"));
            assert!(
                num(send, "ts") <= end(e),
                "{schedule}: {name} ends before its send"
            );
        }
    }
    // The predicted tracks are what `parsim schedule --config` draws, for step 0.
    let sched_path = dir.join(format!("{schedule}.schedule.json"));
    run_ok(parsim().args([
        "schedule",
        "--config",
        cfg.to_str().unwrap(),
        "--chrome-trace",
        sched_path.to_str().unwrap(),
    ]));
    let sched: Value = serde_json::from_slice(&std::fs::read(&sched_path).unwrap()).unwrap();
    let sched = sched["traceEvents"].as_array().unwrap();
    let world = plan.ranks.len() as u64;
    for r in 0..2u64 {
        let drawn = spans(sched, 0, Some(r));
        let predicted: Vec<&Value> = spans(events, world + r, Some(0))
            .into_iter()
            .filter(|e| e["args"]["step"] == 0)
            .collect();
        assert!(!drawn.is_empty());
        assert_eq!(drawn.len(), predicted.len(), "{schedule} pipeline rank {r}");
        for (d, p) in drawn.iter().zip(&predicted) {
            assert_eq!(d["name"], p["name"], "{schedule} pipeline rank {r}");
            for k in ["ts", "dur"] {
                let (a, b) = (num(d, k), num(p, k));
                assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{k}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn measured_trace_of_1f1b_interleaved_and_zbv_with_pp2_dp2() {
    let dir = tempfile::tempdir().unwrap();
    for (schedule, vpp) in [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2)] {
        check(schedule, vpp, dir.path());
    }
}

#[test]
fn compare_timeline_lists_every_compute_kind_and_the_five_largest_misses() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("zbv.toml");
    std::fs::write(&cfg, config("zb-v", 2)).unwrap();
    let stdout = run_ok(parsim().args([
        "execute",
        "--config",
        cfg.to_str().unwrap(),
        "--json",
        "--compare-timeline",
    ]));
    let v: Value = serde_json::from_slice(&stdout).unwrap();
    let c = &v["timeline_comparison"];
    let actions = c["actions"].as_array().unwrap();
    let misses = c["largest_misses"].as_array().unwrap();
    assert_eq!(misses.len(), 5);
    // The largest misses are the five largest |measured - predicted| of all actions.
    let mut errors: Vec<f64> = actions
        .iter()
        .map(|a| (num(a, "measured_s") - num(a, "predicted_s")).abs())
        .collect();
    errors.sort_by(|a, b| b.total_cmp(a));
    for (m, e) in misses.iter().zip(&errors) {
        assert!((num(m, "error_s").abs() - e).abs() <= 1e-12, "{m}");
    }
    // ZB-V on 2 ranks, 8 microbatches: each rank runs F, I and W of 2 chunks x 8 microbatches.
    for rank in 0..4 {
        for kind in ["F", "I", "W"] {
            let row = c["per_kind"]
                .as_array()
                .unwrap()
                .iter()
                .find(|k| k["rank"] == rank && k["kind"] == kind)
                .unwrap_or_else(|| panic!("rank {rank} {kind}"));
            assert_eq!(row["count"], 16, "{row}");
            assert!(num(row, "predicted_s") > 0.0 && num(row, "measured_s") > 0.0);
        }
    }
}

#[test]
fn trace_errors_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, config("1f1b", 1)).unwrap();
    let bad = dir.path().join("missing-dir").join("t.json");
    let out = parsim()
        .args(["execute", "--config", cfg.to_str().unwrap(), "--trace"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trace: cannot write"), "{err}");
    // --trace-predicted needs --trace.
    let out = parsim()
        .args([
            "execute",
            "--config",
            cfg.to_str().unwrap(),
            "--trace-predicted",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--trace"));
}

/// `--compare-timeline` with a calibrated CPU profile (a profile file named `cpu`, as
/// `execute --calibrate --out` writes it): the prediction uses it, not the shipped one, and
/// the per-action misses are listed. A kernel overhead 1 ms larger per op lengthens every
/// predicted forward action (a property of the time model: each op adds the overhead).
#[test]
fn compare_timeline_uses_a_calibrated_cpu_profile() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, config("1f1b", 1)).unwrap();
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/cpu.toml"))
            .unwrap();
    let overhead = "kernel_overhead_s = 0.000004327";
    assert_eq!(shipped.matches(overhead).count(), 1, "{shipped}");
    let profile = dir.path().join("my-cpu.toml");
    std::fs::write(
        &profile,
        shipped.replace(overhead, "kernel_overhead_s = 0.001"),
    )
    .unwrap();
    let run = |gpu: Option<&Path>| {
        let mut cmd = parsim();
        cmd.args(["execute", "--config", cfg.to_str().unwrap()])
            .args(["--json", "--compare-timeline"]);
        if let Some(p) = gpu {
            cmd.arg("--gpu").arg(p);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["timeline_comparison"].clone(), stderr)
    };
    let (base, _) = run(None);
    let (calibrated, stderr) = run(Some(&profile));
    assert!(!stderr.contains("replaced by"), "{stderr}");
    let forward = |c: &Value| -> f64 {
        c["per_kind"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["kind"] == "F")
            .map(|k| num(k, "predicted_s"))
            .sum()
    };
    assert!(
        forward(&calibrated) > forward(&base) + 1e-3,
        "{} vs {}",
        forward(&calibrated),
        forward(&base)
    );
    let actions = calibrated["actions"].as_array().unwrap();
    assert!(!actions.is_empty());
    for a in actions {
        assert!(
            num(a, "predicted_s").is_finite() && num(a, "measured_s") > 0.0,
            "{a}"
        );
    }
    assert_eq!(calibrated["largest_misses"].as_array().unwrap().len(), 5);
}
