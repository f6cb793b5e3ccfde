//! `estimate --json` over varied configurations against outputs recorded before a change,
//! so a refactor that should change nothing shows every figure it did change.
//!
//! Each case's output lives in tests/golden/estimate/NAME.json. Numbers compare within a
//! relative 1e-9 (summation order may move the last bits), everything else exactly. To record
//! again after a deliberate change, run with `PARSIM_UPDATE_GOLDEN=1` and list every changed
//! figure, with its reason, in the commit.

use assert_cmd::cargo::cargo_bin_cmd;
use serde_json::Value;
use std::path::PathBuf;

/// (name, flags after `estimate`). Dense, GQA, MHA, MoE, MLA, every schedule, every CP
/// exchange, every ZeRO stage, LoRA, recompute and precision settings, several GPUs.
const CASES: &[(&str, &[&str])] = &[
    ("default", &[]),
    ("l8b_dp8_zero0", &["--tp", "1", "--zero", "0"]),
    ("l8b_zero2", &["--zero", "2"]),
    ("l8b_zero3", &["--zero", "3"]),
    (
        "l8b_zero3_no_param_overlap",
        &["--zero", "3", "--no-overlap-param-gather"],
    ),
    ("l8b_no_grad_overlap", &["--no-overlap-grad-reduce"]),
    ("l8b_tp_comm_overlap", &["--tp", "8", "--tp-comm-overlap"]),
    ("l8b_no_sp", &["--no-sp"]),
    ("l8b_recompute_none", &["--recompute", "none"]),
    ("l8b_recompute_full", &["--recompute", "full"]),
    ("l8b_fp8", &["--precision", "fp8"]),
    (
        "l8b_fp32",
        &["--precision", "fp32", "--gpus", "16", "--tp", "4"],
    ),
    ("l8b_fp16", &["--precision", "fp16"]),
    ("l8b_grad_bf16", &["--grad-dtype", "bf16"]),
    (
        "l8b_no_flash",
        &["--flash-attention", "false", "--seq", "4096"],
    ),
    ("l8b_flops_full", &["--flops-attention", "full"]),
    ("l8b_gelu", &["--activation", "gelu"]),
    ("l8b_mbs4", &["--mbs", "4", "--seq", "2048", "--gbs", "256"]),
    ("l8b_bucket", &["--ddp-bucket-size", "10000000"]),
    ("l8b_lora", &["--mode", "lora", "--lora-rank", "16"]),
    (
        "l8b_lora_zero3",
        &["--mode", "lora", "--lora-rank", "64", "--zero", "3"],
    ),
    ("l8b_a100", &["--gpu", "a100-80g"]),
    ("l8b_b200", &["--gpu", "b200"]),
    ("l8b_mi300x", &["--gpu", "mi300x"]),
    (
        "l8b_cp8_128k",
        &[
            "--gpus",
            "64",
            "--tp",
            "8",
            "--cp",
            "8",
            "--seq",
            "131072",
            "--gbs",
            "64",
            "--cp-comm",
            "zigzag",
        ],
    ),
    (
        "l2_7b_mha_tp4",
        &["--model", "llama2-7b", "--tp", "4", "--seq", "4096"],
    ),
    ("l2_70b_cp_p2p", &cp("p2p")),
    ("l2_70b_cp_zigzag", &cp("zigzag")),
    ("l2_70b_cp_allgather", &cp("allgather")),
    ("l2_70b_cp_a2a", &cp("a2a")),
    ("l70b_gpipe", &pipe("gpipe", "1")),
    ("l70b_1f1b", &pipe("1f1b", "1")),
    ("l70b_interleaved", &pipe("interleaved-1f1b", "5")),
    ("l70b_zb_h1", &pipe("zb-h1", "1")),
    ("l70b_zb_v", &pipe("zb-v", "2")),
    ("l70b_dualpipe_v", &pipe("dualpipe-v", "2")),
    (
        "l70b_uneven",
        &[
            "--model",
            "llama3-70b",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--pp",
            "4",
            "--first-stage-layers",
            "18",
            "--last-stage-layers",
            "18",
            "--gbs",
            "128",
        ],
    ),
    (
        "l70b_order",
        &[
            "--model",
            "llama3-70b",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--pp",
            "2",
            "--order",
            "tp-cp-ep-pp-dp",
            "--gbs",
            "128",
        ],
    ),
    (
        "l405b_16k",
        &[
            "--model",
            "llama3-405b",
            "--gpus",
            "16384",
            "--tp",
            "8",
            "--pp",
            "16",
            "--seq",
            "8192",
            "--gbs",
            "2048",
            "--first-stage-layers",
            "7",
            "--last-stage-layers",
            "7",
        ],
    ),
    (
        "gpt3_175b",
        &[
            "--model",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--tp",
            "8",
            "--pp",
            "8",
            "--seq",
            "2048",
            "--gbs",
            "1536",
        ],
    ),
    (
        "mixtral_ep8",
        &[
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "2",
            "--ep",
            "8",
            "--seq",
            "4096",
            "--gbs",
            "256",
        ],
    ),
    (
        "mixtral_etp",
        &[
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "4",
            "--ep",
            "4",
            "--expert-tp",
            "1",
            "--seq",
            "4096",
            "--gbs",
            "256",
            "--moe-load-imbalance",
            "1.5",
        ],
    ),
    (
        "mixtral_etp2",
        &[
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "2",
            "--ep",
            "8",
            "--expert-tp",
            "2",
            "--seq",
            "4096",
            "--gbs",
            "256",
        ],
    ),
    (
        "mixtral_zero3",
        &[
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "32",
            "--tp",
            "1",
            "--ep",
            "8",
            "--zero",
            "3",
            "--seq",
            "4096",
            "--gbs",
            "256",
        ],
    ),
    (
        "dsv3",
        &[
            "--model",
            "deepseek-v3",
            "--gpus",
            "2048",
            "--tp",
            "1",
            "--pp",
            "16",
            "--ep",
            "64",
            "--gbs",
            "4096",
            "--seq",
            "4096",
            "--recompute",
            "full",
            "--first-stage-layers",
            "3",
            "--last-stage-layers",
            "2",
        ],
    ),
    (
        "dsv3_mtp",
        &[
            "--model",
            "deepseek-v3",
            "--gpus",
            "2048",
            "--tp",
            "2",
            "--pp",
            "8",
            "--ep",
            "32",
            "--gbs",
            "4096",
            "--seq",
            "4096",
            "--mtp-layers",
            "1",
            "--first-stage-layers",
            "4",
            "--last-stage-layers",
            "3",
        ],
    ),
    (
        "hf_qwen2",
        &[
            "--model-config",
            "tests/fixtures/hf/qwen2-7b.json",
            "--gpus",
            "16",
            "--tp",
            "4",
        ],
    ),
    (
        "hf_gpt2",
        &[
            "--model-config",
            "tests/fixtures/hf/gpt2.json",
            "--gpus",
            "2",
            "--tp",
            "1",
            "--seq",
            "1024",
            "--gbs",
            "32",
        ],
    ),
];

const fn cp(kind: &'static str) -> [&'static str; 14] {
    [
        "--model",
        "llama2-70b",
        "--gpus",
        "128",
        "--tp",
        "2",
        "--cp",
        "4",
        "--seq",
        "32768",
        "--gbs",
        "64",
        "--cp-comm",
        kind,
    ]
}

const fn pipe(schedule: &'static str, vpp: &'static str) -> [&'static str; 16] {
    [
        "--model",
        "llama3-70b",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--vpp",
        vpp,
        "--schedule",
        schedule,
        "--gbs",
        "128",
        "--seq",
        "4096",
    ]
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/estimate")
}

/// Every place where `got` differs from `want`, as "path: want -> got".
fn diff(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => diff(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(format!("{path}.{k}: removed")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            let scale = x.abs().max(y.abs());
            if (x - y).abs() > 1e-9 * scale {
                out.push(format!("{path}: {x} -> {y}"));
            }
        }
        _ if want == got => {}
        _ => out.push(format!("{path}: {want} -> {got}")),
    }
}

#[test]
fn estimate_json_matches_recorded_outputs() {
    assert!(
        CASES.len() >= 40,
        "the issue asks for at least 40 configurations"
    );
    let update = std::env::var_os("PARSIM_UPDATE_GOLDEN").is_some();
    std::fs::create_dir_all(golden_dir()).unwrap();
    let mut failures = Vec::new();
    for (name, args) in CASES {
        let out = cargo_bin_cmd!("parsim")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .arg("estimate")
            .args(*args)
            .arg("--json")
            .output()
            .unwrap();
        // Exit status 3 is a configuration that does not fit: its JSON is still compared.
        if !matches!(out.status.code(), Some(0 | 3)) {
            failures.push(format!(
                "{name}: estimate {args:?} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        let file = golden_dir().join(format!("{name}.json"));
        if update {
            let text = serde_json::to_string_pretty(&got).unwrap();
            std::fs::write(&file, text + "\n").unwrap();
            continue;
        }
        let want: Value = serde_json::from_str(
            &std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{name}: no recorded output {}: {e}", file.display())),
        )
        .unwrap();
        let mut diffs = Vec::new();
        diff("", &want, &got, &mut diffs);
        if !diffs.is_empty() {
            failures.push(format!(
                "{name} ({} differences):\n  {}",
                diffs.len(),
                diffs.join("\n  ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "outputs changed:\n{}",
        failures.join("\n")
    );
}
