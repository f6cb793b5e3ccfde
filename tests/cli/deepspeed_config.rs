//! `--deepspeed-config` through the binary: a published DeepSpeed configuration estimates end to
//! end with its accepted keys named, the batch is derived at the merged data-parallel size,
//! flags override it, and a refusal exits 1 naming the JSON path.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

const DIR: &str = "tests/fixtures/deepspeed";

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// The JSON of a run that estimated: exit 0 (fits) or 3 (does not fit; these configurations
/// were written for other models and sequence lengths than the built-in example).
fn json_of(args: &[&str]) -> serde_json::Value {
    let out = parsim()
        .args(args)
        .assert()
        .code(predicate::in_iter([0, 3]))
        .get_output()
        .clone();
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn estimate_reads_a_published_config() {
    let file = format!("{DIR}/megatron_deepspeed_gpt_zero1_fp16.json");
    // 16 GPUs at tp 2: dp 8, so the micro batch DeepSpeed derives is 512 / (1 x 8) = 64.
    let out = parsim()
        .args([
            "estimate",
            "--deepspeed-config",
            &file,
            "--gpus",
            "16",
            "--json",
        ])
        .assert()
        .code(predicate::in_iter([0, 3]))
        .stderr(
            predicate::str::contains("train_micro_batch_size_per_gpu derived")
                .and(predicate::str::contains("gradient_clipping")),
        )
        .get_output()
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["config"];
    assert_eq!(c["training"]["framework"], "deepspeed");
    assert_eq!(c["training"]["precision"], "fp16");
    assert_eq!(c["parallel"]["zero"], 1);
    assert_eq!(c["training"]["micro_batch_size"], 64);
    assert_eq!(c["training"]["global_batch_size"], 512);
}

#[test]
fn flags_override_the_deepspeed_config() {
    let file = format!("{DIR}/zero3_every_knob.json");
    let v = json_of(&[
        "estimate",
        "--deepspeed-config",
        &file,
        "--precision",
        "fp16",
        "--json",
    ]);
    let c = &v["config"];
    assert_eq!(c["training"]["precision"], "fp16");
    assert_eq!(c["parallel"]["zero"], 3);
    assert_eq!(c["parallel"]["ddp_bucket_size"], 200_000_000u64);
    assert_eq!(c["parallel"]["zero3_max_live_parameters"], 600_000_000u64);
    // 2 x 8 x dp 4 (8 GPUs at the default tp 2).
    assert_eq!(c["training"]["global_batch_size"], 64);
}

#[test]
fn search_and_compare_take_a_deepspeed_config() {
    let file = format!("{DIR}/megatron_deepspeed_finetune_llama_zero0_bf16.json");
    parsim()
        .args(["search", "--deepspeed-config", &file, "--top", "2"])
        .assert()
        .code(predicate::in_iter([0, 3]));
    // One column per DeepSpeed configuration: ZeRO-0 against ZeRO-3 of the same model.
    let v = json_of(&[
        "compare",
        "--set",
        &format!("--deepspeed-config {file}"),
        "--set",
        &format!("--deepspeed-config {DIR}/zero3_every_knob.json"),
        "--json",
    ]);
    let zero: Vec<_> = v["estimates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["config"]["parallel"]["zero"].clone())
        .collect();
    assert_eq!(zero, [0, 3]);
}

#[test]
fn refusals_exit_1_naming_the_path() {
    for (name, says) in [
        (
            "refuse_offload_optimizer_nvme",
            "zero_optimization.offload_optimizer: optimizer offload to NVMe is not modelled",
        ),
        (
            "deepspeedexamples_imagenet_fp16_z1",
            "cuda_visible_devices: unknown key (not a key of DeepSpeed's configuration)",
        ),
        (
            "refuse_batch_identity",
            "train_batch_size: DeepSpeed's identity",
        ),
    ] {
        let file = format!("{DIR}/{name}.json");
        parsim()
            .args(["estimate", "--deepspeed-config", &file])
            .assert()
            .code(1)
            .stderr(predicate::str::contains(says));
    }
}
