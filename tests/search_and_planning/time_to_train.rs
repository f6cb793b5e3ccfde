//! The run section (`--train-tokens`, issue 34): time to train, GPU-hours, energy, cost and
//! goodput on `estimate` and `compare`, absent unless asked for, and refused bad input.

use assert_cmd::cargo::cargo_bin_cmd;

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// Runs `parsim ARGS`, expects `code`, and parses stdout as JSON.
fn json(args: &[&str], code: i32) -> serde_json::Value {
    let out = parsim().args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn estimate_adds_the_run_only_when_asked() {
    let plain = json(&["estimate", "--json"], 0);
    assert!(plain.get("run").is_none());
    assert!(plain["config"].get("run").is_none());
    let text = parsim().arg("estimate").output().unwrap();
    assert!(!String::from_utf8_lossy(&text.stdout).contains("GPU-hours"));

    let v = json(&["estimate", "--json", "--train-tokens", "2T"], 0);
    let run = &v["run"];
    assert_eq!(run["tokens"].as_u64(), Some(2_000_000_000_000));
    // The default: 64 sequences of 8192 tokens per step on 8 GPUs.
    let steps = 2_000_000_000_000_u64.div_ceil(64 * 8192);
    assert_eq!(run["steps"].as_u64(), Some(steps));
    let step_s = f(&v["time"]["step_s"]);
    let compute_days = steps as f64 * step_s / 86_400.0;
    assert!((f(&run["compute_days"]) - compute_days).abs() < 1e-9 * compute_days);
    let wall_days = f(&run["wall_days"]);
    assert!(wall_days > compute_days);
    // GPU-hours are GPUs x wall hours.
    assert!((f(&run["gpu_hours"]) - 8.0 * wall_days * 24.0).abs() < 1e-6 * f(&run["gpu_hours"]));
    let goodput = f(&run["goodput_fraction"]);
    assert!((goodput - compute_days / wall_days).abs() < 1e-12);
    // Energy within the envelope: no less than the GPUs idle (70 W, no host, PUE 1), no more
    // than every GPU at TDP (700 W) plus one node's host and network at the default PUE.
    let energy_wh = f(&run["energy_mwh"]) * 1e6;
    let gpu_h = f(&run["gpu_hours"]);
    assert!(energy_wh >= 70.0 * gpu_h, "{energy_wh}");
    assert!(energy_wh <= 1.10 * (700.0 * gpu_h + (4600.0 + 645.0) * wall_days * 24.0));
    // No price: no cost, and a note says why.
    assert!(run.get("cost_usd").is_none());
    assert!(run["notes"][0]
        .as_str()
        .unwrap()
        .contains("no default price"));

    let v = json(
        &[
            "estimate",
            "--json",
            "--train-tokens",
            "300B",
            "--gpu-hour-price",
            "2.5",
        ],
        0,
    );
    let run = &v["run"];
    assert!((f(&run["cost_usd"]) - 2.5 * f(&run["gpu_hours"])).abs() < 1e-6);
    assert_eq!(
        v["config"]["run"]["price_per_gpu_hour_usd"].as_f64(),
        Some(2.5)
    );
}

#[test]
fn the_run_table_follows_the_estimate() {
    let out = parsim()
        .args(["estimate", "--train-tokens", "15.6T"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for row in [
        "15.6T",
        "wall time",
        "GPU-hours",
        "goodput",
        "expected interruptions",
    ] {
        assert!(text.contains(row), "{row} missing:\n{text}");
    }
    assert!(text.contains("note: cost omitted"));
}

#[test]
fn bad_token_counts_and_prices_name_the_flag() {
    for bad in ["0", "-5", "abc", "1.5", "2X"] {
        let out = parsim()
            .args(["estimate", "--train-tokens", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--train-tokens"));
    }
    for bad in ["0", "-1", "nan", "inf"] {
        let out = parsim()
            .args(["estimate", "--train-tokens", "1T", "--gpu-hour-price", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--gpu-hour-price"));
    }
}

#[test]
fn bad_run_settings_in_a_file_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (body, field) in [
        (
            "[run]\ntrain_tokens = 1000000000\nstorage_bytes_per_s = 0.0\n",
            "run.storage_bytes_per_s",
        ),
        ("[run]\ntrain_tokens = 1000000000\npue = 0.5\n", "run.pue"),
        (
            "[run]\ntrain_tokens = 1000000000\nfailure_rate_per_gpu_hour = -1.0\n",
            "run.failure_rate_per_gpu_hour",
        ),
        ("[run]\ntrain_tokens = 1000000000\nwatts = 3\n", "watts"),
        // Without a token budget the settings are still checked, never ignored.
        ("[run]\npue = 0.5\n", "run.pue"),
        ("[run]\ndeadline_days = -1.0\n", "run.deadline_days"),
    ] {
        let path = dir.path().join("run.toml");
        std::fs::write(&path, body).unwrap();
        let out = parsim()
            .args(["estimate", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{body}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{body}: {err}");
    }
}

#[test]
fn compare_gives_each_column_its_run() {
    let v = json(
        &[
            "compare",
            "--json",
            "--base",
            "--train-tokens 100B",
            "--set",
            "--tp 2",
            "--set",
            "--tp 4",
        ],
        0,
    );
    let runs = v["run"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, est) in runs.iter().zip(v["estimates"].as_array().unwrap()) {
        let step_s = f(&est["time"]["step_s"]);
        let steps = f(&run["steps"]);
        assert!((f(&run["compute_days"]) - steps * step_s / 86_400.0).abs() < 1e-9);
    }
    let plain = json(
        &["compare", "--json", "--set", "--tp 2", "--set", "--tp 4"],
        0,
    );
    assert!(plain.get("run").is_none());
}

#[test]
fn search_without_an_objective_shows_each_rows_run_and_how_to_rank_by_it() {
    let out = parsim()
        .args([
            "search",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--seq",
            "2048",
            "--gbs",
            "16",
            "--top",
            "1",
            "--train-tokens",
            "1T",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--objective time|cost|energy ranks by them"),
        "{text}"
    );
    // The row's wall days are the budget over its throughput: 1e12 tokens / (tokens/s) / 86400.
    let header = text.lines().find(|l| l.starts_with("│ #")).unwrap();
    let row = text.lines().find(|l| l.starts_with("│ 1 ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    let column = |name: &str| {
        let at = header.find(name).unwrap();
        row[at..].split_whitespace().next().unwrap().to_string()
    };
    let tokens_per_s: f64 = column("tokens/s").parse().unwrap();
    let days: f64 = column("wall days").parse().unwrap();
    let expected = 1e12 / tokens_per_s / 86_400.0;
    assert!(
        (days / expected - 1.0).abs() < 1e-3,
        "{days} vs {expected}: {cells:?}"
    );
}
