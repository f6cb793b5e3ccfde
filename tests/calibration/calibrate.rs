//! `parsim calibrate`: recovers a known profile from measurements it generated (a second
//! method: the true parameters are known), reports what the measurements cannot identify, and
//! rejects bad measurement files with the line number. The fit behind the shipped profiles
//! (published throughput): it lands on the shipped values from distinct starts, and the
//! held-out rows meet a median and a worst guard, each of which trips on a model known to be
//! wrong.

use assert_cmd::cargo::cargo_bin_cmd;
use parsim::calibrate::measurements;
use parsim::calibrate::profile_fit::fit_profile;
use parsim::config::{Config, GpuProfile, Layer, Resolved};
use parsim_plan::op_timing::OpKey;
use predicates::prelude::*;
use serde_json::{json, Value};

/// A small Llama-like model so the fit runs quickly.
fn config(tp: u32, pp: u32, dp: u32, seq: u64, hidden: u64, gpn: u32) -> Value {
    json!({
        "model": {"preset": "llama3-8b", "num_layers": 8, "hidden_size": hidden, "num_attention_heads": 16,
                  "num_query_groups": 8, "ffn_hidden_size": 3 * hidden, "vocab_size": 32000},
        "cluster": {"num_gpus": tp * pp * dp, "gpus_per_node": gpn},
        "parallel": {"tp": tp, "sp": tp > 1, "pp": pp, "zero": 1},
        "training": {"seq_length": seq, "micro_batch_size": 1, "global_batch_size": 8 * dp as u64}
    })
}

fn truth() -> GpuProfile {
    let mut g = GpuProfile::load("h100-sxm").unwrap();
    g.efficiency.matmul = 0.55;
    g.efficiency.attention = 0.35;
    g.efficiency.memory_bound = 0.5;
    g.runtime_overhead_bytes = 2 << 30;
    g
}

/// Measurement lines produced by the true profile.
fn lines(configs: &[Value], truth: &GpuProfile) -> String {
    configs
        .iter()
        .map(|c| {
            let cfg = Config::from_layers(&[Layer::overrides(c.clone())]).unwrap();
            let e = parsim::estimate::estimate(&Resolved::with_gpu(cfg, truth.clone()).unwrap())
                .unwrap();
            json!({"config": c, "step_s": e.time.step_s, "peak_bytes": e.memory.per_gpu_max_bytes})
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes to `path` [`lines`] of the true profile for four small configurations, each line
/// carrying the op timings `ops`; returns the lines.
fn write_lines_with_ops(path: &std::path::Path, ops: &Value) -> Vec<String> {
    let configs = [
        config(1, 1, 1, 2048, 2048, 8),
        config(2, 1, 1, 2048, 2048, 8),
        config(1, 1, 2, 2048, 1024, 8),
        config(1, 2, 1, 2048, 2048, 8),
    ];
    let text: Vec<String> = lines(&configs, &truth())
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["ops"] = ops.clone();
            v.to_string()
        })
        .collect();
    std::fs::write(path, text.join("\n")).unwrap();
    text
}

#[test]
fn recovers_a_known_profile_and_predicts_held_out_runs() {
    let configs = [
        config(1, 1, 1, 1024, 2048, 8),
        config(1, 1, 1, 8192, 2048, 8),
        config(2, 1, 1, 2048, 4096, 8),
        config(4, 1, 2, 4096, 4096, 8),
        config(1, 2, 1, 2048, 1024, 8),
        config(8, 1, 1, 16384, 4096, 8),
        config(1, 1, 4, 4096, 2048, 8),
        config(2, 2, 2, 1024, 2048, 8),
        config(1, 1, 1, 2048, 8192, 8),
        config(4, 1, 1, 8192, 2048, 8),
        config(1, 4, 1, 4096, 4096, 8),
        config(2, 1, 4, 2048, 1024, 8),
    ];
    let text = lines(&configs, &truth());
    let ms = measurements::parse(&text, "synthetic.jsonl").unwrap();
    let base = GpuProfile::load("h100-sxm").unwrap();
    let fit = fit_profile(&base, &ms, "synthetic.jsonl").unwrap();
    let (held_median, held_worst) = fit.summary("held out", false, true).unwrap();
    let (before_median, _) = fit.summary("held out", false, false).unwrap();
    assert!(
        held_worst < 0.01,
        "held-out step time within 1% after the fit: {held_worst}"
    );
    assert!(
        before_median > held_median,
        "the fit improves on the base profile"
    );
    assert!(fit.r2 > 0.999, "R^2 {}", fit.r2);
    let (_, mem_worst) = fit.summary("held out", true, true).unwrap();
    assert!(
        mem_worst < 0.005,
        "held-out peak memory within 0.5%: {mem_worst}"
    );
    assert!(
        (fit.profile.runtime_overhead_bytes as i64 - (2i64 << 30)).abs() < (1 << 20),
        "overhead {}",
        fit.profile.runtime_overhead_bytes
    );
    let matmul = fit
        .params
        .iter()
        .find(|p| p.name == "efficiency.matmul")
        .unwrap();
    assert!(
        (matmul.after - 0.55).abs() < 0.03,
        "matmul {}",
        matmul.after
    );
    // Fitted values carry their provenance.
    assert!(fit.profile.provenance["efficiency.matmul"].contains("synthetic.jsonl"));
}

#[test]
fn parameters_the_measurements_cannot_see_are_reported() {
    // Single-GPU runs only: no collective runs, so link efficiencies and the overlap
    // interference cannot be identified.
    let configs = [
        config(1, 1, 1, 1024, 2048, 8),
        config(1, 1, 1, 4096, 2048, 8),
        config(1, 1, 1, 2048, 4096, 8),
        config(1, 1, 1, 8192, 1024, 8),
    ];
    let text = lines(&configs, &truth());
    let ms = measurements::parse(&text, "single.jsonl").unwrap();
    let fit = fit_profile(&GpuProfile::load("h100-sxm").unwrap(), &ms, "single.jsonl").unwrap();
    for name in [
        "links.intra_node.efficiency",
        "links.inter_node.efficiency",
        "efficiency.overlap_interference",
    ] {
        let p = fit.params.iter().find(|p| p.name == name).unwrap();
        assert!(!p.identifiable, "{name}");
        assert_eq!(p.before, p.after, "{name} is kept, not silently moved");
        assert!(p.note.contains("not identifiable"), "{}", p.note);
    }
}

#[test]
fn bad_measurement_files_name_the_line() {
    let good = json!({"config": {}, "step_s": 1.0}).to_string();
    let cases = [
        (
            format!("{good}\n\n{}", json!({"config": {}})),
            "x.jsonl:3: missing field `step_s`",
        ),
        (
            format!("# comment\n{}", json!({"config": {}, "step_s": -2.0})),
            "x.jsonl:2: `step_s` must be a positive number",
        ),
        (
            format!("{good}\n{}", json!({"step_s": 1.0})),
            "x.jsonl:2: missing field `config`",
        ),
        (
            json!({"config": {"parallel": {"tp": 3}}, "step_s": 1.0}).to_string(),
            "x.jsonl:1: configuration does not validate",
        ),
        ("{not json".to_string(), "x.jsonl:1: not JSON"),
        (
            json!({"config": {}, "step_s": 1.0, "peak_bytes": -5}).to_string(),
            "x.jsonl:1: `peak_bytes` must be a positive integer",
        ),
        ("# only a comment\n".to_string(), "no measurements"),
        // Op timings (docs/calibration.md): refused by line, element and field.
        (
            json!({"config": {}, "step_s": 1.0, "ops": [
                {"class": "memory", "bytes": 64, "calls": 1, "total_s": 1e-6},
                {"class": "gemm", "m": 8, "n": 8, "k": 8, "dtype": "f32", "calls": 2, "total_s": -1.0}
            ]})
            .to_string(),
            "x.jsonl:1: `ops[1]`: `total_s` = -1 must be finite and not negative",
        ),
        (
            r#"{"config": {}, "step_s": 1.0, "ops": [{"class": "host_gap", "calls": 1, "total_s": 1e999}]}"#
                .to_string(),
            // JSON has no infinity: an overflowing time is refused as it is read.
            "x.jsonl:1: not JSON: number out of range",
        ),
        (
            json!({"config": {}, "step_s": 1.0, "ops": {"class": "host_gap"}}).to_string(),
            "x.jsonl:1: `ops` must be an array",
        ),
        (
            json!({"config": {}, "step_s": 1.0, "ops": [{"class": "memory", "bytes": 0, "calls": 1, "total_s": 0.0}]})
                .to_string(),
            "x.jsonl:1: `ops[0]`: `bytes` must be at least 1",
        ),
    ];
    for (text, expect) in cases {
        let e = measurements::parse(&text, "x.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains(expect), "{e} does not contain {expect}");
    }
}

#[test]
fn cli_writes_a_profile_that_estimate_uses() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let configs = [
        config(1, 1, 1, 1024, 2048, 8),
        config(2, 1, 1, 2048, 2048, 8),
        config(1, 1, 2, 4096, 1024, 8),
        config(1, 2, 1, 2048, 2048, 8),
        config(2, 1, 2, 1024, 1024, 8),
    ];
    std::fs::write(&m, lines(&configs, &truth())).unwrap();
    let out = dir.path().join("fitted.toml");
    let png = dir.path().join("fit.png");
    cargo_bin_cmd!("parsim")
        .args([
            "calibrate",
            "--measurements",
            m.to_str().unwrap(),
            "--profile",
            "h100-sxm",
            "--out",
            out.to_str().unwrap(),
            "--png",
            png.to_str().unwrap(),
            "--report",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("efficiency.matmul"))
        .stdout(predicate::str::contains("held out"));
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let fitted = GpuProfile::load(out.to_str().unwrap()).unwrap();
    assert_eq!(fitted.name, "h100-sxm");
    cargo_bin_cmd!("parsim")
        .args(["estimate", "--profile", out.to_str().unwrap()])
        .assert()
        .success();
    // A broken measurement file is an error with its line, exit 1, no panic.
    std::fs::write(&m, "{\"config\": {}, \"step_s\": \"fast\"}\n").unwrap();
    cargo_bin_cmd!("parsim")
        .args([
            "calibrate",
            "--measurements",
            m.to_str().unwrap(),
            "--profile",
            "h100-sxm",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "m.jsonl:1: `step_s` must be a number",
        ));
}

#[test]
fn cpu_sweep_measures_real_runs_that_calibrate_can_read_back() {
    // Mechanics of `execute --calibrate` on a few points of the built-in sweep: real runs on the
    // CPU backend, written as the JSONL that `parsim calibrate` reads, with the same values.
    use parsim::calibrate::sweep;
    let points: Vec<_> = sweep::default_cpu_sweep()
        .into_iter()
        .filter(|p| {
            ["dp2 h256 s256", "tp2 sp h256", "cp2 p2p h256 s512"].contains(&p.label.as_str())
        })
        .collect();
    assert_eq!(points.len(), 3);
    let ms: Vec<_> = points
        .iter()
        .enumerate()
        .map(|(i, p)| sweep::measure(p, i, 3, 1, &parsim_executor::runner::run_cpu_for).unwrap())
        .collect();
    for m in &ms {
        assert!(m.step_s > 0.0 && m.step_s.is_finite());
        // The measured peak is the executor's tracked bytes; the engine predicts the same
        // tensors (issue 6 holds them within 2%), so the two are close here too.
        let r = Resolved::new(m.config.clone()).unwrap();
        let predicted = parsim::estimate::estimate(&r)
            .unwrap()
            .memory
            .per_gpu_max_bytes as f64;
        let measured = m.peak_bytes.unwrap() as f64;
        assert!(
            (predicted / measured - 1.0).abs() < 0.05,
            "{}: predicted {predicted} measured {measured}",
            m.label
        );
    }
    let text = sweep::to_jsonl(&ms);
    let back = measurements::parse(&text, "sweep.jsonl").unwrap();
    assert_eq!(back.len(), ms.len());
    for (a, b) in ms.iter().zip(&back) {
        assert_eq!(a.step_s, b.step_s);
        assert_eq!(a.peak_bytes, b.peak_bytes);
        assert_eq!(a.config, b.config);
        // `execute --calibrate` profiles every run: its op timings travel in the line.
        assert!(
            a.ops.iter().any(|o| matches!(o.key, OpKey::Gemm { .. })),
            "{}",
            a.label
        );
        assert_eq!(a.ops, b.ops);
    }
    let fit = fit_profile(&GpuProfile::load("cpu").unwrap(), &back, "sweep.jsonl").unwrap();
    assert_eq!(fit.rows.len(), 3);
}

#[test]
fn gpu_sweep_points_are_valid_single_rank_runs_that_fit_an_h100() {
    // The built-in sweep of `execute --calibrate --backend cuda`: each point, prepared for the
    // CUDA backend on the h100-sxm profile, validates, runs on one rank (the model's one device
    // per rank), fits in the GPU's memory, and labels are distinct; two are held out.
    use parsim::calibrate::sweep;
    let points = sweep::default_gpu_sweep();
    let mut labels: Vec<_> = points.iter().map(|p| p.label.clone()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), points.len());
    assert_eq!(points.iter().filter(|p| p.holdout).count(), 2);
    for p in points {
        let r = Resolved::new(sweep::for_cuda(p.config.clone(), "h100-sxm"))
            .unwrap_or_else(|e| panic!("{}: {e}", p.label));
        assert_eq!(r.world(), 1, "{}", p.label);
        let e = parsim::estimate::estimate(&r).unwrap();
        assert!(
            e.memory.fits,
            "{}: {} bytes",
            p.label, e.memory.per_gpu_max_bytes
        );
    }
}

/// Measurement lines carrying op timings (`"ops"`): `calibrate --out` writes the rate tables
/// fitted from them into the profile (a 4096^3 bf16 GEMM timed at 2 x 4096^3 / (0.5 x
/// 989.4e12) s per call is a bucket at efficiency 0.5; the one attention implementation
/// timed becomes the profile's), prints how well they reproduce the timings, and `estimate`
/// with that profile reports which ops its tables time. A negative op time is refused with
/// its line and field.
#[test]
fn cli_fits_rate_tables_from_op_timings() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let gemm_s = 2.0 * 4096f64.powi(3) / (0.5 * 989.4e12);
    let attn_flops = 4.0 * 16.0 * 2048.0 * 2048.0 * 128.0 / 2.0;
    let ops = json!([
        {"class": "gemm", "m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "calls": 2, "total_s": 2.0 * gemm_s},
        {"class": "attention", "batch_heads": 16, "q_len": 2048, "kv_len": 2048, "head_dim": 128,
         "mask": "causal", "pass": "forward", "kernel": "flash_mma", "calls": 1, "total_s": attn_flops / 150e12},
        {"class": "attention", "batch_heads": 16, "q_len": 2048, "kv_len": 2048, "head_dim": 128,
         "mask": "causal", "pass": "backward", "kernel": "flash_mma", "calls": 1, "total_s": 2.5 * attn_flops / 80e12}
    ]);
    let text = write_lines_with_ops(&m, &ops);
    let out = dir.path().join("fitted.toml");
    cargo_bin_cmd!("parsim")
        .args(["calibrate", "--measurements", m.to_str().unwrap()])
        .args(["--profile", "h100-sxm", "--out", out.to_str().unwrap()])
        .assert()
        .success()
        .stdout(predicate::str::contains("rate tables fitted"));
    let fitted = GpuProfile::load(out.to_str().unwrap()).unwrap();
    let b = &fitted.tables.gemm.as_ref().unwrap().buckets[0];
    // From the three fitting lines' timings (two GEMM calls each): the fourth line is held
    // out, and a held-out line's timings never reach the tables.
    assert!((b.efficiency - 0.5).abs() < 1e-9 && b.count == 6, "{b:?}");
    assert_eq!(fitted.tables.attention_kernel.as_deref(), Some("flash_mma"));
    let est = cargo_bin_cmd!("parsim")
        .args(["estimate", "--profile", out.to_str().unwrap(), "--json"])
        .args(["--seq", "2048", "--gpus", "8"])
        .output()
        .unwrap();
    assert!(est.status.success());
    let v: Value = serde_json::from_slice(&est.stdout).unwrap();
    assert!(
        v["table_coverage"]["covered_ops"].as_u64().unwrap() >= 1,
        "{v}"
    );
    let mut bad: Value = serde_json::from_str(&text[0]).unwrap();
    bad["ops"][1]["total_s"] = json!(-1.0);
    std::fs::write(&m, bad.to_string()).unwrap();
    cargo_bin_cmd!("parsim")
        .args(["calibrate", "--measurements", m.to_str().unwrap()])
        .args(["--profile", "h100-sxm"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "m.jsonl:1: `ops[1]`: `total_s` = -1",
        ));
}

/// `calibrate --report`'s op-class table (docs/calibration.md, "Reports"), checked against a
/// second computation: per class the measured seconds are the lines' `total_s` summed here;
/// before the fit, the memory-bound ops are predicted by the analytic model's formula, bytes
/// over hbm_bytes_per_s x efficiency.memory_bound of the profile as given (h100-sxm has no
/// memory table); after it, a GEMM table fitted from identical timings gives them back
/// exactly. A class the lines lack is reported absent, one measured in no time has no error
/// ("n/a"), a banded attention is not predicted, and nothing prints NaN or inf. `--ops-png`
/// writes a PNG that decodes at its stated size.
#[test]
fn report_compares_op_classes_before_and_after_the_fit() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let gemm_s = 2.0 * 4096f64.powi(3) / (0.5 * 989.4e12);
    let ops = json!([
        {"class": "gemm", "m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "calls": 2, "total_s": 2.0 * gemm_s},
        {"class": "memory", "bytes": 1 << 26, "calls": 3, "total_s": 3.0e-4},
        {"class": "memory", "bytes": 1 << 20, "calls": 1, "total_s": 2.0e-6},
        {"class": "attention", "batch_heads": 16, "q_len": 2048, "kv_len": 2048, "head_dim": 128,
         "mask": "banded", "pass": "forward", "kernel": "flash_mma", "calls": 1, "total_s": 1e-3},
        {"class": "host_gap", "calls": 5, "total_s": 0.0}
    ]);
    let n_lines = write_lines_with_ops(&m, &ops).len();
    let run = |extra: &[&str]| {
        cargo_bin_cmd!("parsim")
            .args(["calibrate", "--measurements", m.to_str().unwrap()])
            .args(["--profile", "h100-sxm"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = |class: &str| {
        v["op_classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["class"] == class)
            .unwrap_or_else(|| panic!("no {class} row in {v}"))
            .clone()
    };
    let num = |r: &Value, path: &[&str]| {
        path.iter()
            .fold(r, |x, k| &x[*k])
            .as_f64()
            .unwrap_or_else(|| panic!("{path:?} in {r}"))
    };
    let lines_n = n_lines as f64;
    // Measured: the lines' total_s per class, summed by hand.
    let class_sum = |class: &str| -> f64 {
        ops.as_array()
            .unwrap()
            .iter()
            .filter(|o| o["class"] == class)
            .map(|o| o["total_s"].as_f64().unwrap())
            .sum::<f64>()
            * lines_n
    };
    for class in ["gemm", "memory", "attention", "host_gap"] {
        let got = num(&row(class), &["measured_s"]);
        let want = class_sum(class);
        assert!(
            (got - want).abs() <= 1e-12 * want.max(1e-12),
            "{class}: {got} vs {want}"
        );
        assert_eq!(
            row(class)["timings"],
            json!(n_lines * if class == "memory" { 2 } else { 1 })
        );
    }
    // Before: the analytic memory-bound formula of the profile as given.
    let h100 = GpuProfile::load("h100-sxm").unwrap();
    let rate = h100.hbm_bytes_per_s * h100.efficiency.memory_bound;
    let want = lines_n * (3.0 * (1u64 << 26) as f64 + (1u64 << 20) as f64) / rate;
    let got = num(&row("memory"), &["before", "predicted_s"]);
    assert!(
        (got - want).abs() <= 1e-9 * want,
        "memory before: {got} vs {want}"
    );
    // After: the GEMM table fitted from identical timings gives them back.
    let gemm = row("gemm");
    let (p, meas) = (
        num(&gemm, &["after", "predicted_s"]),
        num(&gemm, &["after", "measured_s"]),
    );
    assert!((p / meas - 1.0).abs() < 1e-9, "gemm after: {p} vs {meas}");
    // A banded attention is not predicted; no collective was timed.
    assert_eq!(row("attention")["after"]["unpredicted"], json!(n_lines));
    assert_eq!(row("collective")["timings"], json!(0));
    // The text report: absent and zero-time classes say so, nothing is NaN or inf.
    let png = dir.path().join("ops.png");
    let out = run(&["--report", "--ops-png", png.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let table = &stdout[stdout.find("op classes:").expect("the op-class table")..];
    let line_of = |class: &str| {
        table
            .lines()
            .find(|l| l.contains(&format!(" {class} ")))
            .unwrap_or_else(|| panic!("{class} in {table}"))
            .to_string()
    };
    assert!(
        line_of("collective").contains("absent from the lines"),
        "{table}"
    );
    assert!(line_of("host_gap").contains("n/a"), "{table}");
    assert!(line_of("attention").contains("not predicted"), "{table}");
    let words: Vec<&str> = stdout.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    for bad in ["NaN", "inf"] {
        assert!(!words.contains(&bad), "{bad} in {stdout}");
    }
    let decoder = png::Decoder::new(std::io::Cursor::new(std::fs::read(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut buf).unwrap();
    assert_eq!(
        (frame.width, frame.height),
        parsim::calibrate::plot::OPS_PNG_SIZE
    );
}

/// Writes the true profile's lines for `configs` into `dir` and runs `parsim calibrate
/// --report` on them from h100-sxm, which must succeed: the file and the printed report.
fn report_of(dir: &tempfile::TempDir, configs: &[Value]) -> (std::path::PathBuf, String) {
    let m = dir.path().join("m.jsonl");
    std::fs::write(&m, lines(configs, &truth())).unwrap();
    let out = cargo_bin_cmd!("parsim")
        .args(["calibrate", "--measurements", m.to_str().unwrap()])
        .args(["--profile", "h100-sxm", "--report"])
        .output()
        .unwrap();
    assert!(out.status.success());
    (m, String::from_utf8(out.stdout).unwrap())
}

/// Lines without op timings: `--report` says so once, and `--ops-png` is refused naming the
/// flag (nothing to draw).
#[test]
fn report_without_op_timings_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let configs = [
        config(1, 1, 1, 2048, 2048, 8),
        config(2, 1, 1, 2048, 2048, 8),
    ];
    let (m, stdout) = report_of(&dir, &configs);
    assert_eq!(stdout.matches("carries `ops`").count(), 1, "{stdout}");
    cargo_bin_cmd!("parsim")
        .args(["calibrate", "--measurements", m.to_str().unwrap()])
        .args(["--profile", "h100-sxm", "--ops-png"])
        .arg(dir.path().join("x.png"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("--ops-png: no line of"));
}

/// One measurement leaves the fit no degrees of freedom: R^2 and the intervals print "n/a",
/// and nothing prints NaN or inf.
#[test]
fn a_fit_without_degrees_of_freedom_prints_n_a() {
    let dir = tempfile::tempdir().unwrap();
    let (_, stdout) = report_of(&dir, &[config(1, 1, 1, 2048, 2048, 8)]);
    assert!(
        stdout.contains("R^2 n/a") && stdout.contains("0 degrees of freedom"),
        "{stdout}"
    );
    let matmul = stdout
        .lines()
        .find(|l| l.contains("efficiency.matmul"))
        .unwrap();
    assert!(matmul.contains("n/a"), "{matmul}");
    for bad in ["NaN", "inf"] {
        assert!(!stdout.contains(bad), "{bad} in {stdout}");
    }
}

// The published-throughput fit (`parsim::calibrate::fit`, the fit behind the shipped GPU
// profiles' efficiencies): where it lands from distinct starts, and the held-out guards.

/// The corners of the box the fitted efficiencies move in (`fit.rs`: a logit over (0.05, 1)),
/// 5% inside each end, where the logit is finite.
const BOX: [f64; 2] = [0.1, 0.95];

/// How far from the shipped value a fit from another start may land. The profiles carry three
/// decimals and the fit stops when its simplex's objective values agree to 1e-9 relative,
/// which at these rows' curvature leaves a value within about 0.001 of the minimum; a second
/// minimum, or a stop on a flat ridge, lies further off. 0.005 of `efficiency.matmul` moves a
/// GEMM-bound step by 0.7%, a seventh of the held-out median error: within it the fit is the
/// same calibration.
const LANDING: f64 = 0.005;

/// Start independence: each family, fitted from the four corners of the fitted
/// coordinates' box (matmul and memory_bound at 0.1 or 0.95) and from one seeded random point
/// in it (attention drawn too), lands within [`LANDING`] of the shipped values; every start is
/// at least 0.15 away from them in a fitted coordinate (the nearest, H100's corner (0.95, 0.1)
/// against (0.795, 0.281), by 0.18), so landing there is the fit's doing.
/// What the fit does not move comes back as it went in: `attention` (no published row
/// depends on it), the measured overlap interference (also from a start of 0) and the
/// intra-node link efficiency. The eleven fits take about 7 s of CPU in the test profile
/// (6.7 s measured, 0.6 s a fit on average, A100's 74 rows the slower); they run on threads
/// of their own, so on two idle cores the test takes about 4 s.
#[test]
fn published_fit_lands_on_the_shipped_values_from_every_corner_and_a_random_start() {
    use parsim::calibrate::fit::{Family, FitResult, Params};
    use parsim::calibrate::{fit_family_from, shipped_params};
    use proptest::prelude::RngExt;
    use proptest::test_runner::{RngAlgorithm, TestRng};
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[54; 32]);
    let mut starts: Vec<(&str, [f64; 3])> = Vec::new();
    for matmul in BOX {
        for memory_bound in BOX {
            starts.push(("corner", [matmul, memory_bound, 0.5]));
        }
    }
    let mut draw = || rng.random_range(BOX[0]..BOX[1]);
    starts.push(("seeded random", [draw(), draw(), draw()]));
    let start_of = |family: Family, [matmul, memory_bound, attention]: [f64; 3]| Params {
        matmul,
        memory_bound,
        attention,
        ..shipped_params(family).unwrap()
    };
    let clock = std::time::Instant::now();
    let fits: Vec<(&str, Params, FitResult)> = std::thread::scope(|scope| {
        let handles: Vec<_> = starts
            .iter()
            .flat_map(|&(kind, x)| {
                Family::all()
                    .into_iter()
                    .map(move |f| (kind, f, start_of(f, x)))
            })
            .map(|(kind, family, start)| {
                scope.spawn(move || (kind, start, fit_family_from(family, start).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!(
        "{} fits in {:.1} s",
        fits.len(),
        clock.elapsed().as_secs_f64()
    );
    for (kind, start, fit) in &fits {
        let shipped = shipped_params(fit.family).unwrap();
        let name = fit.family.name();
        println!(
            "{name} from {kind} (matmul {:.3}, memory_bound {:.3}, attention {:.3}): matmul {:.3}, \
             memory_bound {:.3} (shipped {:.3}, {:.3}), objective {:.6}, {} evaluations",
            start.matmul,
            start.memory_bound,
            start.attention,
            fit.params.matmul,
            fit.params.memory_bound,
            shipped.matmul,
            shipped.memory_bound,
            fit.objective,
            fit.evaluations
        );
        let away = (start.matmul - shipped.matmul)
            .abs()
            .max((start.memory_bound - shipped.memory_bound).abs());
        assert!(away >= 0.15, "{name} {kind}: the start is the answer");
        for (field, got, want) in [
            ("matmul", fit.params.matmul, shipped.matmul),
            (
                "memory_bound",
                fit.params.memory_bound,
                shipped.memory_bound,
            ),
        ] {
            assert!(
                (got - want).abs() <= LANDING,
                "{name} {field} from {kind} {start:?}: lands at {got:.3}, the profile ships {want:.3}"
            );
        }
        assert_eq!(
            fit.params.attention,
            (start.attention * 1000.0).round() / 1000.0,
            "{name}: no published row depends on attention, so the fit must not move it"
        );
        assert_eq!(
            fit.params.overlap_interference,
            shipped.overlap_interference
        );
        assert_eq!(fit.params.intra_link, shipped.intra_link);
    }
    // The interference is measured, never fitted: a start of 0 stays 0.
    let no_interference = Params {
        overlap_interference: 0.0,
        ..shipped_params(Family::of("h100-sxm").unwrap()).unwrap()
    };
    let fit = fit_family_from(Family::of("h100-sxm").unwrap(), no_interference).unwrap();
    assert_eq!(fit.params.overlap_interference, 0.0);
}

/// The shipped efficiencies of every family, with `edit` applied.
fn shipped_with(
    edit: impl Fn(&mut parsim::calibrate::fit::Params),
) -> Vec<(
    parsim::calibrate::fit::Family,
    parsim::calibrate::fit::Params,
)> {
    parsim::calibrate::fit::Family::all()
        .into_iter()
        .map(|f| {
            let mut p = parsim::calibrate::shipped_params(f).unwrap();
            edit(&mut p);
            (f, p)
        })
        .collect()
}

/// The held-out check: the shipped profiles keep the checked held-out rows' median
/// within `MEDIAN_BOUND` (7%) and every one of them within `BOUND` (25%); each bound says
/// what it guards where it is defined (`calibrate/mod.rs`).
#[test]
fn held_out_rows_meet_the_median_and_worst_guards() {
    use parsim::calibrate::{evaluate, Row, BOUND, MEDIAN_BOUND};
    let e = evaluate(&shipped_with(|_| {})).unwrap();
    let checked = e.summary(Row::asserted);
    println!(
        "{} checked held-out rows: median {:.1}% (guard {:.0}%), worst {:.1}% (guard {:.0}%)",
        checked.n,
        100.0 * checked.median,
        100.0 * MEDIAN_BOUND,
        100.0 * checked.worst,
        100.0 * BOUND
    );
    assert!(checked.n >= 80, "too few checked rows: {}", checked.n);
    let failures = e.guard_failures();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each guard trips on a model known to be wrong in the way it guards against: a family's
/// GEMM efficiency a tenth off in either direction fails the median guard; dropping the
/// measured overlap interference (a whole mechanism), or halving the memory-bound efficiency,
/// puts some row past the worst guard.
#[test]
fn held_out_guards_trip_on_a_model_known_to_be_wrong() {
    use parsim::calibrate::evaluate;
    let failures = |name: &str, edit: &dyn Fn(&mut parsim::calibrate::fit::Params)| {
        let f = evaluate(&shipped_with(edit)).unwrap().guard_failures();
        println!("{name}: {}", f.join("; "));
        f
    };
    for factor in [0.9, 1.1] {
        let f = failures(&format!("matmul x{factor}"), &|p| p.matmul *= factor);
        assert!(
            f.iter().any(|l| l.starts_with("median")),
            "matmul x{factor}: {f:?}"
        );
    }
    let f = failures("no overlap interference", &|p| p.overlap_interference = 0.0);
    assert!(f.iter().any(|l| l.starts_with("worst")), "{f:?}");
    let f = failures("memory_bound x0.5", &|p| p.memory_bound *= 0.5);
    assert!(f.iter().any(|l| l.starts_with("worst")), "{f:?}");
}
