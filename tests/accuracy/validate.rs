//! `parsim validate`, the validation harness, on samples of each source (every K-th row), so
//! it stays within CI's budget; tests/accuracy/published_throughput.rs runs the whole harness once, for the guards
//! and the accuracy page. Each check derives its value another way: the measured step from the
//! published table read here on its own, the prediction from an estimate of the row's printed
//! settings typed here, and the summary figures recomputed from the rows the command prints.

use assert_cmd::cargo::cargo_bin_cmd;
use assert_cmd::Command;
use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::estimate;
use parsim::validate::{self, Options, Outcome, Row, Source};
use serde_json::{json, Value};

fn parsim() -> Command {
    cargo_bin_cmd!("parsim")
}

/// The rows of the published table whose source starts with `prefix`, read straight from the
/// data file.
fn table(prefix: &str) -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/data/published-runs-2026.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["source"].as_str().unwrap().starts_with(prefix))
        .unwrap()["rows"]
        .as_array()
        .unwrap()
        .clone()
}

fn step_of(overlay: Value) -> f64 {
    let c = Config::from_layers(&[Layer::overrides(overlay)]).unwrap();
    estimate(&Resolved::new(c).unwrap()).unwrap().time.step_s
}

fn predicted(r: &Row) -> f64 {
    match &r.outcome {
        Outcome::Predicted(p) => p.step_s,
        other => panic!("{}: {other:?}", r.label),
    }
}

/// Megatron-Bridge rows 0, 40, ..., 240: each printed row is the estimate of the settings the
/// table prints (typed here from the table) with Megatron-Core's defaults, and its measured
/// step is global batch x sequence over (tokens/s per GPU x GPUs).
#[test]
fn megatron_bridge_rows_are_estimates_of_their_printed_settings() {
    let opts = Options {
        sources: vec![Source::MegatronBridge],
        every: 40,
    };
    let report = validate::run(&opts, &|_, _| {}).unwrap();
    let rows: Vec<&Row> = report.rows.iter().collect();
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        [0, 40, 80, 120, 160, 200, 240]
    );
    // 26.04.01 LLAMA3.1_405B, DGX-GB300, 256 GPUs, FP8, GBS 1536, MBS 1, seq 8192, TP 4 PP 8
    // VP 4: 1024 tokens/s per GPU. The 405B recipe counts the embedding and the loss as
    // pipeline slots; every performance recipe reduces gradients in bf16
    // (perf_recipes/_common.py's _benchmark_common) and FP8 keeps and gathers its weights in
    // FP8 (training/mixed_precision.py, fp8_param_gather).
    let r = rows[2];
    assert_eq!(r.measured.step_s, Some(1536.0 * 8192.0 / (1024.0 * 256.0)));
    let want = step_of(json!({
        "model": {"preset": "llama3-405b"},
        "cluster": {"gpu": "gb300", "num_gpus": 256},
        "parallel": {"tp": 4, "pp": 8, "cp": 1, "vpp": 4, "ep": 1, "zero": 1,
                     "schedule": "interleaved-1f1b",
                     "account_for_embedding_in_pipeline_split": true,
                     "account_for_loss_in_pipeline_split": true},
        "training": {"precision": "fp8", "fp8_recipe": "current", "seq_length": 8192,
                     "micro_batch_size": 1, "global_batch_size": 1536, "recompute": "none",
                     "grad_dtype": "bf16", "fp8_param_gather": true}
    }));
    assert_eq!(predicted(r), want, "{}", r.label);
    // 26.02 LLAMA3_70B, DGX-GB300, 64 GPUs, NVFP4, GBS 256, MBS 1, TP 1 PP 4 VP 5: 6798;
    // NVFP4 keeps and gathers its weights in NVFP4 (bf16_with_nvfp4_mixed: fp4_param_gather).
    let r = rows[5];
    assert_eq!(r.measured.step_s, Some(256.0 * 8192.0 / (6798.0 * 64.0)));
    let want = step_of(json!({
        "model": {"preset": "llama3-70b"},
        "cluster": {"gpu": "gb300", "num_gpus": 64},
        "parallel": {"tp": 1, "pp": 4, "cp": 1, "vpp": 5, "ep": 1, "zero": 1,
                     "schedule": "interleaved-1f1b"},
        "training": {"precision": "nvfp4", "seq_length": 8192, "micro_batch_size": 1,
                     "global_batch_size": 256, "recompute": "none", "grad_dtype": "bf16",
                     "fp8_param_gather": true}
    }));
    assert_eq!(predicted(r), want, "{}", r.label);
    // 26.04 Nemotron_3_Super, DGX-GB200, 64 GPUs, MXFP8, GBS 512, MBS 1, seq 8192, TP 2 EP 64:
    // 6674. Its recipe (perf_recipes/nemotronh/gb200/nemotronh.py) recomputes nothing, reduces
    // gradients in bf16, gathers its MXFP8 weights in MXFP8, trains one shared MTP block and
    // dispatches with flex over HybridEP;
    // every MoE model's rows force-balance their tokens.
    let r = rows[4];
    assert_eq!(r.measured.step_s, Some(512.0 * 8192.0 / (6674.0 * 64.0)));
    let want = step_of(json!({
        "model": {"preset": "nemotron-3-super", "mtp_num_layers": 1,
                  "moe_router_force_load_balancing": true},
        "cluster": {"gpu": "gb200", "num_gpus": 64},
        "parallel": {"tp": 2, "pp": 1, "cp": 1, "vpp": 1, "ep": 64, "zero": 1,
                     "moe_token_dispatcher": "flex", "moe_flex_dispatcher_backend": "hybridep"},
        "training": {"precision": "mxfp8", "seq_length": 8192, "micro_batch_size": 1,
                     "global_batch_size": 512, "recompute": "none", "grad_dtype": "bf16",
                     "fp8_param_gather": true}
    }));
    assert_eq!(predicted(r), want, "{}", r.label);
    // Every row the table prints is a row of the report, expressible or with its reason.
    assert_eq!(table("NVIDIA Megatron-Bridge").len(), 278);
}

/// vTrain's first row: GPT hidden 1024, 24 layers, 16 heads, on 2 A100s at PP 2, micro batch
/// 8, global batch 16, sequence 1024, 372.160408 ms; its prediction is the estimate of that
/// Megatron GPT as typed here (fp16, full recomputation, no fused attention, DeepSpeed).
#[test]
fn a_vtrain_row_is_the_estimate_of_its_printed_settings() {
    let opts = Options {
        sources: vec![Source::Vtrain],
        every: 1440,
    };
    let report = validate::run(&opts, &|_, _| {}).unwrap();
    let r = &report.rows[0];
    let raw = &table("vTrain")[0];
    assert_eq!(raw["metric_value"].as_f64(), Some(372.160408));
    assert_eq!(r.measured.step_s, Some(0.372160408));
    let want = step_of(json!({
        "model": {"name": "gpt", "num_layers": 24, "hidden_size": 1024,
                  "num_attention_heads": 16, "num_query_groups": 16, "ffn_hidden_size": 4096,
                  "vocab_size": 50257, "make_vocab_size_divisible_by": 128,
                  "max_position_embeddings": 1024, "position_embedding": "learned",
                  "activation": "gelu", "normalization": "layernorm", "add_bias_linear": true,
                  "add_qkv_bias": true, "tied_embeddings": true, "hidden_dropout": 0.1,
                  "attention_dropout": 0.1},
        "cluster": {"gpu": "a100-80g", "num_gpus": 2, "gpus_per_node": 8},
        "parallel": {"tp": 1, "pp": 2, "dp": 1, "cp": 1, "vpp": 1, "sp": false, "zero": 0,
                     "schedule": "1f1b"},
        "training": {"framework": "deepspeed", "precision": "fp16", "grad_dtype": "fp32",
                     "recompute": "full", "flash_attention": false, "flops_attention": "full",
                     "seq_length": 1024, "micro_batch_size": 8, "global_batch_size": 16}
    }));
    assert_eq!(predicted(r), want);
}

/// Median, worst and signed mean of |measured / predicted - 1|, and the coverage, of the rows
/// of `source` in a `--json` document: recomputed here from its rows.
fn recomputed(doc: &Value, source: &str) -> (usize, usize, f64, f64, f64, usize) {
    let mut errors = Vec::new();
    let (mut rows, mut covered) = (0, 0);
    for r in doc["rows"].as_array().unwrap() {
        if r["source"] != source {
            continue;
        }
        rows += 1;
        let (Some(m), Some(p)) = (
            r["measured"]["step_s"].as_f64(),
            r["outcome"]["detail"]["step_s"].as_f64(),
        ) else {
            continue;
        };
        errors.push(m / p - 1.0);
        let (lo, hi) = (
            r["outcome"]["detail"]["step_s_p10"].as_f64().unwrap(),
            r["outcome"]["detail"]["step_s_p90"].as_f64().unwrap(),
        );
        covered += usize::from(lo <= m && m <= hi);
    }
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let n = abs.len();
    let median = if n % 2 == 1 {
        abs[n / 2]
    } else {
        (abs[n / 2 - 1] + abs[n / 2]) / 2.0
    };
    let mean = errors.iter().sum::<f64>() / n as f64;
    (rows, n, median, abs[n - 1], mean, covered)
}

/// `--json` on a sample of vTrain and BLOOM: every printed figure is what the rows it prints
/// give, and every row's measured figures are the table's (vTrain's milliseconds; BLOOM's
/// seconds, memory as labelled in GiB and its out-of-memory label).
#[test]
fn json_figures_are_those_of_its_rows() {
    let out = parsim()
        .args([
            "validate",
            "--source",
            "vtrain,bloom-tr11",
            "--sample",
            "12",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty(), "no progress bar off a terminal");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    for s in doc["sources"].as_array().unwrap() {
        let key = s["source"].as_str().unwrap();
        let (rows, n, median, worst, mean, covered) = recomputed(&doc, key);
        let f = &s["figures"];
        assert_eq!(f["rows"], rows, "{key}");
        assert_eq!(f["predicted"], n, "{key}");
        assert!(
            (f["median"].as_f64().unwrap() - median).abs() < 1e-12,
            "{key}"
        );
        assert!(
            (f["worst"].as_f64().unwrap() - worst).abs() < 1e-12,
            "{key}"
        );
        assert!(
            (f["mean_signed"].as_f64().unwrap() - mean).abs() < 1e-12,
            "{key}"
        );
        assert_eq!(f["covered"], covered, "{key}");
    }
    let vtrain = table("vTrain");
    let bloom = table("BigScience BLOOM");
    for r in doc["rows"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(i % 12, 0);
        let m = &r["measured"];
        if r["source"] == "vtrain" {
            let ms = vtrain[i]["metric_value"].as_f64().unwrap();
            assert!((m["step_s"].as_f64().unwrap() - ms / 1e3).abs() < 1e-15);
        } else {
            assert_eq!(m["step_s"].as_f64(), bloom[i]["metric_value"].as_f64());
            let gib = bloom[i]["peak_memory_gb_as_labeled"].as_f64();
            assert_eq!(
                m["memory_bytes"].as_u64(),
                gib.map(|g| (g * (1u64 << 30) as f64).round() as u64)
            );
            assert_eq!(m["fits"].as_bool(), bloom[i]["oom"].as_bool().map(|o| !o));
        }
    }
    assert_eq!(
        doc["rows"].as_array().unwrap().len(),
        1440 / 12 + 91usize.div_ceil(12)
    );
}

/// `--rows` lists every row of the sample, each once.
#[test]
fn rows_lists_every_row() {
    let out = parsim()
        .args([
            "validate",
            "--source",
            "bloom-tr11",
            "--sample",
            "10",
            "--rows",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let listed = text.lines().filter(|l| l.contains(" bloom-tr11 ")).count();
    assert_eq!(listed, 10, "{text}");
    assert!(text.contains("every 10th row"), "{text}");
}

/// Bad flags: an unknown source names the known ones; `--write-docs` refuses a sample or a
/// single source; a sample of 0 is a syntax error.
#[test]
fn bad_flags_are_refused_by_name() {
    let out = parsim()
        .args(["validate", "--source", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--source 'nope'") && err.contains("megatron-bridge"),
        "{err}"
    );
    for args in [
        &["validate", "--write-docs", "x.md", "--sample", "5"][..],
        &["validate", "--write-docs", "x.md", "--source", "vtrain"][..],
    ] {
        let out = parsim().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--write-docs"));
    }
    let out = parsim()
        .args(["validate", "--sample", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The Nemotron 3 Super recipes that ran on GB200 (TP 2, EP 64) fit in parsim's memory model
/// at their settings: every one of them ran (the table's rows), so a prediction over capacity
/// would be a missing or overstated memory term. (The GB300 NVFP4, B300 and B200 MXFP8 rows
/// are predicted over their capacity today; see the accuracy page's fits column.)
#[test]
fn nemotron_3_super_gb200_recipes_fit() {
    let opts = Options {
        sources: vec![Source::MegatronBridge],
        every: 1,
    };
    let report = validate::run(&opts, &|_, _| {}).unwrap();
    let rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.model == "Nemotron_3_Super" && r.system == "DGX-GB200")
        .collect();
    assert_eq!(rows.len(), 10);
    for r in rows {
        match &r.outcome {
            Outcome::Predicted(p) => assert!(p.fits, "{}", r.label),
            other => panic!("{}: {other:?}", r.label),
        }
    }
}
