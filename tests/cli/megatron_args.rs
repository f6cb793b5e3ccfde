//! `--megatron-args` and `estimate --print-megatron-args` through the binary: a Megatron-LM
//! launch script imports with its ignored flags named, and a printed launch reads back to the
//! same estimate.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

const SCRIPT: &str = "tests/fixtures/megatron/llama3_8b.sh";

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

fn stdout_of(args: &[&str]) -> String {
    let out = parsim().args(args).assert().success().get_output().clone();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn estimate_reads_a_launch_script_and_names_ignored_flags() {
    parsim()
        .args(["estimate", "--megatron-args", SCRIPT, "--json"])
        .assert()
        .success()
        .stderr(predicate::str::contains("ignored").and(predicate::str::contains("--lr,")))
        .stdout(predicate::str::contains("\"global_batch_size\": 128"));
}

#[test]
fn flags_override_the_launch_script() {
    let json = stdout_of(&["estimate", "--megatron-args", SCRIPT, "--tp", "4", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["config"]["parallel"]["tp"], 4);
    assert_eq!(v["config"]["training"]["precision"], "fp8");
}

#[test]
fn search_takes_a_launch_script() {
    parsim()
        .args(["search", "--megatron-args", SCRIPT, "--top", "2"])
        .assert()
        .success();
}

#[test]
fn printed_arguments_read_back_to_the_same_estimate() {
    let base = [
        "--model",
        "llama3-70b",
        "--gpus",
        "256",
        "--tp",
        "8",
        "--cp",
        "4",
        "--pp",
        "4",
        "--seq",
        "32768",
        "--gbs",
        "256",
        "--cp-comm",
        "zigzag",
    ];
    let mut print = vec!["estimate", "--print-megatron-args"];
    print.extend(base);
    let args = stdout_of(&print);
    assert!(args.contains("pretrain_gpt.py") && args.contains("--context-parallel-size 4"));
    let mut direct = vec!["estimate", "--json"];
    direct.extend(base);
    let expected: serde_json::Value = serde_json::from_str(&stdout_of(&direct)).unwrap();
    let out = parsim()
        .args(["estimate", "--megatron-args", "-", "--json"])
        .write_stdin(args)
        .assert()
        .success()
        .get_output()
        .clone();
    let mut got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    got["config"]["model"]["name"] = expected["config"]["model"]["name"].clone();
    assert_eq!(got, expected);
}

#[test]
fn an_unresolved_variable_is_reported() {
    parsim()
        .args(["estimate", "--megatron-args", "-"])
        .write_stdin("torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --bf16\n")
        .assert()
        // tp falls back to Megatron's 1, which does not fit: exit 3.
        .code(3)
        .stderr(predicate::str::contains("$TP"));
}

/// The MTP loss weight (DeepSeek-V3 sec. 2.2's lambda) goes out as Megatron's
/// `--mtp-loss-scaling-factor` and reads back; a launch that sets MTP without it gets
/// Megatron's default 0.1.
#[test]
fn the_mtp_loss_weight_round_trips() {
    let base = [
        "--model",
        "deepseek-v3",
        "--gpus",
        "256",
        "--gbs",
        "256",
        "--mtp-layers",
        "1",
    ];
    let mut print = vec!["estimate", "--print-megatron-args"];
    print.extend(base);
    print.extend(["--mtp-loss-scaling-factor", "0.3"]);
    let args = stdout_of(&print);
    assert!(
        args.contains("--mtp-num-layers 1") && args.contains("--mtp-loss-scaling-factor 0.3"),
        "{args}"
    );
    // DeepSeek-V3 does not fit 256 GPUs this way: exit 3, with the JSON printed.
    let read = |script: String| -> serde_json::Value {
        let out = parsim()
            .args(["estimate", "--megatron-args", "-", "--json"])
            .write_stdin(script)
            .assert()
            .code(predicate::in_iter([0, 3]))
            .get_output()
            .clone();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let got = read(args.clone());
    assert_eq!(got["config"]["model"]["mtp_num_layers"], 1);
    assert_eq!(got["config"]["model"]["mtp_loss_scaling_factor"], 0.3);
    let without = args.replace("--mtp-loss-scaling-factor 0.3", "");
    assert_eq!(
        read(without)["config"]["model"]["mtp_loss_scaling_factor"],
        0.1
    );
}

/// NVIDIA's own Llama-3-8B FP8 launch (examples/llama/train_llama3_8b_h100_fp8.sh, verbatim;
/// tests/fixtures/megatron/SOURCES.md) builds its arguments with `TRAINING_ARGS+=(...)` and an
/// `if [[ "$DTYPE" == "fp8" ]]` block: read as bash runs it, the run is ZeRO-1 (the distributed
/// optimizer) in FP8 with both overlaps, as the script's own lines say, and its
/// `--train-samples 1953125000` of 8192 tokens is the run's length. Before, the appends were
/// dropped: ZeRO-0 in bf16, "DOES NOT FIT: 160.69 GiB", no warning.
#[test]
fn nvidias_launch_script_is_read_with_its_appends_and_conditions() {
    let out = parsim()
        .args([
            "estimate",
            "--megatron-args",
            "tests/fixtures/megatron/train_llama3_8b_h100_fp8.sh",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["config"];
    assert_eq!(c["parallel"]["zero"], 1);
    assert_eq!(c["parallel"]["overlap_grad_reduce"], true);
    assert_eq!(c["parallel"]["overlap_param_gather"], true);
    assert_eq!(c["training"]["precision"], "fp8");
    assert_eq!(c["training"]["fp8_param_gather"], true);
    assert_eq!(c["model"]["vocab_size"], 128256);
    assert_eq!(
        v["run"]["tokens"].as_u64(),
        Some(1_953_125_000 * 8192),
        "--train-samples x --seq-length"
    );
    // The branch chosen on the script's own (absent) arguments is named, with its line.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 135:") && stderr.contains("argument 3"),
        "{stderr}"
    );
}

/// A minimal script built by appends, through stdin: `B+=( --use-distributed-optimizer )` is read.
#[test]
fn an_array_append_gives_the_distributed_optimizer() {
    let script = "A=(--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --seq-length 8192 --max-position-embeddings 8192 --swiglu --micro-batch-size 1 --global-batch-size 128 --bf16)\nB=(--tensor-model-parallel-size 1)\nB+=( --use-distributed-optimizer )\ntorchrun --nproc_per_node 8 pretrain_gpt.py ${A[@]} ${B[@]}\n";
    let out = parsim()
        .args(["estimate", "--megatron-args", "-", "--json"])
        .write_stdin(script)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["parallel"]["zero"], 1);
    // The vocabulary warning names a flag that exists: parsim's --vocab-size sets it.
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(stderr.contains("parsim's --vocab-size N"), "{stderr}");
    let out = parsim()
        .args([
            "estimate",
            "--megatron-args",
            "-",
            "--vocab-size",
            "128256",
            "--json",
        ])
        .write_stdin(script)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["model"]["vocab_size"], 128256);
}
