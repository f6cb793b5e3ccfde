//! `estimate --json` over varied configurations against outputs recorded before a change,
//! so a refactor that should change nothing shows every figure it did change.
//!
//! Each case's output lives in tests/golden/estimate/NAME.json. Numbers compare within a
//! relative 1e-9 (summation order may move the last bits), everything else exactly. To record
//! again after a deliberate change, run
//! `PARSIM_UPDATE_GOLDEN=1 cargo test --test engine estimate_golden -- --nocapture`: it prints every
//! changed field (path, old, new, relative change), by field across cases and then per case,
//! and writes the same to `target/tmp/estimate-golden-changes.txt`; that summary goes in the
//! commit message, with the reason for each change.
//!
//! Whether recording or comparing, each case's headline figures must equal what the test
//! derives by hand from the case's configuration (tests/engine/golden_headline.rs): the parameter count,
//! the model FLOPs per token and, for dense models, the model-state bytes of the most loaded
//! GPU; a re-recording cannot move them silently.

use assert_cmd::cargo::cargo_bin_cmd;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::golden_headline;

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

/// One changed field: its path, the recorded value and the new one.
struct Change {
    path: String,
    old: Value,
    new: Value,
}

impl Change {
    /// New over old minus one, for numbers with a nonzero old value.
    fn relative(&self) -> Option<f64> {
        let (a, b) = (self.old.as_f64()?, self.new.as_f64()?);
        (a != 0.0).then(|| b / a - 1.0)
    }

    fn line(&self) -> String {
        let rel = self
            .relative()
            .map_or(String::new(), |r| format!(" ({:+.3}%)", 100.0 * r));
        format!("{}: {} -> {}{rel}", self.path, self.old, self.new)
    }

    /// The path with array indices folded, so one field of every stage or rank groups.
    fn field(&self) -> String {
        let mut out = String::new();
        let mut in_index = false;
        for ch in self.path.chars() {
            match ch {
                '[' => {
                    in_index = true;
                    out.push_str("[*]");
                }
                ']' => in_index = false,
                _ if !in_index => out.push(ch),
                _ => {}
            }
        }
        out
    }
}

/// Every place where `got` differs from `want`.
fn diff(path: &str, want: &Value, got: &Value, out: &mut Vec<Change>) {
    let mut change = |path: String| {
        out.push(Change {
            path,
            old: want.clone(),
            new: got.clone(),
        })
    };
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => diff(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(Change {
                        path: format!("{path}.{k}"),
                        old: va.clone(),
                        new: Value::Null,
                    }),
                }
            }
            for (k, vb) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
                out.push(Change {
                    path: format!("{path}.{k}"),
                    old: Value::Null,
                    new: vb.clone(),
                });
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
                change(path.to_string());
            }
        }
        _ if want == got => {}
        _ => change(path.to_string()),
    }
}

/// The change summary of a re-recording: per field across cases (how many changed, the
/// range of relative changes), then every change per case.
fn change_summary(changes: &[(&str, Vec<Change>)]) -> String {
    let changed: Vec<_> = changes.iter().filter(|(_, c)| !c.is_empty()).collect();
    let mut s = format!(
        "estimate goldens re-recorded: {} of {} cases changed, {} fields\n",
        changed.len(),
        changes.len(),
        changed.iter().map(|(_, c)| c.len()).sum::<usize>()
    );
    let mut fields: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    for (_, cs) in &changed {
        for c in cs {
            let e = fields
                .entry(c.field())
                .or_insert((0, f64::INFINITY, f64::NEG_INFINITY));
            e.0 += 1;
            if let Some(r) = c.relative() {
                e.1 = e.1.min(r);
                e.2 = e.2.max(r);
            }
        }
    }
    s.push_str("by field (changes, relative change):\n");
    for (field, (n, lo, hi)) in &fields {
        let range = if lo.is_finite() {
            format!("{:+.3}% .. {:+.3}%", 100.0 * lo, 100.0 * hi)
        } else {
            "not numeric".to_string()
        };
        s.push_str(&format!("  {field}: {n}, {range}\n"));
    }
    s.push_str("per case:\n");
    for (name, cs) in &changed {
        s.push_str(&format!("  {name}:\n"));
        for c in cs {
            s.push_str(&format!("    {}\n", c.line()));
        }
    }
    s
}

/// Parameters of the named models as their publishers count them: the model's parameter
/// count printed by Hugging Face from the released safetensors (Meta Llama 3 8B / 70B /
/// 405B, Llama 2 7B / 70B, Mixtral 8x7B, Qwen2 7B, GPT-2). The hand count must give them.
const PUBLISHED_PARAMS: &[(&str, u64)] = &[
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),
    ("llama2-7b", 6_738_415_616),
    ("llama2-70b", 68_976_648_192),
    ("mixtral-8x7b", 46_702_792_704),
    ("Qwen2ForCausalLM", 7_615_616_512),
    ("GPT2LMHeadModel", 124_439_808),
];

/// The rounded counts their papers give: GPT-3 175B (Brown et al. 2020, Table 2.1) and
/// DeepSeek-V3's 671B without its MTP module (DeepSeek-V3 technical report, section 1); the
/// hand count must round to them (within 0.3%: the papers print three figures).
const ROUNDED_PARAMS: &[(&str, f64)] = &[("gpt3-175b", 175e9), ("deepseek-v3", 671e9)];

/// The case's headline figures in `got` against the hand count of its configuration; one
/// line per mismatch.
fn headline_mismatches(name: &str, got: &Value) -> Vec<String> {
    let config = &got["config"];
    let hand = golden_headline::headline(config);
    let mut bad = Vec::new();
    let model = config["model"]["name"].as_str().unwrap_or_default();
    let unmodified = !name.contains("gelu") && config["training"]["mode"] == "full";
    if unmodified {
        if let Some((_, n)) = PUBLISHED_PARAMS.iter().find(|(m, _)| *m == model) {
            if hand.params != *n {
                bad.push(format!("hand count {} vs published {n}", hand.params));
            }
        }
        if let Some((_, n)) = ROUNDED_PARAMS.iter().find(|(m, _)| *m == model) {
            let mtp_free = config["model"]["mtp_num_layers"].as_u64() == Some(0);
            if mtp_free && (hand.params as f64 / n - 1.0).abs() > 0.003 {
                bad.push(format!("hand count {} vs published {n:e}", hand.params));
            }
        }
    }
    if got["params"]["total"].as_u64() != Some(hand.params) {
        bad.push(format!(
            "params.total {} vs {} by hand",
            got["params"]["total"], hand.params
        ));
    }
    let flops = got["flops"]["per_token_model"].as_f64().unwrap();
    if (flops / hand.flops_per_token - 1.0).abs() > 1e-9 {
        bad.push(format!(
            "flops.per_token_model {flops} vs {} by hand",
            hand.flops_per_token
        ));
    }
    if let Some(want) = hand.model_state_bytes {
        let stages = got["memory"]["stages"].as_array().unwrap();
        let state = stages
            .iter()
            .map(|s| ["weights", "gradients", "optimizer"].map(|k| s[k].as_u64().unwrap()))
            .map(|b| b.iter().sum::<u64>())
            .max()
            .unwrap();
        if state != want {
            bad.push(format!(
                "model state {state} B on the most loaded GPU vs {want} by hand"
            ));
        }
    }
    bad.into_iter().map(|b| format!("{name}: {b}")).collect()
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
    let mut changes = Vec::new();
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
        failures.extend(headline_mismatches(name, &got));
        let file = golden_dir().join(format!("{name}.json"));
        let want: Option<Value> = std::fs::read_to_string(&file)
            .ok()
            .map(|text| serde_json::from_str(&text).unwrap());
        let mut diffs = Vec::new();
        if let Some(want) = &want {
            diff("", want, &got, &mut diffs);
        }
        if update {
            let text = serde_json::to_string_pretty(&got).unwrap();
            std::fs::write(&file, text + "\n").unwrap();
        } else if want.is_none() {
            failures.push(format!("{name}: no recorded output {}", file.display()));
        } else if !diffs.is_empty() {
            failures.push(format!(
                "{name} ({} differences):\n  {}",
                diffs.len(),
                diffs
                    .iter()
                    .map(Change::line)
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ));
        }
        changes.push((*name, diffs));
    }
    if update {
        let summary = change_summary(&changes);
        println!("{summary}");
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("estimate-golden-changes.txt");
        std::fs::write(&path, &summary).unwrap();
        println!("(also in {})", path.display());
    }
    assert!(
        failures.is_empty(),
        "outputs changed:\n{}",
        failures.join("\n")
    );
}

/// The summary names each changed field with its old and new values and relative change,
/// groups a field across cases and stages, and leaves unchanged cases out.
#[test]
fn change_summary_lists_every_changed_field() {
    let old: Value = serde_json::json!({"time": {"step_s": 2.0}, "memory": {"stages": [{"total": 10}, {"total": 20}]}, "name": "a"});
    let new: Value = serde_json::json!({"time": {"step_s": 2.5}, "memory": {"stages": [{"total": 11}, {"total": 20}]}, "name": "b"});
    let mut d = Vec::new();
    diff("", &old, &new, &mut d);
    let s = change_summary(&[("one", d), ("two", Vec::new())]);
    assert!(s.contains("1 of 2 cases changed, 3 fields"), "{s}");
    assert!(s.contains(".time.step_s: 2.0 -> 2.5 (+25.000%)"), "{s}");
    assert!(
        s.contains(".memory.stages[0].total: 10 -> 11 (+10.000%)"),
        "{s}"
    );
    assert!(
        s.contains(".memory.stages[*].total: 1, +10.000% .. +10.000%"),
        "{s}"
    );
    assert!(
        s.contains(".name: 1, not numeric") && s.contains(".name: \"a\" -> \"b\""),
        "{s}"
    );
    assert!(!s.contains("two:"), "{s}");
}
