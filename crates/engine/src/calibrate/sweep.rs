//! The calibration sweep of `parsim execute --calibrate`: plans chosen to separate the time
//! model's parameters (GEMMs across size and shape, attention across sequence lengths,
//! memory-bound layers, TP/PP/DP collectives), run on the executor and turned into
//! [`Measurement`]s for [`super::profile_fit::fit_profile`].
//!
//! The CPU backend runs ranks as threads of one process: the sweep keeps every run within the
//! machine's cores so that each rank has its own core, as the model assumes one device per rank.

use super::measurements::Measurement;
use crate::config::{Config, ConfigError, Dtype, Layer, Precision, Resolved};
use crate::lower::{lower, LowerError, LowerOptions};
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
    Plan { label: String, source: LowerError },
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

pub(super) fn point(label: &str, holdout: bool, v: Value) -> SweepPoint {
    let base = json!({
        "model": {"name": label, "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_query_groups": 2,
                  "ffn_hidden_size": 512, "vocab_size": 256, "max_position_embeddings": 4096},
        "cluster": {"num_gpus": 1, "gpus_per_node": 2},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 0},
        "training": {"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 2, "recompute": "none"}
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

/// The rule that picks the held-out points of a built-in sweep, fixed before any run and
/// blind to every error: every third point in sweep order (the 3rd, 6th, ...).
pub fn held_out_by_rule(index: usize) -> bool {
    index % 3 == 2
}

/// Points from (label, configuration) in sweep order, held out by [`held_out_by_rule`].
fn by_rule(
    points: Vec<(&str, Value)>,
    make: impl Fn(&str, bool, Value) -> SweepPoint,
) -> Vec<SweepPoint> {
    points
        .into_iter()
        .enumerate()
        .map(|(i, (label, v))| make(label, held_out_by_rule(i), v))
        .collect()
}

/// `a` with `b` merged in.
pub(super) fn with(mut a: Value, b: Value) -> Value {
    crate::config::load::merge(&mut a, b);
    a
}

/// A sweep point prepared for the CUDA backend: the profile `gpu` (the base the fit starts
/// from), the bf16 mixed-precision recipe with fp32 gradients that the backend runs.
pub fn for_cuda(mut c: Config, gpu: &str) -> Config {
    c.cluster.gpu = gpu.to_string();
    c.training.precision = Precision::Bf16;
    c.training.grad_dtype = Dtype::Fp32;
    c
}

/// The built-in CPU sweep: every run on two ranks, so each rank has its own core as the model
/// assumes and every run shares the host's caches and memory bandwidth the same way (a
/// single-rank run's ops run a few percent faster than the same ops beside a second rank): the
/// shapes (hidden size, sequence, micro batch, recompute) and the mixes a plan chooses among
/// (TP with and without SP; PP 1F1B, interleaved and ZB-V; DP with ZeRO 0-3; CP p2p, zigzag,
/// all-gather and a2a; EP), three points per family in sweep order, so that the rule (every
/// third point held out, [`held_out_by_rule`]) holds out one run of each family at a shape
/// between its two fitting runs'. Head dimension 64 throughout.
pub fn default_cpu_sweep() -> Vec<SweepPoint> {
    let mut points = shape_families();
    points.extend(tp_pp_families());
    points.extend(zero_cp_ep_families());
    by_rule(points, point)
}

/// Two ranks.
pub(super) fn two(p: Value) -> Value {
    with(json!({"cluster": {"num_gpus": 2}}), p)
}

/// Data parallel over two ranks without ZeRO, two micro batches per rank unless `p` says
/// otherwise.
pub(super) fn dp(p: Value) -> Value {
    two(with(json!({"training": {"global_batch_size": 4}}), p))
}

/// A model shape: hidden size, query heads, query groups, FFN size.
pub(super) fn h(hidden: u32, heads: u32, groups: u32, ffn: u32) -> Value {
    json!({"model": {"hidden_size": hidden, "num_attention_heads": heads, "num_query_groups": groups, "ffn_hidden_size": ffn}})
}

fn h384() -> Value {
    h(384, 6, 3, 768)
}

fn h320() -> Value {
    h(320, 5, 5, 640)
}

/// Hidden 384 for TP and CP, which split heads and query groups: 6 / 2.
fn h384s() -> Value {
    h(384, 6, 2, 768)
}

pub(super) fn tr(t: Value) -> Value {
    json!({ "training": t })
}

pub(super) fn par(p: Value, t: Value) -> Value {
    json!({"parallel": p, "training": t})
}

/// Four layers (two per pipeline stage).
pub(super) fn l4(v: Value) -> Value {
    with(json!({"model": {"num_layers": 4}}), v)
}

/// Four experts, top-2, with balanced routing (Megatron's benchmarking switch): the sweep
/// measures the hardware, not an untrained router's imbalance.
pub(super) fn moe() -> Value {
    json!({"model": {"num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "moe_router_force_load_balancing": true}})
}

pub(super) fn pp(schedule: &str, vpp: u32) -> Value {
    json!({"pp": 2, "vpp": vpp, "schedule": schedule})
}

pub(super) fn cp(comm: &str) -> Value {
    json!({"cp": 2, "cp_comm": comm})
}

/// Data parallel without ZeRO over hidden size, sequence, micro batch and recompute.
fn shape_families() -> Vec<(&'static str, Value)> {
    vec![
        ("dp2 h256 s256", dp(json!({}))),
        (
            "dp2 h384 s512",
            dp(with(h384(), tr(json!({"seq_length": 512})))),
        ),
        (
            "dp2 h320 s384",
            dp(with(h320(), tr(json!({"seq_length": 384})))),
        ),
        (
            "dp2 attention h128 s1024",
            dp(with(h(128, 2, 2, 256), tr(json!({"seq_length": 1024})))),
        ),
        (
            "dp2 attention h192 s512",
            dp(with(h(192, 3, 3, 512), tr(json!({"seq_length": 512})))),
        ),
        (
            "dp2 attention h128 s768",
            dp(with(h(128, 2, 1, 384), tr(json!({"seq_length": 768})))),
        ),
        (
            "dp2 mbs2 h256",
            dp(tr(json!({"micro_batch_size": 2, "global_batch_size": 8}))),
        ),
        (
            "dp2 mbs4 h384 s128",
            dp(with(
                h384(),
                tr(json!({"seq_length": 128, "micro_batch_size": 4, "global_batch_size": 8})),
            )),
        ),
        (
            "dp2 mbs2 h320 l3",
            dp(with(
                with(h320(), json!({"model": {"num_layers": 3}})),
                tr(json!({"micro_batch_size": 2, "global_batch_size": 8})),
            )),
        ),
        (
            "dp2 recompute full h256",
            dp(tr(json!({"recompute": "full"}))),
        ),
        (
            "dp2 recompute selective h384 s512",
            dp(with(
                h384(),
                tr(json!({"recompute": "selective", "seq_length": 512})),
            )),
        ),
        (
            "dp2 recompute full h320 s384",
            dp(with(
                h320(),
                tr(json!({"recompute": "full", "seq_length": 384})),
            )),
        ),
    ]
}

/// TP with and without SP; PP 1F1B, interleaved and ZB-V.
fn tp_pp_families() -> Vec<(&'static str, Value)> {
    vec![
        (
            "tp2 sp h256",
            two(par(json!({"tp": 2, "sp": true}), json!({}))),
        ),
        (
            "tp2 sp h384 s512",
            two(with(
                h384s(),
                par(json!({"tp": 2, "sp": true}), json!({"seq_length": 512})),
            )),
        ),
        (
            "tp2 sp h384 s384",
            two(with(
                h384s(),
                par(json!({"tp": 2, "sp": true}), json!({"seq_length": 384})),
            )),
        ),
        (
            "tp2 h256 s512",
            two(par(json!({"tp": 2}), json!({"seq_length": 512}))),
        ),
        (
            "tp2 h384 mbs2",
            two(with(
                h384s(),
                par(
                    json!({"tp": 2}),
                    json!({"micro_batch_size": 2, "global_batch_size": 4}),
                ),
            )),
        ),
        (
            "tp2 h256 s384 mbs2",
            two(par(
                json!({"tp": 2}),
                json!({"seq_length": 384, "micro_batch_size": 2, "global_batch_size": 4}),
            )),
        ),
        (
            "pp2 1f1b h256",
            two(l4(par(pp("1f1b", 1), json!({"global_batch_size": 4})))),
        ),
        (
            "pp2 1f1b h384 s512",
            two(l4(with(
                h384(),
                par(
                    pp("1f1b", 1),
                    json!({"seq_length": 512, "global_batch_size": 4}),
                ),
            ))),
        ),
        (
            "pp2 1f1b h320 s384",
            two(l4(with(
                h320(),
                par(
                    pp("1f1b", 1),
                    json!({"seq_length": 384, "global_batch_size": 4}),
                ),
            ))),
        ),
        (
            "pp2 interleaved h256",
            two(l4(par(
                pp("interleaved-1f1b", 2),
                json!({"global_batch_size": 4}),
            ))),
        ),
        (
            "pp2 interleaved h384 s512",
            two(l4(with(
                h384(),
                par(
                    pp("interleaved-1f1b", 2),
                    json!({"seq_length": 512, "global_batch_size": 4}),
                ),
            ))),
        ),
        (
            "pp2 interleaved h320 s384",
            two(l4(with(
                h320(),
                par(
                    pp("interleaved-1f1b", 2),
                    json!({"seq_length": 384, "global_batch_size": 4}),
                ),
            ))),
        ),
        (
            "pp2 zb-v h256",
            two(l4(par(pp("zb-v", 2), json!({"global_batch_size": 4})))),
        ),
        (
            "pp2 zb-v h384 s512",
            two(l4(with(
                h384(),
                par(
                    pp("zb-v", 2),
                    json!({"seq_length": 512, "global_batch_size": 4}),
                ),
            ))),
        ),
        (
            "pp2 zb-v h320 s384",
            two(l4(with(
                h320(),
                par(
                    pp("zb-v", 2),
                    json!({"seq_length": 384, "global_batch_size": 4}),
                ),
            ))),
        ),
    ]
}

/// DP with ZeRO 1-3; CP p2p, zigzag, all-gather and a2a; EP.
fn zero_cp_ep_families() -> Vec<(&'static str, Value)> {
    vec![
        (
            "dp2 zero1 h256",
            two(par(json!({"zero": 1}), json!({"global_batch_size": 4}))),
        ),
        (
            "dp2 zero3 h384",
            two(with(
                h384(),
                par(json!({"zero": 3}), json!({"global_batch_size": 4})),
            )),
        ),
        (
            "dp2 zero2 h320",
            two(with(
                h320(),
                par(json!({"zero": 2}), json!({"global_batch_size": 4})),
            )),
        ),
        (
            "dp2 zero3 h256 s512",
            two(par(
                json!({"zero": 3}),
                json!({"seq_length": 512, "global_batch_size": 4}),
            )),
        ),
        (
            "dp2 zero2 h384",
            two(with(
                h384(),
                par(json!({"zero": 2}), json!({"global_batch_size": 4})),
            )),
        ),
        (
            "dp2 zero3 h320 s384",
            two(with(
                h320(),
                par(
                    json!({"zero": 3}),
                    json!({"seq_length": 384, "global_batch_size": 4}),
                ),
            )),
        ),
        (
            "cp2 p2p h256 s512",
            two(par(cp("p2p"), json!({"seq_length": 512}))),
        ),
        (
            "cp2 p2p h384 s1024",
            two(with(h384s(), par(cp("p2p"), json!({"seq_length": 1024})))),
        ),
        (
            "cp2 p2p h384 s768",
            two(with(h384s(), par(cp("p2p"), json!({"seq_length": 768})))),
        ),
        (
            "cp2 zigzag h256 s512",
            two(par(cp("zigzag"), json!({"seq_length": 512}))),
        ),
        (
            "cp2 zigzag h384 s1024",
            two(with(
                h384s(),
                par(cp("zigzag"), json!({"seq_length": 1024})),
            )),
        ),
        (
            "cp2 zigzag h256 s768",
            two(par(cp("zigzag"), json!({"seq_length": 768}))),
        ),
        (
            "cp2 allgather h256 s512",
            two(par(cp("allgather"), json!({"seq_length": 512}))),
        ),
        (
            "cp2 allgather h384 s1024",
            two(with(
                h384s(),
                par(cp("allgather"), json!({"seq_length": 1024})),
            )),
        ),
        (
            "cp2 allgather h384 s768",
            two(with(
                h384s(),
                par(cp("allgather"), json!({"seq_length": 768})),
            )),
        ),
        (
            "cp2 a2a h256 s512",
            two(par(cp("a2a"), json!({"seq_length": 512}))),
        ),
        (
            "cp2 a2a h384 s1024",
            two(with(h384s(), par(cp("a2a"), json!({"seq_length": 1024})))),
        ),
        (
            "cp2 a2a h384 s768",
            two(with(h384s(), par(cp("a2a"), json!({"seq_length": 768})))),
        ),
        (
            "ep2 moe h256",
            two(with(
                moe(),
                par(json!({"ep": 2}), json!({"global_batch_size": 4})),
            )),
        ),
        (
            "ep2 moe h384 s512",
            two(with(
                with(h384(), moe()),
                par(
                    json!({"ep": 2}),
                    json!({"seq_length": 512, "global_batch_size": 4}),
                ),
            )),
        ),
        (
            "ep2 moe h320 s384",
            two(with(
                with(h320(), moe()),
                par(
                    json!({"ep": 2}),
                    json!({"seq_length": 384, "global_batch_size": 4}),
                ),
            )),
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
        rendezvous_s: None,
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
            if let Some(s) = m.rendezvous_s {
                v["rendezvous_s"] = json!(s);
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
