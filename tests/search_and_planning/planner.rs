//! Planner features: the memory margin, exit codes, inverse questions (GPU-count ranges,
//! the largest micro batch, defaults for `--gpus` alone), `compare`, CSV output, and `search`
//! honouring every training flag.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// Runs `parsim ARGS --json`, expects `code`, and parses stdout.
fn json(args: &[&str], code: i32) -> serde_json::Value {
    let out = parsim().args(args).arg("--json").output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn memory_margin_is_reported_and_decides_fits() {
    let v = json(&["estimate"], 0);
    let m = &v["memory"];
    assert_eq!(m["margin_fraction"].as_f64(), Some(0.05));
    let capacity = m["capacity_bytes"].as_u64().unwrap();
    let usable = m["usable_bytes"].as_u64().unwrap();
    assert_eq!(usable, (capacity as f64 * 0.95).floor() as u64);
    // The default needs about 70% of the device: a 35% margin leaves too little.
    let v = json(&["estimate", "--memory-margin", "35%"], 3);
    assert_eq!(v["memory"]["fits"], false);
    assert_eq!(v["memory"]["margin_fraction"].as_f64(), Some(0.35));
    assert!(v["verdict"]
        .as_str()
        .unwrap()
        .contains("does not fit with the memory margin"));
    let v = json(&["estimate", "--memory-margin", "0.25"], 0);
    assert_eq!(v["memory"]["fits"], true);
}

#[test]
fn memory_margin_out_of_range_is_invalid_input() {
    parsim()
        .args(["estimate", "--memory-margin", "1.5"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fraction in [0, 1)"));
    let profile = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    let text = parsim::config::GpuProfile::load("h100-sxm").unwrap();
    let mut value = toml::Value::try_from(&text).unwrap();
    value["memory_margin_fraction"] = toml::Value::Float(1.0);
    std::fs::write(profile.path(), toml::to_string(&value).unwrap()).unwrap();
    parsim()
        .args(["estimate", "--profile", profile.path().to_str().unwrap()])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "memory_margin_fraction must be in [0, 1)",
        ));
}

#[test]
fn search_ranks_only_mixes_that_fit_with_the_margin() {
    let args = [
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--seq",
        "8192",
        "--gbs",
        "64",
        "--top",
        "20",
    ];
    let tight = json(&[&args[..], &["--memory-margin", "0.3"]].concat(), 0);
    for t in tight["top"].as_array().unwrap() {
        let m = &t["memory"];
        assert!(m["per_gpu_max_bytes"].as_u64() <= m["usable_bytes"].as_u64());
        assert!(m["usable_bytes"].as_u64().unwrap() < m["capacity_bytes"].as_u64().unwrap());
    }
    let loose = json(&[&args[..], &["--memory-margin", "0"]].concat(), 0);
    let most = |v: &serde_json::Value| {
        v["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["memory"]["per_gpu_max_bytes"].as_u64().unwrap())
            .max()
            .unwrap()
    };
    assert!(most(&loose) > most(&tight));
}

#[test]
fn exit_codes_are_documented_in_help() {
    for cmd in [
        &["--help"][..],
        &["estimate", "--help"],
        &["search", "--help"],
    ] {
        parsim()
            .args(cmd)
            .assert()
            .success()
            .stdout(predicate::str::contains("Exit status:"))
            .stdout(predicate::str::contains("3    does not fit"));
    }
}

#[test]
fn not_fitting_exits_3_and_invalid_input_exits_1() {
    parsim()
        .args([
            "estimate",
            "--model",
            "llama3-70b",
            "--tp",
            "1",
            "--gpus",
            "8",
        ])
        .assert()
        .code(3)
        .stdout(predicate::str::contains("DOES NOT FIT"));
    parsim()
        .args(["estimate", "--gpus", "12", "--tp", "8"])
        .assert()
        .code(1);
    parsim()
        .args(["search", "--model", "llama3-405b", "--gpus", "8"])
        .assert()
        .code(3)
        .stdout(predicate::str::contains("no mix fits"));
}

/// `search --json` for llama3-8b on 8 GPUs with `extra` flags.
fn small_search(extra: &[&str]) -> serde_json::Value {
    let base = [
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--seq",
        "4096",
        "--gbs",
        "64",
        "--top",
        "3",
    ];
    json(&[&base[..], extra].concat(), 0)
}

fn best_step_s(v: &serde_json::Value) -> f64 {
    v["top"][0]["time"]["step_s"].as_f64().unwrap()
}

#[test]
fn search_honours_training_flags_for_every_candidate() {
    let plain = small_search(&[]);
    let cases: [(&[&str], &str, &str, serde_json::Value); 5] = [
        (
            &["--mode", "lora", "--lora-rank", "16"],
            "training",
            "mode",
            "lora".into(),
        ),
        (
            &["--recompute", "full"],
            "training",
            "recompute",
            "full".into(),
        ),
        (
            &["--precision", "fp8"],
            "training",
            "precision",
            "fp8".into(),
        ),
        (
            &["--grad-dtype", "bf16"],
            "training",
            "grad_dtype",
            "bf16".into(),
        ),
        (
            &["--no-overlap-grad-reduce"],
            "parallel",
            "overlap_grad_reduce",
            false.into(),
        ),
    ];
    for (flags, section, key, want) in cases {
        let v = small_search(flags);
        let top = v["top"].as_array().unwrap();
        assert!(!top.is_empty(), "{flags:?}");
        for t in top {
            assert_eq!(t["config"][section][key], want, "{flags:?}");
        }
        assert_ne!(
            best_step_s(&v),
            best_step_s(&plain),
            "{flags:?} changed nothing"
        );
    }
}

#[test]
fn search_takes_the_overlap_switches() {
    let v = small_search(&["--tp-comm-overlap", "--constraint", "tp=2"]);
    assert_eq!(v["top"][0]["config"]["parallel"]["tp_comm_overlap"], true);
    let plain = small_search(&["--constraint", "tp=2"]);
    assert!(best_step_s(&v) < best_step_s(&plain));
}

#[test]
fn estimate_mbs_max_picks_the_largest_micro_batch_that_fits() {
    let args = [
        "estimate",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--seq",
        "2048",
    ];
    let v = json(&[&args[..], &["--mbs", "max"]].concat(), 0);
    let best = v["config"]["training"]["micro_batch_size"]
        .as_u64()
        .unwrap();
    assert!(best >= 2, "{best}");
    assert_eq!(v["memory"]["fits"], true);
    // The next micro batch that divides the batch per replica does not fit.
    let per_replica = v["config"]["training"]["global_batch_size"]
        .as_u64()
        .unwrap()
        / 4;
    let next = (best + 1..=per_replica)
        .find(|b| per_replica % b == 0)
        .unwrap();
    let mbs = next.to_string();
    json(&[&args[..], &["--mbs", &mbs]].concat(), 3);
    parsim()
        .args(args)
        .args(["--mbs", "max"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "largest micro batch that fits: {best}"
        )));
    parsim()
        .args(["layout", "--mbs", "max"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("only `parsim estimate`"));
}

#[test]
fn gpus_alone_picks_degrees_that_divide_and_says_so() {
    let out = parsim()
        .args(["estimate", "--model", "llama3-8b", "--gpus", "1", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "valid input that does not fit");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["parallel"]["tp"], 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: the default tp 2"), "{stderr}");
    // An explicit --tp is kept, and refused when it does not divide.
    parsim()
        .args(["estimate", "--gpus", "1", "--tp", "2"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("world size 1"));
    // Small enough to fit on one GPU.
    parsim()
        .args(["estimate", "--gpus", "1", "--seq", "1024", "--model-config"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf/gpt2.json"
        ))
        .assert()
        .success();
}

const RANGE_SEARCH: [&str; 9] = [
    "search",
    "--model",
    "llama3-8b",
    "--gpus",
    "1..8",
    "--seq",
    "4096",
    "--gbs",
    "32",
];

#[test]
fn search_over_a_gpu_range_finds_the_smallest_count_that_fits() {
    let v = json(&RANGE_SEARCH, 0);
    assert_eq!(v["smallest_fitting_gpus"], 2);
    let gpus: Vec<u64> = v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["gpus"].as_u64().unwrap())
        .collect();
    assert_eq!(gpus, [1, 2, 4, 8]);
    assert!(v["points"][0]["best"].is_null());
    assert_eq!(v["points"][3]["best"]["config"]["cluster"]["num_gpus"], 8);
}

#[test]
fn search_over_a_gpu_range_prints_a_table_and_draws_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("sweep.png");
    let out = parsim()
        .args(RANGE_SEARCH)
        .arg("--png")
        .arg(&png)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("smallest GPU count that fits: 2"), "{text}");
    assert!(text.contains("no mix fits"), "{text}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    // None fits: exit 3.
    parsim()
        .args(["search", "--model", "llama3-405b", "--gpus", "1..4"])
        .assert()
        .code(3)
        .stdout(predicate::str::contains("no GPU count from 1 to 4 fits"));
    // A range is for search only; --png needs a range.
    parsim()
        .args(["estimate", "--gpus", "8..16"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("only `parsim search`"));
    parsim()
        .args(["search", "--gpus", "8", "--png", "x.png"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("give --gpus LOW..HIGH"));
}

/// Parses CSV without quoted commas in the checked columns: the header and the rows.
fn csv_rows(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines().map(csv_fields);
    let header = lines.next().unwrap();
    (header, lines.collect())
}

/// One CSV line's fields (RFC 4180: a field in double quotes may hold commas, and `""` is a
/// quote), so labels such as `pp8[10x6,11,9]` stay one field.
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[test]
fn search_csv_has_one_row_per_ranked_mix_with_unrounded_numbers() {
    let out = parsim()
        .args([
            "search",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--top",
            "3",
            "--csv",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let (header, rows) = csv_rows(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(&header[..3], ["rank", "mix", "tp"]);
    assert_eq!(rows.len(), 3);
    let step = header.iter().position(|h| h == "step_s").unwrap();
    let steps: Vec<f64> = rows.iter().map(|r| r[step].parse().unwrap()).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]));
    let out = parsim().args(RANGE_SEARCH).arg("--csv").output().unwrap();
    let (header, rows) = csv_rows(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(&header[..2], ["gpus", "fits"]);
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0][1], "false");
    assert_eq!(rows[1][1], "true");
}

/// Snapshots stdout and the exit code of `parsim ARGS` as `tests/snapshots/NAME.snap`.
fn snapshot(name: &str, args: &[&str]) {
    let out = parsim().args(args).env("NO_COLOR", "1").output().unwrap();
    let text = format!(
        "args: parsim {}\nexit: {}\n----- stdout -----\n{}",
        args.join(" "),
        out.status.code().map_or("signal".into(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
    );
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    s.set_snapshot_path("../snapshots");
    s.bind(|| insta::assert_snapshot!(name, text));
}

const COMPARE: [&str; 8] = [
    "compare",
    "--base",
    "--model llama3-70b --gpus 64 --seq 4096 --gbs 128",
    "--set",
    "--tp 8 --pp 4",
    "--set",
    "--tp 4 --pp 4 --recompute full",
    "--csv",
];

#[test]
fn compare_text_marks_differences() {
    snapshot("planning_compare_text", &COMPARE[..7]);
    snapshot("planning_search_gpu_range_text", &RANGE_SEARCH);
}

#[test]
fn compare_json_and_csv_hold_every_quantity() {
    let v = json(&COMPARE[..7], 0);
    assert_eq!(v["labels"][0], "--tp 8 --pp 4");
    let metrics = v["metrics"].as_array().unwrap();
    let find = |name: &str| metrics.iter().find(|m| m["name"] == name).unwrap();
    assert_eq!(find("optimizer")["differs"], false);
    assert_eq!(find("activations")["differs"], true);
    let step = find("step")["values"].as_array().unwrap();
    assert_eq!(step[1], v["estimates"][1]["time"]["step_s"]);
    for section in ["memory", "time", "throughput"] {
        assert!(metrics.iter().any(|m| m["section"] == section));
    }
    let out = parsim().args(COMPARE).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "section,quantity,unit,differs,--tp 8 --pp 4,--tp 4 --pp 4 --recompute full"
    );
    assert!(text.contains("\ntime,step,seconds,true,"));
}

#[test]
fn compare_takes_files_and_exits_3_when_one_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.toml");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, "[model]\npreset = \"llama3-8b\"\n[parallel]\ntp = 2\n").unwrap();
    std::fs::write(&b, "[model]\npreset = \"llama3-8b\"\n[parallel]\ntp = 1\n").unwrap();
    parsim()
        .arg("compare")
        .args([&a, &b])
        .assert()
        .code(3)
        .stdout(predicate::str::contains("a.toml"))
        .stdout(predicate::str::contains("b.toml"))
        .stdout(predicate::str::contains("NO"));
    parsim()
        .args(["compare", "--set", "--tp 2"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("at least two configurations"));
    parsim()
        .args(["compare", "--set", "--tq 2", "--set", "--tp 1"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--tq"));
}

#[test]
fn schedule_table_as_csv() {
    let out = parsim()
        .args(["schedule", "--compare", "1f1b,zb-v,dualpipe-v", "--csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let (header, rows) = csv_rows(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(&header[..2], ["schedule", "pp"]);
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names, ["1f1b", "zb-v", "dualpipe-v"]);
    // 1F1B, pp 4, 8 microbatches: bubble (p-1)/m = 0.375, simulated and textbook.
    assert_eq!(rows[0][5], "0.375");
    assert_eq!(rows[0][6], "0.375");
    // One schedule without --compare: one row.
    let out = parsim().args(["schedule", "--csv"]).output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 2);
}
