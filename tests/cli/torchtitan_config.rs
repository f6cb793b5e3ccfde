//! `--torchtitan-config` and `--torchtitan-override` (`--tt`) through the binary: torchtitan's
//! published job files estimate end to end, overrides beat the file, parsim's flags beat both,
//! and a refusal names its TOML path with exit status 1.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

const DIR: &str = "tests/fixtures/torchtitan";

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// `estimate --json` of `args`; exit 0 (fits) or 3 (does not fit) are both an estimate.
fn estimate_json(args: &[&str]) -> serde_json::Value {
    let out = parsim()
        .arg("estimate")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The published 70B (A100, 64 GPUs) and 405B (H100, 128 GPUs) files estimate end to end:
/// the resolved configuration carries the file's degrees and the figures are finite.
#[test]
fn published_job_files_estimate_end_to_end() {
    for (file, gpus, gpu, dp, precision) in [
        ("llama3_70b.toml", "64", "a100-80g", 8, "bf16"),
        ("llama3_405b.toml", "128", "h100-sxm", 16, "fp8"),
    ] {
        let path = format!("{DIR}/{file}");
        let v = estimate_json(&["--torchtitan-config", &path, "--gpus", gpus, "--gpu", gpu]);
        let c = &v["config"];
        assert_eq!(c["training"]["framework"], "fsdp", "{file}");
        assert_eq!(c["parallel"]["tp"], 8, "{file}");
        assert_eq!(c["parallel"]["dp"], dp, "{file}");
        assert_eq!(c["parallel"]["fsdp"], "torch", "{file}");
        assert_eq!(c["training"]["precision"], precision, "{file}");
        assert_eq!(c["training"]["recompute"], "full", "{file}");
        let step = v["time"]["step_s"].as_f64().unwrap();
        assert!(step.is_finite() && step > 0.0, "{file}: {step}");
        assert!(v["memory"]["per_gpu_max_bytes"].as_u64().unwrap() > 0);
    }
}

/// Overrides apply over the file in order, and parsim's own flags over both.
#[test]
fn overrides_beat_the_file_and_flags_beat_overrides() {
    let path = format!("{DIR}/llama3_70b.toml");
    let v = estimate_json(&[
        "--torchtitan-config",
        &path,
        "--gpus",
        "64",
        "--tt",
        "parallelism.tensor_parallel_degree=4",
        "--torchtitan-override",
        "training.seq_len=4096",
    ]);
    assert_eq!(v["config"]["parallel"]["tp"], 4);
    assert_eq!(v["config"]["parallel"]["dp"], 16);
    assert_eq!(v["config"]["training"]["seq_length"], 4096);
    let v = estimate_json(&[
        "--torchtitan-config",
        &path,
        "--gpus",
        "64",
        "--tt",
        "training.seq_len=4096",
        "--seq",
        "2048",
    ]);
    assert_eq!(v["config"]["training"]["seq_length"], 2048);
}

/// Checkpointing every second layer is refused by path, exit 1; the published 8B file's
/// per-op selective checkpointing estimates (recompute module per_op), as does its mode
/// overridden.
#[test]
fn refusal_names_the_path_and_exits_1() {
    let path = format!("{DIR}/llama3_8b.toml");
    parsim()
        .args([
            "estimate",
            "--torchtitan-config",
            &format!("{DIR}/layer_sac.toml"),
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "activation_checkpoint.selective_ac_option = \"2\": not modelled",
        ));
    let v = estimate_json(&["--torchtitan-config", &path]);
    assert_eq!(v["config"]["training"]["recompute_modules"][0], "per_op");
    parsim()
        .args([
            "estimate",
            "--torchtitan-config",
            &path,
            "--tt",
            "bogus.field=1",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unknown field bogus.field"));
    let v = estimate_json(&[
        "--torchtitan-config",
        &path,
        "--tt",
        "activation_checkpoint.mode=full",
    ]);
    assert_eq!(v["config"]["model"]["num_layers"], 32);
}
