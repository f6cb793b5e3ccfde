//! CLI tests: every validation rule gives a clear error naming the field and the rule, a
//! nonzero exit, and no panic; the JSON output follows the output contract of docs/design.md.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;
use std::io::Write;

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// Runs `parsim estimate ARGS`, expects exit code 1 and every fragment in stderr.
fn rejects(args: &[&str], fragments: &[&str]) {
    let mut cmd = parsim();
    cmd.arg("estimate").args(args);
    let mut assert = cmd
        .assert()
        .code(1)
        .stderr(predicate::str::contains("panicked").not());
    for f in fragments {
        assert = assert.stderr(predicate::str::contains(*f));
    }
}

/// Exit status of `estimate` when the estimate does not fit at the pessimistic (p90) peak: the
/// estimate is still printed.
const DOES_NOT_FIT: i32 = 3;

/// Runs `parsim ARGS`, expects success (or an estimate that does not fit at p90, still
/// printed), and parses its stdout as JSON.
fn json_of(args: &[&str]) -> serde_json::Value {
    let out = parsim().args(args).output().unwrap();
    assert!(
        out.status.success() || out.status.code() == Some(DOES_NOT_FIT),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn temp_file(ext: &str, text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(ext).tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn world_size_must_divide() {
    rejects(
        &["--gpus", "12", "--tp", "8"],
        &[
            "cluster.num_gpus",
            "world size 12 must be divisible by tp x cp x pp",
        ],
    );
}

#[test]
fn given_dp_is_checked() {
    rejects(
        &["--dp", "3"],
        &[
            "parallel.dp",
            "dp = 3 but num_gpus / (tp x cp x pp) = 8 / 2 = 4",
        ],
    );
}

#[test]
fn heads_must_divide_by_tp() {
    rejects(
        &["--tp", "3", "--gpus", "3"],
        &[
            "parallel.tp",
            "num_attention_heads (32) must be divisible by tp (3)",
        ],
    );
}

#[test]
fn kv_heads_must_divide_by_tp() {
    rejects(
        &["--tp", "16", "--gpus", "16"],
        &[
            "parallel.tp",
            "num_query_groups (KV heads, 8) must be divisible by tp (16)",
        ],
    );
}

#[test]
fn ulysses_needs_heads_divisible_by_its_degree() {
    rejects(
        &[
            "--tp",
            "1",
            "--cp",
            "16",
            "--gpus",
            "16",
            "--cp-comm",
            "a2a",
            "--gbs",
            "16",
        ],
        &["parallel.cp", "Ulysses (cp_comm = a2a)", "KV heads (8)"],
    );
}

#[test]
fn layers_must_split_into_chunks() {
    rejects(
        &["--pp", "5", "--gpus", "10"],
        &[
            "model.num_layers",
            "32 layers do not split evenly into pp x vpp = 5 x 1",
            "first_stage_layers",
        ],
    );
    rejects(
        &[
            "--pp",
            "2",
            "--vpp",
            "3",
            "--gpus",
            "4",
            "--schedule",
            "interleaved-1f1b",
        ],
        &["model.num_layers", "pp x vpp = 2 x 3"],
    );
}

#[test]
fn uneven_first_and_last_stage_is_accepted() {
    // 32 = 2 + 4 x 7 + 2 over pp = 6 (Megatron's --decoder-first/last-pipeline-num-layers).
    parsim()
        .args([
            "estimate",
            "--pp",
            "6",
            "--gpus",
            "12",
            "--gbs",
            "60",
            "--first-stage-layers",
            "2",
            "--last-stage-layers",
            "2",
        ])
        .assert()
        .success();
    rejects(
        &[
            "--pp",
            "6",
            "--gpus",
            "12",
            "--gbs",
            "60",
            "--first-stage-layers",
            "3",
            "--last-stage-layers",
            "2",
        ],
        &["do not split evenly into 4 ranks"],
    );
}

#[test]
fn global_batch_must_divide() {
    rejects(
        &["--gbs", "30"],
        &[
            "training.global_batch_size",
            "micro_batch_size x dp = 1 x 4 = 4",
            "use 28 or 32",
        ],
    );
}

#[test]
fn interleaved_schedule_constraints() {
    rejects(
        &["--schedule", "interleaved-1f1b", "--vpp", "2"],
        &["parallel.schedule", "interleaved-1f1b needs pp >= 2"],
    );
    rejects(
        &[
            "--schedule",
            "interleaved-1f1b",
            "--pp",
            "2",
            "--gpus",
            "16",
        ],
        &["parallel.vpp", "needs vpp >= 2"],
    );
    rejects(
        &["--pp", "2", "--vpp", "2", "--gpus", "16"],
        &["parallel.vpp", "1f1b runs one model chunk per rank"],
    );
    rejects(
        &["--schedule", "zb-v", "--pp", "2", "--gpus", "16"],
        &["parallel.vpp", "zb-v places exactly 2 chunks"],
    );
}

#[test]
fn unknown_preset_and_gpu() {
    rejects(
        &["--model", "gpt5"],
        &["model.preset", "unknown value 'gpt5'", "llama3-70b"],
    );
    rejects(
        &["--gpu", "v100"],
        &["cluster.gpu", "unknown value 'v100'", "h100-sxm"],
    );
    rejects(
        &["--framework", "jax"],
        &["training.framework", "unknown value 'jax'", "deepspeed"],
    );
}

/// `--framework` applies the framework's defaults and the text output names the explicit
/// settings that override them (DeepSpeed's overlap_comm is off at ZeRO-1).
#[test]
fn framework_flag_and_its_overrides_are_shown() {
    parsim()
        .args(["estimate", "--framework", "deepspeed", "--overlap-grad-reduce"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "framework: deepspeed; parallel.overlap_grad_reduce = true (overrides deepspeed's default false)",
        ));
    parsim()
        .args(["estimate", "--framework", "nemo"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "framework: megatron-core (its defaults)",
        ));
}

#[test]
fn zero_and_nan_sizes() {
    rejects(&["--tp", "0"], &["parallel.tp", "must be at least 1"]);
    rejects(
        &["--seq", "0"],
        &["training.seq_length", "must be at least 1"],
    );
    rejects(
        &["--moe-load-imbalance", "0.5"],
        &["model.moe_load_imbalance", "finite number >= 1"],
    );
    // The dropped share is below 1, and only with a capacity (without one nothing drops).
    rejects(
        &["--moe-capacity-factor", "1", "--moe-dropped-fraction", "1"],
        &["model.moe_dropped_fraction", "must be in [0, 1)"],
    );
    rejects(
        &["--moe-dropped-fraction", "0.5"],
        &[
            "model.moe_dropped_fraction",
            "model.moe_capacity_factor > 0",
        ],
    );
    parsim()
        .args(["estimate", "--moe-load-imbalance", "NaN"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("must be a finite number"));
    let f = temp_file(".toml", "[model]\nhidden_size = -4096\n");
    rejects(
        &["-c", f.path().to_str().unwrap()],
        &["model.hidden_size", "invalid value: integer `-4096`"],
    );
    let f = temp_file(".toml", "[model]\nhidden_dropout = nan\n");
    rejects(
        &["-c", f.path().to_str().unwrap()],
        &["model.hidden_dropout", "must be a finite number, got NaN"],
    );
    // A negative number on the command line is rejected by the argument parser (exit 2).
    parsim().args(["estimate", "--seq", "-5"]).assert().code(2);
}

#[test]
fn unparsable_files_name_line_and_column() {
    let f = temp_file(".toml", "[parallel]\ntp = 2\npp = = 4\n");
    rejects(&["-c", f.path().to_str().unwrap()], &[":3:"]);
    let f = temp_file(".json", "{\n  \"parallel\": {\"tp\": 2,,}\n}\n");
    rejects(&["-c", f.path().to_str().unwrap()], &[":2:"]);
    let f = temp_file(".toml", "[parallel]\ntensor_parallel = 2\n");
    rejects(
        &["-c", f.path().to_str().unwrap()],
        &["parallel.tensor_parallel", "unknown field"],
    );
    rejects(
        &["-c", "/nonexistent/parsim.toml"],
        &["cannot read /nonexistent/parsim.toml"],
    );
}

#[test]
fn other_rules() {
    rejects(&["--zero", "4"], &["parallel.zero", "must be 0, 1, 2 or 3"]);
    rejects(
        &["--gpu", "a100-80g", "--precision", "fp8"],
        &["training.precision", "fp8 needs FP8 tensor cores"],
    );
    rejects(
        &["--ep", "2"],
        &["parallel.ep", "expert parallelism needs experts"],
    );
    rejects(
        &[
            "--model",
            "mixtral-8x7b",
            "--ep",
            "8",
            "--tp",
            "1",
            "--gpus",
            "4",
            "--gbs",
            "4",
        ],
        // Megatron-Core's expert grid: expert_tp x ep over the tp x cp x dp ranks of a stage.
        &[
            "parallel.expert_tp",
            "expert_tp x ep (1 x 8) must divide tp x cp x dp (4)",
        ],
    );
    rejects(
        &[
            "--model",
            "mixtral-8x7b",
            "--ep",
            "3",
            "--tp",
            "1",
            "--gpus",
            "6",
            "--gbs",
            "6",
        ],
        &["parallel.ep", "num_experts (8) must be divisible by ep (3)"],
    );
    rejects(
        &["--order", "tp-dp-pp"],
        &["parallel.order", "must name tp, cp, ep, dp and pp"],
    );
    rejects(
        &["--cp", "2", "--gpus", "16", "--flash-attention", "false"],
        &["training.flash_attention"],
    );
    rejects(
        &["--model", "gpt3-175b", "--seq", "4096", "--tp", "8"],
        &["training.seq_length", "max_position_embeddings (2048)"],
    );
    rejects(
        &["--model", "mixtral-8x7b", "--no-sp"],
        &[
            "parallel.sp",
            "MoE layers with tp > 1 need sequence parallelism",
        ],
    );
}

#[test]
fn all_violations_are_listed_at_once() {
    rejects(
        &["--tp", "3", "--gbs", "7", "--gpus", "9"],
        &["parallel.tp", "training.global_batch_size"],
    );
}

#[test]
fn sp_with_tp_one_is_turned_off_with_a_warning() {
    parsim()
        .args(["estimate", "--tp", "1", "--sp", "--json"])
        .assert()
        // Llama-3-8B unsharded at seq 8192 needs ~99 GiB: "does not fit" exits 3 (#18).
        .code(3)
        .stdout(predicate::str::contains("parallel.sp ignored"))
        .stdout(predicate::str::contains("\"sp\": false"));
}

#[test]
fn default_estimate_runs_and_fits() {
    parsim()
        .arg("estimate")
        .assert()
        .success()
        .stdout(predicate::str::contains("llama3-8b on 8 x h100-sxm"))
        .stdout(predicate::str::contains("FITS"));
}

#[test]
fn json_follows_the_contract() {
    let out = parsim().args(["estimate", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "config",
        "params",
        "flops",
        "memory",
        "communication",
        "schedule",
        "time",
        "throughput",
        "warnings",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in ["total", "embedding", "per_layer", "per_gpu_max"] {
        assert!(v["params"][key].is_u64(), "params.{key}");
    }
    for key in ["per_step_model", "per_step_hardware", "per_token_model"] {
        assert!(v["flops"][key].is_f64(), "flops.{key}");
    }
    assert!(v["memory"]["per_gpu_max_bytes"].is_u64());
    assert!(v["memory"]["capacity_bytes"].is_u64());
    assert!(v["memory"]["fits"].is_boolean());
    let stage = &v["memory"]["stages"][0];
    for key in [
        "stage",
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
        "total",
    ] {
        assert!(stage[key].is_u64(), "stages[0].{key}");
    }
    let sum: u64 = [
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
    ]
    .iter()
    .map(|k| stage[*k].as_u64().unwrap())
    .sum();
    // `total` is the worst moment: at most the sum of each category's own maximum, at least
    // the weights, gradients and optimizer states that live all the time.
    let total = stage["total"].as_u64().unwrap();
    let states: u64 = ["weights", "gradients", "optimizer"]
        .iter()
        .map(|k| stage[*k].as_u64().unwrap())
        .sum();
    assert!(
        states <= total && total <= sum,
        "{states} <= {total} <= {sum}"
    );
    for key in ["tp", "cp", "pp", "dp", "ep"] {
        assert!(
            v["communication"]["per_step_bytes_per_gpu"][key].is_u64(),
            "communication.{key}"
        );
    }
    assert!(v["schedule"]["bubble_fraction"].is_f64());
    assert!(v["schedule"]["peak_inflight_microbatches"].is_array());
    for key in [
        "step_s",
        "compute_s",
        "exposed_comm_s",
        "bubble_s",
        "optimizer_s",
    ] {
        assert!(v["time"][key].is_f64(), "time.{key}");
    }
    for key in ["tokens_per_s", "tflops_per_gpu", "mfu"] {
        assert!(v["throughput"][key].is_f64(), "throughput.{key}");
    }
    assert_eq!(v["config"]["parallel"]["dp"], 4);
}

#[test]
fn config_file_and_flags_layer() {
    // The file sets the model and TP; a flag overrides TP.
    let f = temp_file(
        ".toml",
        "[model]\npreset = \"llama3-70b\"\n[parallel]\ntp = 8\n[cluster]\nnum_gpus = 64\n",
    );
    let out = parsim()
        .args([
            "estimate",
            "--json",
            "-c",
            f.path().to_str().unwrap(),
            "--tp",
            "4",
        ])
        .output()
        .unwrap();
    // 70B at tp 4 on 64 GPUs needs ~156 GiB per GPU: "does not fit" exits 3 (#18).
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["model"]["name"], "llama3-70b");
    assert_eq!(v["config"]["parallel"]["tp"], 4);
    assert_eq!(v["config"]["parallel"]["dp"], 16);
    assert_eq!(v["params"]["total"], 70_553_706_496u64);
}

#[test]
fn layout_prints_megatron_cp_groups() {
    // Megatron-LM context-parallel docs: TP 8, CP 2 on 16 GPUs.
    parsim()
        .args([
            "layout", "--tp", "8", "--cp", "2", "--gpus", "16", "--gbs", "1", "--all",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("tp groups: 2 of size 8"))
        .stdout(predicate::str::contains("[0..7]"))
        .stdout(predicate::str::contains("[8..15]"))
        .stdout(predicate::str::contains("[7, 15]"))
        .stdout(predicate::str::contains(
            "cp groups: 8 of size 2, 8 cross nodes",
        ));
}

#[test]
fn layout_rank_out_of_range_is_an_error() {
    parsim()
        .args(["layout", "--rank", "99"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--rank 99 is out of range"));
}

/// MoE Parallel Folding in `parsim layout` (Megatron-Core's expert rank generator, worked by
/// hand): Mixtral on 16 GPUs, tp 2, ep 4, expert_tp 1 (the default): the expert grid is
/// expert_tp 1 x ep 4 x expert dp 4, so rank 5's EP group is ranks 4..7 (stride 1, one node;
/// the dense grid's ep axis would give 1, 3, 5, 7 at stride tp = 2) and its expert-DP group
/// 1, 5, 9, 13 (stride 4, two nodes).
#[test]
fn layout_prints_folded_expert_groups() {
    parsim()
        .args([
            "layout",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--ep",
            "4",
            "--gbs",
            "8",
            "--rank",
            "5",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "expert_tp 1 x ep 4 x expert dp 4 over tp x cp x dp",
        ))
        .stdout(predicate::str::contains(
            "rank 5 on the expert grid: expert_tp 0 ep 1 expert dp 1",
        ))
        .stdout(predicate::str::is_match(r"ep +\[4\.\.7\] +no").unwrap())
        .stdout(predicate::str::is_match(r"expert_dp +\[1, 5, 9, 13\] +yes").unwrap());
}

/// Megatron-Core asserts the expert grid keeps the pipeline groups: pp between tp and the rest
/// of the order with expert_tp 1 under tp 2 does not, and the configuration is refused naming
/// the field.
#[test]
fn an_order_that_moves_the_expert_pipeline_is_refused() {
    parsim()
        .args([
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "2",
            "--expert-tp",
            "1",
            "--order",
            "tp-pp-cp-ep-dp",
            "--gbs",
            "8",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("parallel.order"))
        .stderr(predicate::str::contains("pipeline groups"));
}

#[test]
fn search_json_has_the_contract_keys() {
    let v = json_of(&[
        "search",
        "--model",
        "llama2-7b",
        "--gpus",
        "8",
        "--seq",
        "2048",
        "--gbs",
        "32",
        "--mbs-max",
        "1",
        "--top",
        "3",
        "--constraint",
        "pp<=2",
        "--json",
    ]);
    for key in ["candidates", "pruned", "evaluated", "elapsed_s", "top"] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let top = v["top"].as_array().unwrap();
    assert!(!top.is_empty() && top.len() <= 3);
    for t in top {
        assert!(t["memory"]["fits"].as_bool().unwrap());
        assert!(t["config"]["parallel"]["pp"].as_u64().unwrap() <= 2);
        assert!(t["time"]["step_s"].is_f64());
    }
}

#[test]
fn search_rejects_a_bad_constraint() {
    parsim()
        .args([
            "search",
            "--model",
            "llama2-7b",
            "--gpus",
            "8",
            "--constraint",
            "tensor<=2",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--constraint 'tensor<=2'"))
        .stderr(predicate::str::contains("KNOB OP VALUE"));
}

#[test]
fn schedule_takes_durations_from_a_configuration() {
    let f = temp_file(".toml", "[model]\npreset = \"llama3-70b\"\n[cluster]\nnum_gpus = 64\n[parallel]\ntp = 8\npp = 4\nvpp = 5\nschedule = \"interleaved-1f1b\"\n[training]\nglobal_batch_size = 64\n");
    let v = json_of(&["schedule", "--json", "--config", f.path().to_str().unwrap()]);
    assert_eq!(v["pp"], 4);
    assert_eq!(v["vpp"], 5);
    assert_eq!(v["microbatches"], 32);
    // Interleaved with uneven end stages: close to (p-1)/(v m) = 3/160 of ideal compute.
    let bubble = v["bubble_fraction"].as_f64().unwrap();
    assert!(bubble > 0.0 && bubble < 0.05, "{bubble}");
    // The same run through estimate reports the same bubble.
    let est = parsim()
        .args(["estimate", "--json", "-c", f.path().to_str().unwrap()])
        .output()
        .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&est.stdout).unwrap();
    assert!((e["schedule"]["bubble_fraction"].as_f64().unwrap() - bubble).abs() < 1e-9);
}

#[test]
fn pipeline_layout_flags_are_checked_and_applied() {
    // Llama-3-8B (32 layers) on pp 4: a layout missing a layer, and one with a stray letter.
    rejects(
        &[
            "--pp",
            "4",
            "--gpus",
            "8",
            "--pipeline-layout",
            "Et*9|t*9|t*9|t*4L",
        ],
        &["parallel.pipeline_layout", "holds 31 transformer layers"],
    );
    rejects(
        &[
            "--pp",
            "4",
            "--gpus",
            "8",
            "--pipeline-layout",
            "Et*8|t*8|t*8|t*8Q",
        ],
        &["parallel.pipeline_layout", "unknown letter 'Q'"],
    );
    // 32 layers + the loss slot = 33 do not split over pp 4; with pp 3 they do (11 each).
    rejects(
        &[
            "--pp",
            "4",
            "--gpus",
            "8",
            "--account-for-loss-in-pipeline-split",
        ],
        &["model.num_layers", "33 slots"],
    );
    // The loss slot places 11 + 11 + 10 layers: the same memory, stage by stage, as the
    // explicit layout that says so.
    let json = |extra: &[&str]| -> serde_json::Value {
        let out = parsim()
            .args([
                "estimate", "--pp", "3", "--tp", "2", "--gpus", "6", "--gbs", "12", "--json",
            ])
            .args(extra)
            .assert()
            .code(predicate::in_iter([0, 3]))
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice(&out).unwrap()
    };
    let slot = json(&["--account-for-loss-in-pipeline-split"]);
    let layout = json(&["--pipeline-layout", "Et*11|t*11|t*10L"]);
    assert_eq!(
        slot["config"]["parallel"]["account_for_loss_in_pipeline_split"],
        true
    );
    assert_eq!(slot["memory"]["stages"], layout["memory"]["stages"]);
    assert_eq!(slot["time"]["step_s"], layout["time"]["step_s"]);
    assert_eq!(slot["memory"]["stages"].as_array().unwrap().len(), 3);
}

#[test]
fn moe_router_flags_set_their_fields_and_bad_values_are_refused() {
    // Every MoE router flag lands in the resolved configuration (`--json`'s `config`).
    let out = parsim()
        .args([
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--ep",
            "8",
            "--moe-capacity-factor",
            "1.25",
            "--moe-aux-loss-coeff",
            "0.02",
            "--moe-router-topk",
            "4",
            "--moe-router-score-function",
            "sigmoid",
            "--moe-router-renormalize",
            "true",
            "--moe-router-bias",
            "true",
            "--moe-router-bias-update-rate",
            "0.005",
            "--moe-router-num-groups",
            "4",
            "--moe-router-group-topk",
            "2",
            "--moe-router-force-load-balancing",
            "true",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let m = &v["config"]["model"];
    assert_eq!(m["moe_capacity_factor"], 1.25);
    assert_eq!(m["moe_aux_loss_coeff"], 0.02);
    assert_eq!(m["moe_router_topk"], 4);
    assert_eq!(m["moe_router_score_function"], "sigmoid");
    assert_eq!(m["moe_router_renormalize"], true);
    assert_eq!(m["moe_router_bias"], true);
    assert_eq!(m["moe_router_bias_update_rate"], 0.005);
    assert_eq!(m["moe_router_num_groups"], 4);
    assert_eq!(m["moe_router_group_topk"], 2);
    assert_eq!(m["moe_router_force_load_balancing"], true);
    // Forced balancing leaves no load imbalance to predict.
    rejects(
        &[
            "--model",
            "mixtral-8x7b",
            "--moe-router-force-load-balancing",
            "true",
            "--moe-load-imbalance",
            "1.5",
        ],
        &[
            "model.moe_load_imbalance",
            "moe_router_force_load_balancing",
        ],
    );
    // 8 experts do not split into 3 groups; a group top-k without groups.
    rejects(
        &[
            "--model",
            "mixtral-8x7b",
            "--moe-router-num-groups",
            "3",
            "--moe-router-group-topk",
            "1",
        ],
        &["model.moe_router_num_groups", "must divide num_experts (8)"],
    );
    rejects(
        &["--model", "mixtral-8x7b", "--moe-router-group-topk", "2"],
        &[
            "model.moe_router_group_topk",
            "model.moe_router_num_groups is 0",
        ],
    );
    rejects(
        &[
            "--model",
            "mixtral-8x7b",
            "--moe-router-bias-update-rate=-1",
        ],
        &["model.moe_router_bias_update_rate", "finite number >= 0"],
    );
    rejects(
        &["--mtp-layers", "1", "--mtp-loss-scaling-factor=-0.1"],
        &["model.mtp_loss_scaling_factor", "finite number >= 0"],
    );
    parsim()
        .args(["estimate", "--moe-router-score-function", "relu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("softmax, sigmoid"));
    // On a dense model the flags are named as ignored.
    parsim()
        .args([
            "estimate",
            "--moe-router-topk",
            "2",
            "--moe-capacity-factor",
            "1",
        ])
        .assert()
        .success()
        .stderr(predicate::str::contains("--moe-router-topk ignored"))
        .stderr(predicate::str::contains("--moe-capacity-factor ignored"));
}

/// `--mtp-loss-scaling-factor` sets DeepSeek-V3's lambda (default 0.1, Megatron's), and is
/// named as ignored on a model without MTP modules.
#[test]
fn mtp_loss_scaling_factor_is_set_and_named_when_unused() {
    let model_of = |args: &[&str]| {
        let out = parsim()
            .args(["estimate", "--json"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success() || out.status.code() == Some(DOES_NOT_FIT),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["config"]["model"].clone()
    };
    assert_eq!(model_of(&[])["mtp_loss_scaling_factor"], 0.1);
    let m = model_of(&["--mtp-layers", "2", "--mtp-loss-scaling-factor", "0.3"]);
    assert_eq!(m["mtp_num_layers"], 2);
    assert_eq!(m["mtp_loss_scaling_factor"], 0.3);
    parsim()
        .args(["estimate", "--mtp-loss-scaling-factor", "0.3"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "--mtp-loss-scaling-factor ignored: model.mtp_num_layers is 0",
        ));
}

/// A bad NIC count in the cluster description is an error naming the field, exit 1; a
/// good one with fewer NICs makes the data-parallel tail no shorter.
#[test]
fn cluster_nics_per_node_is_checked_and_used() {
    let bad = temp_file(
        ".toml",
        "[cluster]\nnum_gpus = 32\nnics_per_node = 0\n[parallel]\ntp = 8\n",
    );
    parsim()
        .args(["estimate", "--config", bad.path().to_str().unwrap()])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cluster.nics_per_node"));
    let step = |nics: u32| {
        let f = temp_file(
            ".toml",
            &format!("[cluster]\nnum_gpus = 32\nnics_per_node = {nics}\n[parallel]\ntp = 8\n"),
        );
        let v = json_of(&["estimate", "--json", "--config", f.path().to_str().unwrap()]);
        v["time"]["step_s"].as_f64().expect("time.step_s")
    };
    assert!(
        step(1) > step(8),
        "one NIC per node must slow the DP all-reduce"
    );
}

/// Issue 33: a residual file that does not parse, names an unknown regime key, or gives a
/// percentile outside (0, 1) is refused by field; a good one (the shipped file itself) is
/// taken and its interval printed; `--rank-by` takes step or p90 only.
#[test]
fn residual_files_and_rank_by_are_checked() {
    let not_json = temp_file(".json", "{ residuals: ");
    rejects(
        &["--residuals", not_json.path().to_str().unwrap()],
        &["not valid JSON"],
    );
    let shipped = std::fs::read_to_string("calibration/residuals.json").unwrap();
    let bad_key = temp_file(
        ".json",
        &shipped.replacen("\"gpu_family\":", "\"gpu_famly\":", 1),
    );
    rejects(
        &["--residuals", bad_key.path().to_str().unwrap()],
        &["residuals[0].regime.gpu_famly", "unknown regime key"],
    );
    let bad_percentile = temp_file(
        ".json",
        &shipped.replacen("\"upper_percentile\": 0.9", "\"upper_percentile\": 1.5", 1),
    );
    rejects(
        &["--residuals", bad_percentile.path().to_str().unwrap()],
        &["upper_percentile", "outside (0, 1)"],
    );
    parsim()
        .args(["estimate", "--residuals", "calibration/residuals.json"])
        .assert()
        .success()
        .stdout(predicate::str::contains("interval p10-p90"));
    parsim()
        .args(["search", "--rank-by", "p95"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--rank-by p95: expected step"));
    parsim()
        .args(["search", "--rank-by", "p90", "--gpus", "8..16"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("one GPU count"));
}

/// Issue 33: `--attention-kernel` takes a software release as well as a kernel: a release
/// with published rates times the core exactly as its kernel does; one whose cuDNN has none
/// is refused naming the field, the cuDNN version and why.
#[test]
fn attention_kernel_takes_a_release() {
    let step = |kernel: &str| -> f64 {
        let v = json_of(&[
            "estimate",
            "--cp",
            "4",
            "--cp-comm",
            "zigzag",
            "--seq",
            "65536",
            "--gbs",
            "8",
            "--gpus",
            "32",
            "--json",
            "--attention-kernel",
            kernel,
        ]);
        v["time"]["step_s"].as_f64().unwrap()
    };
    assert_eq!(step("cudnn-9.4.0"), step("cudnn-9.4"));
    assert_ne!(step("cudnn-9.4"), step("flash-attention-3"));
    rejects(
        &["--attention-kernel", "ngc-pytorch-25.04"],
        &["training.attention_kernel", "cuDNN 9.9.0", "not published"],
    );
}

/// `compare` of three flag sets: lettered columns listed above a table no wider than 130
/// characters (the flag strings were its headers, and the mix one long cell: about 230 wide
/// here, 370 with three such flag sets before), the mix one setting a row,
/// and a warning every column shares printed once, one only some share naming them.
#[test]
fn compare_is_narrow_and_names_each_warning_once() {
    let out = parsim()
        .args([
            "compare",
            "--base",
            "--model llama3-70b --gpus 64 --seq 8192 --gbs 128 --recompute full --lora-rank 8",
            "--set",
            "--tp 4 --pp 4",
            "--set",
            "--tp 8 --pp 2",
            "--set",
            "--tp 2 --cp 4 --cp-comm a2a --pp 8 --moe-router-topk 2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let widest = text
        .lines()
        .filter(|l| l.starts_with(['│', '┌', '└', '╞']))
        .map(|l| l.chars().count())
        .max()
        .unwrap();
    assert!(widest <= 130, "{widest} wide:\n{text}");
    assert!(text.contains("  A  --tp 4 --pp 4") && text.contains("  C  --tp 2 --cp 4"));
    assert!(text.contains("mix: pp x vpp"), "{text}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.matches("--lora-rank ignored").count(), 1, "{stderr}");
    assert!(
        stderr.contains("warning: --lora-rank ignored"),
        "shared by all columns: {stderr}"
    );
    assert!(
        stderr.contains("warning (C): --moe-router-topk ignored"),
        "one column's: {stderr}"
    );
}

/// A MoE model that does not fit is told to raise EP (the experts shard over it); a dense one
/// is not.
#[test]
fn a_moe_model_that_does_not_fit_is_told_to_raise_ep() {
    let verdict = |args: &[&str]| -> String {
        let out = parsim()
            .arg("estimate")
            .args(args)
            .arg("--json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "does not fit");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["verdict"].as_str().unwrap().to_string()
    };
    let moe = verdict(&[
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "8",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "1",
        "--seq",
        "4096",
        "--gbs",
        "64",
    ]);
    assert!(moe.contains("raise EP"), "{moe}");
    let dense = verdict(&[
        "--model",
        "llama3-70b",
        "--gpus",
        "8",
        "--tp",
        "1",
        "--pp",
        "1",
        "--seq",
        "4096",
        "--gbs",
        "64",
    ]);
    assert!(!dense.contains("EP"), "{dense}");
}

/// The best MFU of the published H100 runs in calibration/data/published-throughput.json, read
/// here from the rows themselves: TFLOP/s per GPU over the H100 SXM datasheet's dense peak
/// (989.4 TF bf16, 1978.9 TF fp8).
fn best_published_h100_mfu() -> f64 {
    let text = std::fs::read_to_string("calibration/data/published-throughput.json").unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut best: f64 = 0.0;
    for t in doc["tables"].as_array().unwrap() {
        for r in t["rows"].as_array().unwrap() {
            let gpu = r["gpu"].as_str().unwrap_or("").to_ascii_lowercase();
            if !gpu.contains("h100") {
                continue;
            }
            let tflops = r["tflops_per_gpu"]
                .as_f64()
                .or(r["model_tflops_per_gpu"].as_f64())
                .unwrap_or(0.0);
            let fp8 = r["precision"].as_str().unwrap_or("").contains("fp8");
            best = best.max(tflops / if fp8 { 1978.9 } else { 989.4 });
        }
    }
    best
}

/// An estimate says plainly what its interval rests on: a regime without measured steps of
/// its own (counted here in calibration/residuals.json), and a fast end above every published
/// run on the GPU (Llama-3-70B's p90 MFU on H100 reached about 70%; no run in the data does).
#[test]
fn the_interval_says_what_it_rests_on() {
    let args = [
        "estimate",
        "--model",
        "llama3-70b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--cp",
        "4",
        "--cp-comm",
        "a2a",
        "--pp",
        "8",
        "--vpp",
        "10",
        "--schedule",
        "interleaved-1f1b",
        "--recompute",
        "none",
        "--seq",
        "8192",
        "--gbs",
        "128",
    ];
    let json = parsim().args(args).arg("--json").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let text = String::from_utf8(parsim().args(args).output().unwrap().stdout).unwrap();
    let regime = &v["step_interval"]["regime"];
    let residuals: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("calibration/residuals.json").unwrap())
            .unwrap();
    let own = residuals["residuals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| &r["regime"] == regime)
        .count();
    let pooled = !v["step_interval"]["pooled_over"]
        .as_array()
        .unwrap()
        .is_empty();
    assert!(pooled, "the case's regime is pooled");
    let said = if own == 0 {
        "holds no measured step of its own".to_string()
    } else {
        format!("holds only {own} measured step(s) of its own")
    };
    assert!(text.contains(&said), "{said}:\n{text}");
    let fast = v["throughput"]["mfu_p90"].as_f64().unwrap();
    let best = best_published_h100_mfu();
    assert!(fast > best, "{fast} vs {best}");
    assert!(
        text.contains("is above every published run on h100-sxm")
            && text.contains(&format!("best {:.1}%", 100.0 * best)),
        "{text}"
    );
}

#[test]
fn optimizer_precision_flags_are_checked_against_the_framework() {
    // Master weights off keeps bf16 gradients, and Megatron-Core has no such mode.
    rejects(
        &["--no-master-weights"],
        &[
            "training.master_weights",
            "grad_dtype",
            "--main-params-dtype",
        ],
    );
    // bitsandbytes' int8 states are not among Megatron's --exp-avg-dtype choices.
    rejects(
        &["--optimizer-state-dtype", "int8"],
        &["training.optimizer_state_dtype", "--exp-avg-dtype"],
    );
    let bad = temp_file(".toml", "[training]\noptimizer_state_dtype = \"fp4\"\n");
    rejects(
        &["--config", bad.path().to_str().unwrap()],
        &["optimizer_state_dtype", "fp4"],
    );
    // The flags reach the resolved configuration, and pure bf16 defaults to bf16 moments
    // (the field stays absent: its default).
    let v = json_of(&[
        "estimate",
        "--framework",
        "fsdp",
        "--no-master-weights",
        "--grad-dtype",
        "bf16",
        "--json",
    ]);
    assert_eq!(v["config"]["training"]["master_weights"], false);
    let v = json_of(&["estimate", "--optimizer-state-dtype", "fp8", "--json"]);
    assert_eq!(v["config"]["training"]["optimizer_state_dtype"], "fp8");
}
