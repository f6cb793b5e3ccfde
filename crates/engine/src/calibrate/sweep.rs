//! The calibration sweep of `parsim execute --calibrate`: plans chosen to separate the time
//! model's parameters (GEMMs across size and shape, attention across sequence lengths,
//! memory-bound layers, TP/PP/DP collectives), run on the executor and turned into
//! [`Measurement`]s for [`super::profile_fit::fit_profile`].
//!
//! The CPU backend runs ranks as threads of one process: the sweep keeps every run within the
//! machine's cores so that each rank has its own core, as the model assumes one device per rank.

use super::measurements::Measurement;
use crate::config::{Config, ConfigError, Dtype, Layer, Precision, Resolved};
use crate::lower::{lower, LowerOptions, PlanError};
use parsim_plan::plan::Plan;
use parsim_plan::run::RunLength;
use parsim_plan::run_report::RunReport;
use serde_json::{json, Value};
use statrs::statistics::{Data, Median};
use std::path::Path;

/// One configuration of the sweep.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    pub label: String,
    pub config: Config,
    /// Held out of the fit, to check the fitted profile on runs it did not see.
    pub holdout: bool,
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("sweep point '{label}': {source}")]
    Config { label: String, source: ConfigError },
    #[error("sweep point '{label}': {source}")]
    Plan { label: String, source: PlanError },
    #[error("sweep point '{label}': {message}")]
    Run { label: String, message: String },
    #[error("{path}:{line}: {message}")]
    File {
        path: String,
        line: usize,
        message: String,
    },
}

/// A configuration prepared for the CPU backend: its profile, fp32 everywhere.
pub fn for_cpu(mut c: Config) -> Config {
    c.cluster.gpu = "cpu".into();
    c.training.precision = Precision::Fp32;
    c.training.grad_dtype = Dtype::Fp32;
    c
}

fn point(label: &str, holdout: bool, v: Value) -> SweepPoint {
    let base = json!({
        "model": {"name": label, "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_query_groups": 2,
                  "ffn_hidden_size": 256, "vocab_size": 256, "max_position_embeddings": 4096},
        "cluster": {"num_gpus": 1, "gpus_per_node": 2},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 0},
        "training": {"seq_length": 128, "micro_batch_size": 1, "global_batch_size": 2, "recompute": "none"}
    });
    SweepPoint {
        label: label.to_string(),
        config: for_cpu(layered(base, v)),
        holdout,
    }
}

/// A built-in point's configuration: `v` over `base`.
fn layered(base: Value, v: Value) -> Config {
    Config::from_layers(&[Layer::overrides(base), Layer::overrides(v)])
        .expect("built-in sweep point parses")
}

/// A sweep point prepared for the CUDA backend: the profile `gpu` (the base the fit starts
/// from), the bf16 mixed-precision recipe with fp32 gradients that the backend runs.
pub fn for_cuda(mut c: Config, gpu: &str) -> Config {
    c.cluster.gpu = gpu.to_string();
    c.training.precision = Precision::Bf16;
    c.training.grad_dtype = Dtype::Fp32;
    c
}

/// The built-in CPU sweep (at most 2 ranks per run). Held-out points use model shapes and
/// parallel mixes that no fitting point has.
pub fn default_cpu_sweep() -> Vec<SweepPoint> {
    vec![
        point("gemm-small h128", false, json!({})),
        point(
            "gemm-large h384 f1024",
            false,
            json!({"model": {"hidden_size": 384, "num_attention_heads": 6, "num_query_groups": 6, "ffn_hidden_size": 1024}}),
        ),
        point(
            "gemm-wide f2048",
            false,
            json!({"model": {"hidden_size": 256, "ffn_hidden_size": 2048}}),
        ),
        point(
            "attention s512",
            false,
            json!({"model": {"hidden_size": 64}, "training": {"seq_length": 512}}),
        ),
        point(
            "attention s1024 h128",
            false,
            json!({"training": {"seq_length": 1024}}),
        ),
        point(
            "kernels h32 l8",
            false,
            json!({"model": {"num_layers": 8, "hidden_size": 32, "ffn_hidden_size": 64}, "training": {"seq_length": 64, "global_batch_size": 8}}),
        ),
        point(
            "tp2 sp h256",
            false,
            json!({"model": {"hidden_size": 256, "ffn_hidden_size": 512}, "cluster": {"num_gpus": 2}, "parallel": {"tp": 2, "sp": true}}),
        ),
        point(
            "dp2 zero1 h256",
            false,
            json!({"model": {"hidden_size": 256, "ffn_hidden_size": 512}, "cluster": {"num_gpus": 2}, "parallel": {"zero": 1}, "training": {"global_batch_size": 4}}),
        ),
        point(
            "pp2 1f1b h256",
            false,
            json!({"model": {"hidden_size": 256, "ffn_hidden_size": 512, "num_layers": 4}, "cluster": {"num_gpus": 2}, "parallel": {"pp": 2}, "training": {"global_batch_size": 4}}),
        ),
        point(
            "recompute full h256",
            false,
            json!({"model": {"hidden_size": 256, "ffn_hidden_size": 512}, "training": {"recompute": "full"}}),
        ),
        point(
            "tp2 sp h384 s128",
            false,
            json!({"model": {"hidden_size": 384, "num_attention_heads": 6, "num_query_groups": 6, "ffn_hidden_size": 768}, "cluster": {"num_gpus": 2}, "parallel": {"tp": 2, "sp": true}}),
        ),
        point(
            "tp2 h128 s512",
            false,
            json!({"cluster": {"num_gpus": 2}, "parallel": {"tp": 2, "sp": false}, "training": {"seq_length": 512}}),
        ),
        point(
            "dp2 zero2 h128",
            false,
            json!({"cluster": {"num_gpus": 2}, "parallel": {"zero": 2}, "training": {"global_batch_size": 4}}),
        ),
        // Held out: other shapes and mixes.
        point(
            "held-out h192 s384 l3",
            true,
            json!({"model": {"num_layers": 3, "hidden_size": 192, "num_attention_heads": 6, "num_query_groups": 3, "ffn_hidden_size": 768}, "training": {"seq_length": 384}}),
        ),
        point(
            "held-out tp2 pp1 h320",
            true,
            json!({"model": {"hidden_size": 320, "num_attention_heads": 8, "num_query_groups": 4, "ffn_hidden_size": 896}, "cluster": {"num_gpus": 2}, "parallel": {"tp": 2, "sp": true}, "training": {"seq_length": 256}}),
        ),
        point(
            "held-out pp2 zb-h1 h192",
            true,
            json!({"model": {"hidden_size": 192, "num_attention_heads": 6, "num_query_groups": 3, "ffn_hidden_size": 512, "num_layers": 4}, "cluster": {"num_gpus": 2}, "parallel": {"pp": 2, "schedule": "zb-h1"}, "training": {"global_batch_size": 4, "recompute": "selective"}}),
        ),
    ]
}

/// A point of the built-in GPU sweep: `v` over a 2-layer, hidden-2048 model (GQA 16/8, head
/// dim 128, vocab 32768) at seq 2048 on one GPU.
fn gpu_point(label: &str, holdout: bool, v: Value) -> SweepPoint {
    let base = json!({
        "model": {"name": label, "num_layers": 2, "hidden_size": 2048, "num_attention_heads": 16,
                  "num_query_groups": 8, "ffn_hidden_size": 5632, "vocab_size": 32768,
                  "max_position_embeddings": 16384},
        "cluster": {"num_gpus": 1, "gpus_per_node": 8},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 0},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 2,
                     "recompute": "none", "flash_attention": true}
    });
    SweepPoint {
        label: label.to_string(),
        config: layered(base, v),
        holdout,
    }
}

/// The built-in GPU sweep: one rank on one GPU (a rank per device, as the model assumes),
/// shapes at the scale of real layers (hidden 1024-4096, sequences 1k-16k, head dim 128) so
/// that launch overheads do not dominate; GEMM sizes and aspects, attention lengths, many thin
/// layers for the memory-bound ops, recompute, a larger micro batch. Held-out points use
/// shapes no fitting point has.
pub fn default_gpu_sweep() -> Vec<SweepPoint> {
    vec![
        gpu_point("gemm h2048 s2048", false, json!({})),
        gpu_point(
            "gemm h4096 f14336",
            false,
            json!({"model": {"hidden_size": 4096, "num_attention_heads": 32, "ffn_hidden_size": 14336}}),
        ),
        gpu_point(
            "gemm-wide h2048 f8192",
            false,
            json!({"model": {"ffn_hidden_size": 8192}}),
        ),
        gpu_point(
            "gemm h1024 s4096",
            false,
            json!({"model": {"hidden_size": 1024, "num_attention_heads": 8, "num_query_groups": 4, "ffn_hidden_size": 2816}, "training": {"seq_length": 4096}}),
        ),
        gpu_point(
            "attention s8192",
            false,
            json!({"training": {"seq_length": 8192}}),
        ),
        gpu_point(
            "attention s16384 h1024",
            false,
            json!({"model": {"hidden_size": 1024, "num_attention_heads": 8, "num_query_groups": 8, "ffn_hidden_size": 2816}, "training": {"seq_length": 16384}}),
        ),
        gpu_point(
            "kernels l8 h1024 s1024",
            false,
            json!({"model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "num_query_groups": 4, "ffn_hidden_size": 2816}, "training": {"seq_length": 1024}}),
        ),
        gpu_point(
            "recompute full h2048",
            false,
            json!({"training": {"recompute": "full"}}),
        ),
        gpu_point(
            "mbs2 h2048",
            false,
            json!({"training": {"micro_batch_size": 2, "global_batch_size": 4}}),
        ),
        // Held out: other shapes.
        gpu_point(
            "held-out h3072 s4096 l3",
            true,
            json!({"model": {"num_layers": 3, "hidden_size": 3072, "num_attention_heads": 24, "num_query_groups": 8, "ffn_hidden_size": 8192}, "training": {"seq_length": 4096}}),
        ),
        gpu_point(
            "held-out selective h2560 s8192",
            true,
            json!({"model": {"hidden_size": 2560, "num_attention_heads": 20, "num_query_groups": 4, "ffn_hidden_size": 6912}, "training": {"seq_length": 8192, "recompute": "selective"}}),
        ),
    ]
}

/// Reads a sweep file: one JSON object per line, `{"label": "...", "config": {...},
/// "holdout": false}`; comments (`#`) and empty lines skipped.
pub fn read_sweep(path: &Path) -> Result<Vec<SweepPoint>, SweepError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SweepError::File {
        path: origin.clone(),
        line: 0,
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let err = |message: String| SweepError::File {
            path: origin.clone(),
            line: i + 1,
            message,
        };
        let v: Value = serde_json::from_str(t).map_err(|e| err(format!("not JSON: {e}")))?;
        let config = v
            .get("config")
            .filter(|c| c.is_object())
            .ok_or_else(|| err("missing object `config`".into()))?;
        let cfg = Config::from_layers(&[Layer::overrides(config.clone())])
            .map_err(|e| err(e.to_string()))?;
        out.push(SweepPoint {
            label: v
                .get("label")
                .and_then(Value::as_str)
                .map_or_else(|| format!("line {}", i + 1), str::to_string),
            config: for_cpu(cfg),
            holdout: v.get("holdout").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    Ok(out)
}

/// Runs a Plan on a backend (the executor's CPU or CUDA runner, joined to the engine by the
/// CLI): the engine lowers and measures, it never runs anything itself.
pub type Runner<'a> =
    &'a dyn Fn(&Plan, &RunLength) -> Result<RunReport, Box<dyn std::error::Error + Send + Sync>>;

/// Runs one point with `run`: the median step (a step ends with its slowest rank) and the
/// largest tracked peak of any rank.
pub fn measure(
    p: &SweepPoint,
    index: usize,
    steps: u32,
    warmup: u32,
    run: Runner<'_>,
) -> Result<Measurement, SweepError> {
    let r = Resolved::new(p.config.clone()).map_err(|source| SweepError::Config {
        label: p.label.clone(),
        source,
    })?;
    let plan = lower(&r, &LowerOptions::default()).map_err(|source| SweepError::Plan {
        label: p.label.clone(),
        source,
    })?;
    let report = run(
        &plan,
        &RunLength {
            steps,
            warmup,
            precision: match p.config.training.precision {
                Precision::Bf16 => parsim_plan::plan::Precision::Bf16,
                _ => parsim_plan::plan::Precision::Fp32,
            },
        },
    )
    .map_err(|e| SweepError::Run {
        label: p.label.clone(),
        message: e.to_string(),
    })?;
    // Each rank's `step_s` holds the timed steps only.
    let timed = report
        .ranks
        .iter()
        .map(|k| k.step_s.len())
        .min()
        .unwrap_or(0);
    let per_step: Vec<f64> = (0..timed)
        .map(|i| report.ranks.iter().map(|k| k.step_s[i]).fold(0.0, f64::max))
        .collect();
    let peak = report
        .ranks
        .iter()
        .map(|k| k.peak.total())
        .max()
        .unwrap_or(0);
    // The op timings of the slowest rank: the step ends with it.
    let ops = report
        .ranks
        .iter()
        .max_by(|a, b| a.median_step_s().total_cmp(&b.median_step_s()))
        .map(|k| k.ops.clone())
        .unwrap_or_default();
    Ok(Measurement {
        line: index + 1,
        label: p.label.clone(),
        config: p.config.clone(),
        step_s: Data::new(per_step).median(),
        peak_bytes: (peak > 0).then_some(peak),
        holdout: p.holdout,
        ops,
    })
}

/// The measurements as JSONL (the `parsim calibrate --measurements` format), kept next to the
/// fitted profile as its provenance.
pub fn to_jsonl(ms: &[Measurement]) -> String {
    ms.iter()
        .map(|m| {
            let mut v = json!({"label": m.label, "config": m.config, "step_s": m.step_s, "peak_bytes": m.peak_bytes, "holdout": m.holdout});
            if !m.ops.is_empty() {
                v["ops"] = json!(m.ops);
            }
            v.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Measures every point `repeats` times in interleaved passes and keeps, per point, the run
/// with the smallest median step: interference from other work on the machine only ever adds
/// time, so the fastest repeat is the best estimate of the undisturbed run.
pub fn measure_all(
    points: &[SweepPoint],
    steps: u32,
    warmup: u32,
    repeats: u32,
    run: Runner<'_>,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Measurement>, SweepError> {
    let mut best: Vec<Option<Measurement>> = vec![None; points.len()];
    for _ in 0..repeats.max(1) {
        for (i, p) in points.iter().enumerate() {
            let m = measure(p, i, steps, warmup, run)?;
            if best[i].as_ref().is_none_or(|b| m.step_s < b.step_s) {
                best[i] = Some(m);
            }
            progress(i);
        }
    }
    Ok(best.into_iter().flatten().collect())
}
