//! `parsim calibrate --trace`: profiler traces onto op classes and rate tables. Public
//! multi-rank PyTorch traces (tests/fixtures/traces/SOURCES.md) parse, and every kernel the
//! reader cannot place is named; a trace of parsim's own CPU run (`execute --trace
//! --profile-ops`) fits the same tables as the run's op timings (a second record of the same
//! run); malformed traces are refused by field, never with a panic.

use parsim::calibrate::table_fit::{fit_tables, reproduce};
use parsim::config::tables::TableProvenance;
use parsim::config::GpuProfile;
use parsim_plan::op_timing::{CollectiveKind, OpKey, OpTiming, Placement};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn parsim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_parsim"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name)
}

fn ok(mut c: Command) -> Output {
    let out = c.output().expect("parsim runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn calibrate_json(traces: &[&Path], gpu: &str) -> Value {
    let mut c = parsim();
    c.args(["calibrate", "--gpu", gpu, "--json", "--trace"]);
    c.args(traces);
    serde_json::from_slice(&ok(c).stdout).expect("calibrate --trace --json prints JSON")
}

/// Each public trace parses; every kernel is either placed (its calls in `timings`) or named
/// with its reason, so placed and unplaced calls add up to the kernels the file holds.
#[test]
fn public_multi_rank_traces_parse_and_name_every_kernel_they_cannot_place() {
    let files = [
        "hta_sampled_rank-0.json.gz",
        "hta_sampled_rank-1.json.gz",
        "hta_nccl_data_rank-0.json.gz",
    ];
    for name in files {
        let path = fixture(name);
        let v = calibrate_json(&[&path], "a100-80g");
        let kernels = v["files"][0]["kernels"].as_u64().unwrap();
        let classes = v["op_classes"].as_array().unwrap();
        let placed: u64 = classes
            .iter()
            .filter(|c| !matches!(c["class"].as_str(), Some("host_gap")))
            .map(|c| c["calls"].as_u64().unwrap())
            .sum();
        let unplaced = v["unplaced"].as_array().unwrap();
        let named: u64 = unplaced.iter().map(|u| u["calls"].as_u64().unwrap()).sum();
        assert_eq!(placed + named, kernels, "{name}");
        for u in unplaced {
            assert!(!u["name"].as_str().unwrap().is_empty(), "{name}: {u}");
            assert!(!u["reason"].as_str().unwrap().is_empty(), "{name}: {u}");
        }
        assert!(
            v["frameworks"]
                .to_string()
                .contains("DistributedDataParallel"),
            "{name}: the trace shows DDP's forward: {}",
            v["frameworks"]
        );
    }
    // The two ranks of one run together, as one call.
    let both = calibrate_json(&[&fixture(files[0]), &fixture(files[1])], "a100-80g");
    assert_eq!(both["files"].as_array().unwrap().len(), 2);
    assert_eq!(both["files"][1]["rank"], 1);
}

/// The DDP trace's all-reduces, by hand from its `record_param_comms` fields: 6637568 Float
/// elements over the 2 ranks [0, 1] of one node is an intra-node all-reduce of 4 x 6637568
/// bytes; none of the trace's 2700 kernels is a GEMM parsim can place (its GEMMs are cuDNN
/// convolutions on TF32), so the GEMM class stays empty.
#[test]
fn a_traces_nccl_metadata_gives_the_collectives_bytes_group_and_placement() {
    let v = calibrate_json(&[&fixture("hta_nccl_data_rank-0.json.gz")], "a100-80g");
    let timings: Vec<OpTiming> = serde_json::from_value(v["timings"].clone()).unwrap();
    let want = OpKey::Collective {
        op: CollectiveKind::AllReduce,
        bytes: 4 * 6_637_568,
        group_size: 2,
        placement: Placement::IntraNode,
    };
    assert!(timings.iter().any(|t| t.key == want), "{timings:?}");
    assert!(timings.iter().all(|t| t.key.class() != "gemm"));
    let gemm_reasons = v["unplaced"].to_string();
    assert!(gemm_reasons.contains("aten::convolution_backward"));
}

/// A trace of parsim's own CPU run against the run's op timings: every op class's table
/// fitted from the trace gives back the timings the executor recorded within 10% (the op
/// classes to rounding, the host gap within its bound), and every kernel is placed.
#[test]
fn parsims_own_trace_fits_within_ten_percent_of_the_executor_based_fit() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.json");
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/executor_small.toml");
    let mut c = parsim();
    c.args(["execute", "--config", cfg.to_str().unwrap(), "--dp", "2"])
        .args([
            "--steps",
            "3",
            "--warmup",
            "1",
            "--profile-ops",
            "--json",
            "--trace",
        ])
        .arg(&trace);
    let run: Value = serde_json::from_slice(&ok(c).stdout).unwrap();
    let executor_ops: Vec<OpTiming> = run["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| serde_json::from_value::<Vec<OpTiming>>(r["ops"].clone()).unwrap())
        .collect();
    let out = dir.path().join("fitted.toml");
    let mut c = parsim();
    c.args(["calibrate", "--gpu", "cpu", "--json", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out);
    let v: Value = serde_json::from_slice(&ok(c).stdout).unwrap();
    assert_eq!(
        v["unplaced"].as_array().unwrap().len(),
        0,
        "{}",
        v["unplaced"]
    );
    assert!(v["frameworks"].to_string().contains("parsim executor"));
    let fitted = GpuProfile::load(out.to_str().unwrap()).expect("the written profile loads");
    let cpu = GpuProfile::load("cpu").unwrap();
    let provenance = TableProvenance {
        date: "2026-12-07".into(),
        device: "this host".into(),
        driver: "none".into(),
        software: "tests/calibration/trace.rs".into(),
    };
    let executor_tables = fit_tables(&executor_ops, &cpu, &provenance).unwrap();
    for r in reproduce(&executor_ops, &fitted.tables, &cpu) {
        assert!(
            r.total_error.abs() <= 0.10,
            "{} from the trace: {r:?}",
            r.class
        );
    }
    let gap = |t: &parsim::config::tables::RateTables| t.host_gap.as_ref().unwrap().seconds_per_op;
    let (from_trace, from_ops) = (gap(&fitted.tables), gap(&executor_tables));
    assert!(
        (from_trace / from_ops - 1.0).abs() <= 0.10,
        "host gap per op: trace {from_trace:e} s, executor {from_ops:e} s"
    );
    // Every op class the run timed is covered by the trace.
    for class in [
        "gemm",
        "attention",
        "memory",
        "collective",
        "host_gap",
        "wait",
    ] {
        let c = v["op_classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["class"] == class)
            .unwrap();
        assert!(c["keys"].as_u64().unwrap() > 0, "{class}: {c}");
    }
}

/// Writes `text` (gzipped when `gz`) and runs `calibrate --trace` on it: the exit code and
/// the error text.
fn refused(dir: &Path, name: &str, bytes: &[u8], gz: bool) -> String {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    if gz {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        let mut all = e.finish().unwrap();
        all.truncate(all.len() / 2);
        f.write_all(&all).unwrap();
    } else {
        f.write_all(bytes).unwrap();
    }
    let out = parsim()
        .args(["calibrate", "--gpu", "cpu", "--trace"])
        .arg(&path)
        .output()
        .unwrap();
    // 1: a clear error; 101 would be a panic.
    assert_eq!(out.status.code(), Some(1), "{name}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn malformed_traces_are_refused_by_field_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = |ts: &str, dur: &str| {
        format!(
            r#"{{"traceEvents": [{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {ts}, "dur": {dur}, "args": {{}}}}]}}"#
        )
    };
    let cases: [(&str, String, bool, &str); 8] = [
        (
            "truncated.json",
            kernel("1", "2")[..60].to_string(),
            false,
            "not a Kineto trace",
        ),
        ("truncated.json.gz", kernel("1", "2"), true, "gzip"),
        (
            "missing-dur.json",
            kernel("1", "null"),
            false,
            "`dur` must be a number",
        ),
        (
            "negative-dur.json",
            kernel("1", "-3"),
            false,
            "`dur` must be finite and not negative",
        ),
        (
            "nan-dur.json",
            kernel("1", "NaN"),
            false,
            "not a Kineto trace",
        ),
        (
            "huge-ts.json",
            kernel("1e999", "1"),
            false,
            "not a Kineto trace",
        ),
        (
            "no-events.json",
            r#"{"schemaVersion": 1}"#.into(),
            false,
            "no `traceEvents`",
        ),
        (
            "no-kernels.json",
            r#"{"traceEvents": []}"#.into(),
            false,
            "no kernel events",
        ),
    ];
    for (name, text, gz, want) in cases {
        let err = refused(dir.path(), name, text.as_bytes(), gz);
        assert!(err.contains(want), "{name}: {err}");
        if want.starts_with('`') {
            assert!(
                err.contains("traceEvents[0]"),
                "{name} names the event: {err}"
            );
        }
    }
}
