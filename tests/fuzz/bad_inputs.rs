//! Issue 18, robustness: every input that crashed, blew up memory, printed infinity or was
//! accepted without a word has a test here (each failed before its fix). Inputs either finish
//! in bounded memory with finite numbers, or are refused with the field or flag named.

use crate::common;
use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;
use std::io::Write;
use std::time::{Duration, Instant};

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// Runs `parsim ARGS`, expects exit code 1, no panic, and every fragment in stderr.
fn refuses(args: &[&str], fragments: &[&str]) {
    let mut assert = parsim()
        .args(args)
        .timeout(Duration::from_secs(60))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("panicked").not());
    for f in fragments {
        assert = assert.stderr(predicate::str::contains(*f));
    }
}

/// Runs `parsim ARGS`, expects success and every fragment in stderr (warnings).
fn warns(args: &[&str], fragments: &[&str]) {
    let mut assert = parsim()
        .args(args)
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    for f in fragments {
        assert = assert.stderr(predicate::str::contains(*f));
    }
}

fn temp_file(ext: &str, text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(ext).tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// No null (other than an unset optional field), NaN or infinity in a JSON document.
fn assert_all_numbers(text: &str) {
    if let Err(e) = check_numbers(text) {
        panic!("{e}");
    }
}

/// [`assert_all_numbers`] as a result, for the fuzz test to print the input with it.
fn check_numbers(text: &str) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    common::non_numbers(&v).map_or(Ok(()), Err)
}

// ---- search ----------------------------------------------------------------------------

#[test]
fn search_with_a_huge_mbs_max_does_not_wrap() {
    // mbs x dp wrapped to 0 and the remainder panicked.
    parsim()
        .args([
            "search",
            "--gpus",
            "8",
            "--mbs-max",
            "2305843009213693952",
            "--top",
            "1",
        ])
        .timeout(Duration::from_secs(120))
        .assert()
        .success();
    // The shift wrapped and the loop never ended.
    parsim()
        .args(["search", "--gpus", "1", "--gbs", "1"])
        .args(["--mbs-max", "9223372036854775808", "--top", "1"])
        .timeout(Duration::from_secs(60))
        .assert()
        // One GPU holds no mix of the default model: "no mix fits" exits 3 (#18).
        .code(3);
}

#[test]
fn search_refuses_zero_sizes_and_top() {
    refuses(
        &["search", "--gbs", "0"],
        &["training.global_batch_size", "at least 1"],
    );
    refuses(
        &["search", "--gpus", "0", "--seq", "0"],
        &["cluster.num_gpus", "training.seq_length"],
    );
    refuses(&["search", "--top", "0"], &["--top must be at least 1"]);
}

#[cfg(unix)]
#[test]
fn an_interrupted_search_exits_130() {
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("parsim"))
        .args(["search", "--model", "llama3-405b", "--gpus", "16384"])
        .args(["--gpus-per-node", "8", "--mbs-max", "64", "--exhaustive"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling the child this test spawned.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(130), "status {:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("INTERRUPTED"));
}

// ---- schedule --------------------------------------------------------------------------

#[test]
fn schedule_refuses_huge_charts_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    for size in ["65536x65536", "37000x37000"] {
        parsim()
            .args(["schedule", "--png", png.to_str().unwrap(), "--size", size])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("--size").and(predicate::str::contains("8192")));
    }
    assert!(!png.exists());
}

#[test]
fn long_schedules_are_refused_with_the_limit() {
    for (pp, m) in [("4", "100000000"), ("10000", "100000")] {
        refuses(
            &["schedule", "--pp", pp, "--microbatches", m],
            &["too large to simulate", "4194304"],
        );
    }
}

#[test]
fn overflowing_durations_are_refused_not_printed_as_null() {
    refuses(
        &["schedule", "--f=1e308", "--b=1e308", "--json"],
        &["makespan overflows"],
    );
}

#[test]
fn schedule_names_flags_it_ignores() {
    warns(
        &[
            "schedule",
            "--schedule",
            "1f1b",
            "--w",
            "1",
            "--overlap-factor",
            "0.5",
        ],
        &["--w ignored", "--overlap-factor ignored"],
    );
    warns(
        &[
            "schedule",
            "--schedule",
            "1f1b",
            "--microbatch-group-size",
            "4",
        ],
        &["--microbatch-group-size ignored"],
    );
    warns(
        &[
            "schedule",
            "--compare",
            "1f1b,interleaved-1f1b",
            "--vpp",
            "4",
        ],
        &["--vpp 4 applies only to interleaved-1f1b"],
    );
    refuses(
        &["schedule", "--max-columns", "0"],
        &["--max-columns must be at least 8"],
    );
}

// ---- estimate --------------------------------------------------------------------------

#[test]
fn a_huge_global_batch_on_one_stage_is_extrapolated() {
    // pp = 1 simulated every one of 2^30 microbatches: 24 GiB and an abort.
    for gbs in ["4294967296", "1073741824"] {
        let start = Instant::now();
        let out = parsim()
            .args(["estimate", "--gbs", gbs, "--json"])
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(start.elapsed() < Duration::from_secs(30));
        assert_all_numbers(&String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn huge_layouts_are_refused_in_json_naming_the_limit() {
    refuses(
        &[
            "layout", "--gpus", "16777216", "--tp", "8", "--gbs", "2097152", "--json",
        ],
        &["--json", "at most 65536 ranks"],
    );
}

// ---- hardware profiles -----------------------------------------------------------------

/// The shipped H100 profile with `key = value` replaced in `section` (e.g. `links.intra_node`).
fn profile_with(section: &str, key: &str, value: &str) -> tempfile::NamedTempFile {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/h100-sxm.toml"),
    )
    .unwrap();
    let mut current = String::new();
    let mut replaced = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with('[') {
                current = l[1..l.find(']').unwrap()].to_string();
            }
            if current == section && l.split('=').next().unwrap().trim() == key {
                replaced = true;
                format!("{key} = {value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(replaced, "{section}.{key} not in the profile");
    temp_file(".toml", &(lines.join("\n") + "\n"))
}

#[test]
fn profiles_refuse_impossible_figures_naming_the_field() {
    for (section, key, value, field) in [
        (
            "links.intra_node",
            "efficiency",
            "1.5",
            "links.intra_node.efficiency",
        ),
        (
            "links.inter_node",
            "latency_s",
            "-1e-6",
            "links.inter_node.latency_s",
        ),
        (
            "links.intra_node",
            "latency_s",
            "1e308",
            "links.intra_node.latency_s",
        ),
        (
            "efficiency",
            "kernel_overhead_s",
            "-4e-6",
            "efficiency.kernel_overhead_s",
        ),
        ("peak_flops", "fp8", "0", "peak_flops.fp8"),
        (
            "gemm",
            "achievable_bf16_fraction",
            "1.2",
            "gemm.achievable_bf16_fraction",
        ),
        (
            "gemm",
            "achievable_fp8_fraction",
            "0",
            "gemm.achievable_fp8_fraction",
        ),
    ] {
        let f = profile_with(section, key, value);
        refuses(
            &["estimate", "--profile", f.path().to_str().unwrap()],
            &[field],
        );
    }
}

// ---- configurations --------------------------------------------------------------------

#[test]
fn configurations_refuse_what_was_accepted_without_a_word() {
    let cases: [(&str, &str); 6] = [
        ("[model]\nkv_channels = 0\n", "model.kv_channels"),
        (
            "[parallel]\nddp_bucket_size = 0\n",
            "parallel.ddp_bucket_size",
        ),
        ("[training]\ngrad_dtype = \"fp8\"\n", "training.grad_dtype"),
        ("[training]\ngrad_dtype = \"fp16\"\n", "training.grad_dtype"),
        (
            "[model]\npreset = \"mixtral-8x7b\"\nmoe_load_imbalance = 1e300\n[parallel]\ntp = 2\n",
            "model.moe_load_imbalance",
        ),
        (
            "[training]\nmode = \"lora\"\n[training.lora]\nrank = 1000000\n",
            "training.lora.rank",
        ),
    ];
    for (toml, field) in cases {
        let f = temp_file(".toml", toml);
        refuses(
            &["estimate", "--config", f.path().to_str().unwrap()],
            &[field],
        );
    }
    let f = temp_file(
        ".toml",
        "[model]\npreset = \"mixtral-8x7b\"\nmoe_first_k_dense = 32\n\
         [cluster]\nnum_gpus = 64\n[parallel]\ntp = 1\nep = 8\n",
    );
    refuses(
        &["estimate", "--config", f.path().to_str().unwrap()],
        &["model.moe_first_k_dense", "no MoE layer"],
    );
}

// ---- Hugging Face configs, JSON configs, measurement lines -----------------------------

fn fixture(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `fixture` with `key` set to `value`, imported; the error text if it is refused.
fn import_with(name: &str, key: &str, value: serde_json::Value) -> Result<(), String> {
    let mut v = fixture(name);
    v[key] = value;
    parsim::config::hf::import(&v, name)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn hf_values_of_the_wrong_type_are_refused_not_defaulted() {
    use serde_json::json;
    let e = import_with("llama3-8b.json", "tie_word_embeddings", json!("yes")).unwrap_err();
    assert!(e.contains("tie_word_embeddings"), "{e}");
    let e = import_with("llama3-8b.json", "attention_dropout", json!("0.5")).unwrap_err();
    assert!(e.contains("attention_dropout"), "{e}");
    let e = import_with("mixtral-8x7b.json", "num_local_experts", json!(0)).unwrap_err();
    assert!(e.contains("num_local_experts"), "{e}");
    let e = import_with("deepseek-v3.json", "n_shared_experts", json!(u64::MAX)).unwrap_err();
    assert!(e.contains("n_shared_experts"), "{e}");
    // Null still means "absent".
    import_with(
        "llama3-8b.json",
        "tie_word_embeddings",
        serde_json::Value::Null,
    )
    .unwrap();
}

#[test]
fn json_configs_refuse_duplicate_keys_like_toml() {
    let f = temp_file(
        ".json",
        r#"{"training": {"global_batch_size": 64, "global_batch_size": 128}}"#,
    );
    refuses(
        &["estimate", "--config", f.path().to_str().unwrap()],
        &["duplicate key `global_batch_size`"],
    );
}

#[test]
fn measurement_lines_refuse_wrong_types_unknown_keys_and_impossible_figures() {
    use parsim::calibrate::measurements::parse;
    let cases = [
        (
            r#"{"config": {}, "step_s": 1.0, "holdout": "yes"}"#,
            "`holdout`",
        ),
        (
            r#"{"config": {}, "step_s": 1.0, "stepp_s": 2.0}"#,
            "unknown field `stepp_s`",
        ),
        (r#"{"config": {}, "step_s": 1e-300}"#, "`step_s`"),
        (
            r#"{"config": {}, "step_s": 1.0, "step_s": 2.0}"#,
            "duplicate key `step_s`",
        ),
    ];
    for (line, fragment) in cases {
        let e = parse(line, "m.jsonl").expect_err(line).to_string();
        assert!(e.contains(fragment), "{line}: {e}");
        assert!(e.contains("m.jsonl:1"), "{e}");
    }
    parse(
        r#"{"config": {}, "step_s": 1.0, "holdout": true}"#,
        "m.jsonl",
    )
    .unwrap();
    // A peak above the device's memory is named (a warning: synthetic data may hold one).
    let ms = parse(
        r#"{"config": {}, "step_s": 1.0, "peak_bytes": 1000000000000000}"#,
        "m.jsonl",
    )
    .unwrap();
    let w = parsim::calibrate::measurements::peak_warnings(&ms, "m.jsonl");
    assert!(
        w.len() == 1 && w[0].contains("m.jsonl:1: `peak_bytes`"),
        "{w:?}"
    );
}

// ---- flags that were silently ignored --------------------------------------------------

#[test]
fn estimate_names_flags_it_ignores() {
    warns(&["estimate", "--lora-rank", "16"], &["--lora-rank ignored"]);
    warns(
        &[
            "estimate",
            "--expert-tp",
            "1",
            "--moe-load-imbalance",
            "1.5",
        ],
        &["--expert-tp ignored", "--moe-load-imbalance ignored"],
    );
    let f = temp_file(".toml", "[model]\nnum_layers = 16\n");
    warns(
        &[
            "estimate",
            "--model",
            "llama3-8b",
            "--config",
            f.path().to_str().unwrap(),
        ],
        &["--model replaces the model of", "(num_layers) are ignored"],
    );
}

// ---- execute ---------------------------------------------------------------------------

/// `execute` assumed 32 GiB of host memory; it now reads the machine's and names it.
#[cfg(target_os = "linux")]
#[test]
fn execute_names_the_host_memory_it_read() {
    let avail = parsim::host::available_bytes().expect("/proc/meminfo");
    assert!(avail > 0);
    refuses(
        &[
            "execute",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--tp",
            "2",
        ],
        &["of host memory", "/proc/meminfo MemAvailable"],
    );
}

// ---- found by tests/fuzz/random_inputs.rs ------------------------------------------------------------

#[test]
fn fuzz_findings_are_refused_or_finish() {
    // A bucket of 2^64 - 1 parameters overflowed; 2^32 - 1 query groups took minutes in the
    // divisor hints.
    for (json, field) in [
        (
            r#"{"parallel": {"ddp_bucket_size": 18446744073709551615}}"#,
            "parallel.ddp_bucket_size",
        ),
        (
            r#"{"model": {"num_query_groups": 4294967295}}"#,
            "model.num_query_groups",
        ),
    ] {
        let f = temp_file(".json", json);
        refuses(
            &["estimate", "--config", f.path().to_str().unwrap()],
            &[field],
        );
    }
    // GPT-2's default n_inner = 4 n_embd overflowed.
    let e = import_with("gpt2.json", "n_embd", serde_json::json!(u64::MAX)).unwrap_err();
    assert!(e.contains("n_embd"), "{e}");
    // 2^31 microbatches: ZeRO-3's 2 x microbatches gathers and GPipe's live activations
    // overflowed.
    let out = parsim()
        .args([
            "search",
            "--gbs",
            "4294967296",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
        ])
        .args(["--top", "1", "--json"])
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_all_numbers(&String::from_utf8_lossy(&out.stdout));
}

// ---- calibrate -------------------------------------------------------------------------

/// `step_s: 1e-300` gave an infinite fit; the extremes still accepted give finite JSON.
#[test]
fn calibrate_refuses_absurd_steps_and_reports_finite_numbers() {
    let bad = temp_file(".jsonl", "{\"config\": {}, \"step_s\": 1e-300}\n");
    refuses(
        &[
            "calibrate",
            "--measurements",
            bad.path().to_str().unwrap(),
            "--profile",
            "h100-sxm",
        ],
        &["`step_s`"],
    );
    let edge = temp_file(
        ".jsonl",
        "{\"config\": {\"training\": {\"global_batch_size\": 8}}, \"step_s\": 1e-6}\n\
         {\"config\": {\"cluster\": {\"num_gpus\": 16}}, \"step_s\": 1e7, \"peak_bytes\": 1}\n\
         {\"config\": {}, \"step_s\": 1e7, \"holdout\": true}\n",
    );
    let out = parsim()
        .args(["calibrate", "--measurements", edge.path().to_str().unwrap()])
        .args(["--profile", "h100-sxm", "--json"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_all_numbers(&String::from_utf8_lossy(&out.stdout));
}
