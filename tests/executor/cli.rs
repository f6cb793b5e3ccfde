//! `parsim execute`: the JSON contract, the comparison with the prediction, and clear errors.

use assert_cmd::Command;
use serde_json::Value;

fn parsim() -> Command {
    Command::cargo_bin("parsim").expect("binary")
}

/// Runs `c` and asserts it succeeded (its stderr in the message otherwise).
fn succeeded(c: &mut Command) -> std::process::Output {
    let out = c.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const SMALL: &str = "tests/fixtures/executor_small.toml";

/// A rank's `moe_load.expert_rows` (rows each local expert received) from `execute --json`.
fn expert_rows(rank: &Value) -> Vec<u64> {
    rank["moe_load"]["expert_rows"]
        .as_array()
        .expect("expert_rows")
        .iter()
        .map(|x| x.as_u64().expect("a row count"))
        .collect()
}

#[test]
fn execute_json_follows_the_design_contract() {
    let out = succeeded(parsim().args([
        "execute", "--config", SMALL, "--steps", "2", "--warmup", "1", "--json",
    ]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["world_size"], 8);
    assert_eq!(v["steps"], 2);
    assert_eq!(v["loss"].as_array().unwrap().len(), 1);
    let loss = v["loss"][0].as_f64().unwrap();
    // Near ln(128) at initialisation.
    assert!(loss > 4.0 && loss < 5.5, "{loss}");
    assert!(v["step_s"].as_f64().unwrap() > 0.0);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    for r in ranks {
        for k in ["tp", "cp", "ep", "dp", "pp"] {
            assert!(r["coords"][k].is_u64(), "{k}");
        }
        for k in [
            "forward_s",
            "backward_s",
            "backward_weight_s",
            "p2p_s",
            "optimizer_s",
        ] {
            assert!(r["phases"][k].as_f64().unwrap() >= 0.0, "{k}");
        }
        assert!(r["phases"]["forward_s"].as_f64().unwrap() > 0.0);
        let m = &r["memory"];
        let sum: u64 = [
            "weights",
            "gradients",
            "optimizer",
            "activations",
            "buffers",
        ]
        .iter()
        .map(|k| m[k].as_u64().unwrap())
        .sum();
        assert_eq!(sum, r["peak_bytes"].as_u64().unwrap());
        let pred = r["predicted_peak_bytes"].as_u64().unwrap() as f64;
        let meas = sum as f64;
        assert!(
            (meas - pred).abs() / pred <= 0.02,
            "rank {}: {meas} vs {pred}",
            r["rank"]
        );
    }
}

#[test]
fn execute_prints_tables_with_the_prediction() {
    let out = parsim()
        .args(["execute", "--config", SMALL, "--steps", "2"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("predicted") && s.contains("loss per timed step"),
        "{s}"
    );
}

#[test]
fn unsupported_mixes_and_bad_flags_are_clear_errors() {
    for (args, needle) in [
        (
            vec!["--mode", "lora", "--lora-rank", "0"],
            "training.lora.rank",
        ),
        (vec!["--steps", "1", "--warmup", "1"], "--steps"),
        (vec!["--tp", "3"], "parallel.tp"),
    ] {
        let out = parsim()
            .args(["execute", "--config", SMALL])
            .args(&args)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// LoRA from the estimate's flags: TP 2 + SP, PP 2, DP 2 with ZeRO 1, adapters of rank 4 on
/// the default targets (qkv, proj); every rank's peak within 2% of the prediction.
#[test]
fn execute_runs_lora_from_the_mode_flag() {
    let out = succeeded(parsim().args([
        "execute",
        "--config",
        SMALL,
        "--mode",
        "lora",
        "--lora-rank",
        "4",
        "--steps",
        "2",
        "--json",
    ]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 8);
    for r in ranks {
        let (meas, pred) = (
            r["peak_bytes"].as_u64().expect("peak") as f64,
            r["predicted_peak_bytes"].as_u64().expect("prediction") as f64,
        );
        assert!(
            (meas - pred).abs() / pred <= 0.02,
            "rank {}: {meas} vs {pred}",
            r["rank"]
        );
    }
}

#[test]
fn a_model_too_large_for_the_cpu_is_refused() {
    let out = parsim().args(["execute"]).output().expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("host memory"));
}

#[test]
fn execute_reports_the_ring_steps_under_context_parallelism() {
    let out = parsim()
        .args([
            "execute",
            "--config",
            SMALL,
            "--cp",
            "2",
            "--cp-comm",
            "zigzag",
        ])
        .args(["--steps", "2", "--warmup", "1"])
        .output()
        .expect("runs");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two ring steps forward and backward, and zigzag's even causal work (max/min 1.00).
    for needle in ["forward step 1", "backward step 1", "max/min 1.00"] {
        assert!(s.contains(needle), "{needle}: {s}");
    }
}

/// A dense model has no experts to fold: an order with the pipeline between TP and the rest
/// (which Megatron-Core refuses for an MoE model whose expert grid would move the pipeline
/// groups) runs, with CP 2 and expert_tp left at its default.
#[test]
fn a_dense_model_runs_any_order() {
    let out = succeeded(parsim().args([
        "execute",
        "--config",
        SMALL,
        "--cp",
        "2",
        "--order",
        "tp-pp-cp-ep-dp",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
    ]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["world_size"], 8);
    // Rank 1's pipeline peer sits at stride tp = 2 under this order (1 and 3), not at the
    // last axis's stride 4 of the default order.
    let r1 = &v["ranks"][1];
    assert_eq!(r1["coords"]["pp"], 0, "{r1}");
    assert_eq!(v["ranks"][3]["coords"]["pp"], 1);
}

#[test]
fn execute_precision_bf16_runs_the_mixed_recipe_against_its_own_prediction() {
    let run = |precision: &str| -> Value {
        let out = succeeded(parsim().args([
            "execute",
            "--config",
            SMALL,
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
            "--precision",
            precision,
        ]));
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let (fp32, bf16) = (run("fp32"), run("bf16"));
    for r in bf16["ranks"].as_array().unwrap() {
        // The prediction follows the precision: bf16 weights (2 bytes per parameter, half
        // of fp32's), and the measurement is within 2% of it.
        let (peak, pred) = (
            r["peak_bytes"].as_u64().unwrap() as f64,
            r["predicted_peak_bytes"].as_u64().unwrap() as f64,
        );
        assert!((peak - pred).abs() / pred <= 0.02, "{peak} vs {pred}");
    }
    let w = |v: &Value| v["ranks"][0]["memory"]["weights"].as_u64().unwrap();
    assert_eq!(2 * w(&bf16), w(&fp32));
    let (l32, l16) = (
        fp32["loss"][0].as_f64().unwrap(),
        bf16["loss"][0].as_f64().unwrap(),
    );
    assert!(
        l16 != l32 && ((l16 - l32) / l32).abs() < 1e-2,
        "{l16} vs {l32}"
    );
}

/// The small model as a DeepSeek-style MoE: 8 experts of ffn 64 and a shared expert, the
/// first layer dense, on TP 2 + SP with expert-TP 2, EP 2, PP 2 (8 ranks).
fn moe_file() -> tempfile::NamedTempFile {
    let text = std::fs::read_to_string(SMALL).expect("fixture").replace(
        "[cluster]",
        "num_experts = 8\nmoe_router_topk = 2\nmoe_ffn_hidden_size = 64\n\
         moe_shared_expert_intermediate_size = 64\nmoe_first_k_dense = 1\n[cluster]",
    );
    let text = text.replace("[parallel]", "[parallel]\nep = 2\nexpert_tp = 2");
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

#[test]
fn execute_takes_the_moe_router_flags() {
    let f = moe_file();
    let path = f.path().to_str().unwrap();
    let router = [
        "--moe-router-score-function",
        "sigmoid",
        "--moe-router-renormalize",
        "true",
        "--moe-router-bias",
        "true",
        "--moe-router-num-groups",
        "4",
        "--moe-router-group-topk",
        "2",
    ];
    let out = succeeded(
        parsim()
            .args(["execute", "--config", path, "--steps", "2", "--warmup", "1"])
            .args(router)
            .arg("--json"),
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["world_size"], 8);
    let loss = v["loss"][0].as_f64().unwrap();
    // Near ln(128) at initialisation.
    assert!(loss > 4.0 && loss < 5.5, "{loss}");
    // The load-balancing loss with sigmoid scores is refused, naming the field.
    let out = parsim()
        .args(["execute", "--config", path, "--steps", "2", "--warmup", "1"])
        .args(router)
        .args(["--moe-aux-loss-coeff", "0.01"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.moe_aux_loss_coeff"), "{err}");
}

#[test]
fn execute_reports_the_measured_moe_load_and_its_imbalance() {
    let f = moe_file();
    let path = f.path().to_str().unwrap();
    let run = |json: bool| {
        let mut c = parsim();
        c.args(["execute", "--config", path, "--steps", "2", "--warmup", "1"]);
        if json {
            c.arg("--json");
        }
        let out = succeeded(&mut c);
        out.stdout
    };
    let v: Value = serde_json::from_slice(&run(true)).expect("json");
    let ranks = v["ranks"].as_array().unwrap();
    let (mut routed, mut received, mut dropped) = (0u64, 0u64, 0u64);
    let mut hottest = (0u64, 0.0f64);
    for r in ranks {
        let l = &r["moe_load"];
        let rows = expert_rows(r);
        // 8 experts over EP 2: 4 a rank.
        assert_eq!(rows.len(), 4);
        let (ro, re) = (l["routed"].as_u64().unwrap(), rows.iter().sum::<u64>());
        routed += ro;
        received += re;
        dropped += r["moe_dropped"].as_u64().unwrap();
        let load = re as f64 / ro as f64;
        if load > hottest.1 {
            hottest = (r["rank"].as_u64().unwrap(), load);
        }
    }
    // Every kept assignment is received once: the rows are conserved.
    assert_eq!(received, routed - dropped);
    // The imbalance from the hottest rank's load (docs/engine.md: a rank's load is
    // 1 + (imbalance - 1) / (E / ep)), at least the balanced router's 1.
    let m = &v["moe_load"];
    assert_eq!(m["hottest_rank"].as_u64().unwrap(), hottest.0);
    assert_eq!(m["hottest_rank_load"].as_f64().unwrap(), hottest.1);
    let imbalance = m["imbalance"].as_f64().unwrap();
    assert!(
        (imbalance - (1.0 + (hottest.1 - 1.0) * 4.0).max(1.0)).abs() < 1e-12,
        "{imbalance}"
    );
    assert!(m["hottest_expert_load"].as_f64().unwrap() >= hottest.1.min(1.0));
    // The text says it, and `estimate` takes it back.
    let text = String::from_utf8(run(false)).unwrap();
    let flag = format!("--moe-load-imbalance {imbalance:.3}");
    assert!(text.contains(&flag), "{text}");
    let out = succeeded(
        parsim()
            .args(["estimate", "--config", path, "--moe-load-imbalance"])
            .arg(format!("{imbalance:.3}"))
            .arg("--json"),
    );
    let e: Value = serde_json::from_slice(&out.stdout).expect("json");
    let got = e["config"]["model"]["moe_load_imbalance"].as_f64().unwrap();
    assert!((got - imbalance).abs() < 1e-3, "{got}");
}

#[test]
fn execute_reports_the_measured_dropped_fraction_with_a_capacity() {
    // Capacity factor 1.0 with the learned router at initialisation: it crowds a few experts,
    // whose capacity drops assignments a balanced router would keep.
    let f = moe_file();
    let path = f.path().to_str().unwrap();
    let cap = ["--moe-capacity-factor", "1"];
    let run = |json: bool, feed: &[String]| {
        let mut c = parsim();
        c.args(["execute", "--config", path, "--steps", "2", "--warmup", "1"])
            .args(cap)
            .args(feed);
        if json {
            c.arg("--json");
        }
        let out = succeeded(&mut c);
        out.stdout
    };
    let v: Value = serde_json::from_slice(&run(true, &[])).expect("json");
    let ranks = v["ranks"].as_array().unwrap();
    let sum = |f: &dyn Fn(&Value) -> u64| ranks.iter().map(f).sum::<u64>();
    let routed = sum(&|r| r["moe_load"]["assigned"].as_u64().unwrap());
    let dropped = sum(&|r| r["moe_dropped"].as_u64().unwrap());
    assert!(dropped > 0, "nothing dropped");
    // Each kept assignment is received once by its expert's rank and gathered over the
    // expert-TP group (tp 2 = expert-TP 2): the rows are conserved.
    let received = sum(&|r| expert_rows(r).iter().sum());
    assert_eq!(received, 2 * (routed - dropped));
    let m = &v["moe_load"];
    let fraction = m["dropped_fraction"].as_f64().unwrap();
    assert_eq!(fraction, dropped as f64 / routed as f64);
    // The imbalance is the kept share's: the hottest rank's load over 1 - dropped, through
    // 1 + (load - 1) x E / ep (8 experts over EP 2).
    let load = m["hottest_rank_load"].as_f64().unwrap() / (1.0 - fraction);
    let imbalance = m["imbalance"].as_f64().unwrap();
    assert!(
        (imbalance - (1.0 + (load - 1.0) * 4.0).max(1.0)).abs() < 1e-12,
        "{imbalance}"
    );
    // The text gives both flags, and `estimate` takes them back.
    let text = String::from_utf8(run(false, &[])).unwrap();
    let flag = format!("--moe-dropped-fraction {fraction:.4}");
    assert!(text.contains(&flag), "{text}");
    let feed = [
        "--moe-dropped-fraction".to_string(),
        format!("{fraction:.4}"),
        "--moe-load-imbalance".to_string(),
        format!("{imbalance:.3}"),
    ];
    let out = succeeded(
        parsim()
            .args(["estimate", "--config", path, "--json"])
            .args(cap)
            .args(&feed),
    );
    let e: Value = serde_json::from_slice(&out.stdout).expect("json");
    let got = e["config"]["model"]["moe_dropped_fraction"]
        .as_f64()
        .unwrap();
    assert!((got - fraction).abs() < 1e-4, "{got}");
    // Fed back, they predict the run (TP 2 + SP, PP 2, EP 2): the hottest rank of each stage
    // within 2%, the others at most 2% above (the prediction is the hottest rank's). The
    // balanced router's drops (none at 1.0) put every rank 3.9-4.4% below.
    let v: Value = serde_json::from_slice(&run(true, &feed)).expect("json");
    for stage in 0..2 {
        let ranks: Vec<&Value> = v["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["coords"]["pp"] == stage)
            .collect();
        let pct = |r: &Value| {
            let (m, p) = (
                r["peak_bytes"].as_f64().unwrap(),
                r["predicted_peak_bytes"].as_f64().unwrap(),
            );
            (m - p) / p * 100.0
        };
        let load = |r: &Value| {
            let rows: u64 = expert_rows(r).iter().sum();
            rows as f64 / r["moe_load"]["routed"].as_f64().unwrap()
        };
        let hot = ranks
            .iter()
            .max_by(|a, b| load(a).total_cmp(&load(b)))
            .unwrap();
        assert!(
            pct(hot).abs() <= 2.0,
            "stage {stage}: hottest {:+.2}%",
            pct(hot)
        );
        for r in &ranks {
            assert!(
                pct(r) <= 2.0,
                "stage {stage}: rank {} {:+.2}%",
                r["rank"],
                pct(r)
            );
        }
    }
}

#[test]
fn the_balanced_routers_load_is_one_with_or_without_expert_tp() {
    // Forced balancing (every expert takes n k / E rows) under TP 2 + SP with EP 2: with
    // expert-TP 2 each expert slice runs the rows of both TP ranks, with whole experts
    // (expert-TP 1) each rank's experts run its own shard's; either way every rank receives
    // exactly its uniform share (it was 0.5x with whole experts, its share counted as the
    // whole microbatch's).
    for etp in ["2", "1"] {
        let f = moe_file();
        let text = std::fs::read_to_string(f.path()).unwrap();
        let text = text.replace("expert_tp = 2", &format!("expert_tp = {etp}"));
        std::fs::write(f.path(), text).unwrap();
        let out = succeeded(
            parsim()
                .args(["execute", "--config", f.path().to_str().unwrap()])
                .args(["--steps", "1", "--warmup", "0", "--json"])
                .args(["--moe-router-force-load-balancing", "true"]),
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        for r in v["ranks"].as_array().unwrap() {
            let l = &r["moe_load"];
            let rows = expert_rows(r);
            let routed = l["routed"].as_u64().unwrap();
            // 4 local experts of 8, each a quarter of the rank's share.
            assert!(rows.iter().all(|&x| 4 * x == routed), "etp {etp}: {l}");
        }
        assert_eq!(v["moe_load"]["hottest_rank_load"], 1.0, "etp {etp}");
        assert_eq!(v["moe_load"]["imbalance"], 1.0, "etp {etp}");
    }
}

#[test]
fn profile_ops_reports_every_rank_and_a_summary_that_covers_the_step() {
    // The commands of docs/calibration.md, "Op timings".
    let out = succeeded(parsim().args(["execute", "--config", SMALL, "--profile-ops", "--json"]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    for r in v["ranks"].as_array().unwrap() {
        let ops: Vec<parsim_plan::op_timing::OpTiming> =
            serde_json::from_value(r["ops"].clone()).expect("op timings");
        assert!(ops.iter().all(|t| t.validate().is_ok()), "{ops:?}");
    }
    // The classes with the host gap are the actions' time, which is the step's but for the
    // events recorded between actions.
    let share: f64 = v["op_classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["share"].as_f64().unwrap())
        .sum();
    assert!(share > 0.8 && share <= 1.0 + 1e-6, "{share}");
    let out = succeeded(parsim().args(["execute", "--config", SMALL, "--profile-ops"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("op classes of rank"), "{text}");
    assert!(text.contains("FLOP/s"), "{text}");
}

#[test]
fn optimizer_precisions_the_executor_does_not_run_are_refused_by_field() {
    // The executor keeps fp32 master weights and fp32 moments: it refuses the others by name
    // before it adapts the precision to the backend.
    let cases: [(&[&str], &str); 2] = [
        (
            &[
                "--framework",
                "fsdp",
                "--no-master-weights",
                "--grad-dtype",
                "bf16",
            ],
            "training.master_weights",
        ),
        (
            &["--optimizer-state-dtype", "bf16"],
            "training.optimizer_state_dtype",
        ),
    ];
    for (flags, field) in cases {
        let out = parsim()
            .args(["execute", "--config", SMALL])
            .args(flags)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(err.contains(field) && err.contains("executor"), "{err}");
    }
}
