//! The published throughput measurements (`calibration/data/published-throughput.json`), each
//! row turned into a parsim configuration, the TFLOP/s per GPU it reports and the FLOPs
//! convention that figure is counted with.
//!
//! Sources:
//! - Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
//!   Using Megatron-LM" (arXiv 2104.04473), Table 1: GPT 1.7B to 1T on A100 80GB, TP/PP with
//!   interleaving, full recomputation, fp16, sequence 2048. TFLOP/s counted with the paper's
//!   96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
//! - NVIDIA Megatron-LM README (Megatron-Core r0.8.0, July 2024), weak scaling on H100: GPT
//!   1.7B to 462B, vocabulary 131072, sequence 4096, TP communication overlap and DP
//!   overlap. TFLOP/s counted with Megatron's `num_floating_point_operations` (model FLOPs,
//!   every s x s attention score counted).
//! - MosaicML llm-foundry, `scripts/train/benchmarking/README.md`: MPT 125M to 70B with
//!   PyTorch FSDP (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2), A100 40/80 GB and H100,
//!   bf16 and fp8, sequences up to 65536. TFLOP/s counted as (6 N s + 12 l h s^2) per
//!   sequence with N the model's parameter count (its `flops_per_batch`).

use crate::config::{
    Activation, ClusterConfig, Config, CpComm, Dtype, FlopsAttention, ModelConfig, Normalization,
    ParallelConfig, PositionEmbedding, PpP2p, Precision, Recompute, ScheduleKind, TrainingConfig,
};
use serde::Deserialize;
use std::path::Path;

/// The data set shipped with the repository.
pub const DATA: &str = include_str!("../../../../calibration/data/published-throughput.json");

/// Which published table a row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// Narayanan et al. 2021, Table 1 (A100 80GB).
    Narayanan2021,
    /// Megatron-LM README, Megatron-Core r0.8.0 weak scaling (H100).
    MegatronCore2024,
    /// MosaicML llm-foundry benchmarks README (A100 40/80 GB, H100).
    LlmFoundry,
}

impl Source {
    pub const ALL: [Source; 3] = [
        Source::Narayanan2021,
        Source::MegatronCore2024,
        Source::LlmFoundry,
    ];

    /// Short name for tables.
    pub fn short(self) -> &'static str {
        match self {
            Source::Narayanan2021 => "Narayanan 2021",
            Source::MegatronCore2024 => "Megatron-Core 2024",
            Source::LlmFoundry => "llm-foundry",
        }
    }
}

/// How a source counts the FLOPs behind its TFLOP/s figure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlopsConvention {
    /// Narayanan et al. 2021, eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per step (four
    /// passes of the GEMMs: full recomputation counted, every attention score counted).
    Narayanan2021,
    /// Megatron-LM's `num_floating_point_operations` (2024): 12 B s l h^2 ((1 + g/a + s/h)
    /// (d a / h) + f/h + V/(2 l h)) per step; no recomputation, every attention score counted.
    Megatron2024,
    /// llm-foundry's `flops_per_batch`: 3 B (2 N s + 4 l h s^2), N = every parameter
    /// (learned positions included).
    LlmFoundry { params: u64 },
}

impl FlopsConvention {
    /// FLOPs of one step of `c` as the source counts them.
    pub fn flops_per_step(self, c: &Config) -> f64 {
        let m = &c.model;
        let t = &c.training;
        let b = t.global_batch_size as f64;
        let s = t.seq_length as f64;
        let l = m.num_layers as f64;
        let h = m.hidden_size as f64;
        match self {
            FlopsConvention::Narayanan2021 => {
                let v = m.padded_vocab_size(c.parallel.tp) as f64;
                96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
            }
            FlopsConvention::Megatron2024 => {
                let v = m.padded_vocab_size(c.parallel.tp) as f64;
                let a = m.num_attention_heads as f64;
                let g = m.num_query_groups as f64;
                let proj = m.head_dim() as f64 * a / h;
                let gated = if m.activation == Activation::Swiglu {
                    2.0
                } else {
                    1.0
                };
                let f = m.ffn_hidden_size as f64;
                12.0 * b
                    * s
                    * l
                    * h
                    * h
                    * ((1.0 + g / a + s / h) * proj + f / h * gated + v / (2.0 * l * h))
            }
            FlopsConvention::LlmFoundry { params } => {
                3.0 * b * (2.0 * params as f64 * s + 4.0 * l * h * s * s)
            }
        }
    }
}

/// One published measurement as a parsim configuration.
#[derive(Debug, Clone)]
pub struct Case {
    pub source: Source,
    /// Index of the row in its table.
    pub index: usize,
    /// A short label: model, sequence, GPUs, sharding.
    pub label: String,
    /// Shipped GPU profile name.
    pub gpu: &'static str,
    pub config: Config,
    /// Published model TFLOP/s per GPU (in `convention`).
    pub published_tflops: f64,
    pub convention: FlopsConvention,
    /// Parameter count the source states (llm-foundry), to check parsim's count against.
    pub published_params: Option<u64>,
    /// Settings the data does not give, and what was assumed for them. Empty when the row
    /// fully specifies its configuration.
    pub assumed: Vec<String>,
    /// Read from a chart rather than a table.
    pub approximate: bool,
    /// Why the row is outside what the model can represent (neither fitted nor held to the
    /// error bound; still predicted and reported).
    pub out_of_scope: Option<String>,
}

impl Case {
    /// True when the data gives every setting the estimate needs.
    pub fn fully_specified(&self) -> bool {
        self.assumed.is_empty()
    }

    /// FLOPs of one step as the source counts them.
    pub fn convention_flops(&self) -> f64 {
        self.convention.flops_per_step(&self.config)
    }

    /// The row as [`PublishedError::Underspecified`] when it is not fully specified.
    pub fn require_full(&self) -> Result<&Case, PublishedError> {
        if self.fully_specified() {
            Ok(self)
        } else {
            Err(PublishedError::Underspecified {
                row: format!("{} #{} {}", self.source.short(), self.index, self.label),
                missing: self.assumed.join("; "),
            })
        }
    }
}

/// Why the data set could not be read or a row turned into a configuration.
#[derive(Debug, thiserror::Error)]
pub enum PublishedError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("published-throughput data: {0}")]
    Json(#[from] serde_json::Error),
    #[error("published-throughput data has no table whose source starts with '{0}'")]
    MissingTable(&'static str),
    #[error("{row}: {message}")]
    Row { row: String, message: String },
    /// The row leaves settings open that the estimate needs.
    #[error("{row}: the data does not give {missing}")]
    Underspecified { row: String, missing: String },
}

#[derive(Deserialize)]
struct Document {
    tables: Vec<Table>,
}

#[derive(Deserialize)]
struct Table {
    source: String,
    rows: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct NarayananRow {
    model: String,
    num_attention_heads: u32,
    hidden_size: u64,
    num_layers: u32,
    ffn_hidden_size: u64,
    vocab_size: u64,
    seq_len: u64,
    tp: u32,
    pp: u32,
    dp: u32,
    num_gpus: u32,
    global_batch_size: u64,
    micro_batch_size: u64,
    interleave_chunks_per_rank: u32,
    recompute: String,
    precision: String,
    achieved_tflops_per_gpu: f64,
}

#[derive(Deserialize)]
struct MegatronRow {
    model: String,
    num_attention_heads: u32,
    hidden_size: u64,
    num_layers: u32,
    tp: u32,
    pp: u32,
    dp: u32,
    num_gpus: u32,
    global_batch_size: u64,
    seq_len: u64,
    vocab_size: u64,
    tflops_per_gpu: f64,
}

#[derive(Deserialize)]
struct FoundryRow {
    model: String,
    seqlen_t: u64,
    num_gpus: u32,
    gpu: String,
    microbatchsize: u64,
    gradaccum: u64,
    globalbatchsize: u64,
    precision: String,
    mp_mode: String,
    sharding_strategy: String,
    activation_checkpointing: String,
    activation_cpuoffload: String,
    numparams: u64,
    model_tflops_per_gpu: f64,
}

/// MPT shapes (d_model, n_heads, n_layers) from llm-foundry's
/// `scripts/train/yamls/pretrain/mpt-*.yaml`; vocabulary 50368, expansion ratio 4.
pub const MPT_SHAPES: &[(&str, u64, u32, u32)] = &[
    ("125m", 768, 12, 12),
    ("350m", 1024, 16, 24),
    ("760m", 1536, 12, 24),
    ("1b", 2048, 16, 24),
    ("3b", 2560, 20, 32),
    ("7b", 4096, 32, 32),
    ("13b", 5120, 40, 40),
    ("30b", 7168, 56, 48),
    ("70b", 8192, 64, 80),
];

/// MPT's vocabulary (the yamls' `vocab_size`).
pub const MPT_VOCAB: u64 = 50368;

fn row_err(source: Source, index: usize, message: impl Into<String>) -> PublishedError {
    PublishedError::Row {
        row: format!("{} #{index}", source.short()),
        message: message.into(),
    }
}

/// Reads the data set from a file.
pub fn load_file(path: &Path) -> Result<Vec<Result<Case, PublishedError>>, PublishedError> {
    let text = std::fs::read_to_string(path).map_err(|source| PublishedError::Io {
        path: path.display().to_string(),
        source,
    })?;
    load(&text)
}

/// The shipped data set, every row that turns into a configuration (rows that cannot are
/// returned as errors, in [`load`]).
pub fn shipped() -> Result<Vec<Result<Case, PublishedError>>, PublishedError> {
    load(DATA)
}

/// The highest MFU of the shipped published runs on the GPU profile `gpu` (each row's
/// TFLOP/s per GPU, as its source counts them, over the profile's dense peak for the row's
/// precision), with the row that reached it; `None` when no row ran on that GPU.
pub fn best_mfu(gpu: &str) -> Option<(f64, String)> {
    let profile = crate::config::GpuProfile::load(gpu).ok()?;
    shipped()
        .ok()?
        .into_iter()
        .flatten()
        .filter(|c| c.gpu == profile.name)
        .filter_map(|c| {
            let peak = profile.peak_flops_for(c.config.training.precision)?;
            let mfu = c.published_tflops * 1e12 / peak;
            mfu.is_finite().then(|| {
                (
                    mfu,
                    format!("{} #{} {}", c.source.short(), c.index, c.label),
                )
            })
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// Parses the data set: every row of the three tables, as a [`Case`] or the reason it cannot
/// be one.
pub fn load(text: &str) -> Result<Vec<Result<Case, PublishedError>>, PublishedError> {
    let doc: Document = serde_json::from_str(text)?;
    let table = |prefix: &'static str| {
        doc.tables
            .iter()
            .find(|t| t.source.starts_with(prefix))
            .ok_or(PublishedError::MissingTable(prefix))
    };
    let mut out = Vec::new();
    for (i, v) in table("Narayanan")?.rows.iter().enumerate() {
        out.push(
            NarayananRow::deserialize(v)
                .map_err(|e| row_err(Source::Narayanan2021, i, e.to_string()))
                .and_then(|r| narayanan(i, &r, marked_approximate(v))),
        );
    }
    for (i, v) in table("Megatron-LM README")?.rows.iter().enumerate() {
        out.push(
            MegatronRow::deserialize(v)
                .map_err(|e| row_err(Source::MegatronCore2024, i, e.to_string()))
                .and_then(|r| megatron(i, &r, marked_approximate(v))),
        );
    }
    for (i, v) in table("MosaicML")?.rows.iter().enumerate() {
        out.push(
            FoundryRow::deserialize(v)
                .map_err(|e| row_err(Source::LlmFoundry, i, e.to_string()))
                .and_then(|r| foundry(i, &r, marked_approximate(v))),
        );
    }
    Ok(out)
}

/// Whether a row is marked read from a chart: `APPROXIMATE` in any of its keys or strings
/// (what its JSON text contains, read without writing the text out).
fn marked_approximate(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => s.contains("APPROXIMATE"),
        Value::Array(items) => items.iter().any(marked_approximate),
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| k.contains("APPROXIMATE") || marked_approximate(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A GPT of Narayanan et al. 2021 / Megatron-LM: LayerNorm, GeLU, biases, learned positions,
/// dropout 0.1 (Megatron's defaults).
/// `shape` is (layers, hidden, heads, FFN).
pub fn gpt(name: &str, shape: (u32, u64, u32, u64), v: u64, s: u64, tied: bool) -> ModelConfig {
    let (l, h, a, f) = shape;
    ModelConfig {
        name: name.into(),
        num_layers: l,
        hidden_size: h,
        num_attention_heads: a,
        num_query_groups: a,
        kv_channels: None,
        ffn_hidden_size: f,
        vocab_size: v,
        make_vocab_size_divisible_by: 128,
        max_position_embeddings: s,
        position_embedding: PositionEmbedding::Learned,
        activation: Activation::Gelu,
        normalization: Normalization::Layernorm,
        add_bias_linear: true,
        add_qkv_bias: true,
        tied_embeddings: tied,
        hidden_dropout: 0.1,
        attention_dropout: 0.1,
        ..ModelConfig::default()
    }
}

fn cluster(gpu: &str, n: u32) -> ClusterConfig {
    ClusterConfig {
        gpu: gpu.into(),
        num_gpus: n,
        gpus_per_node: Some(8),
        ..ClusterConfig::default()
    }
}

/// Narayanan et al. 2021 Table 1, with the flags of Megatron-LM's
/// `examples/academic_paper_scripts/sc21` scripts: fp16, full (uniform, one layer per
/// checkpoint) recomputation, interleaved 1F1B where `--num-layers-per-virtual-pipeline-stage`
/// is set, no sequence parallelism, no distributed optimizer, gradient all-reduce after the
/// backward (Megatron's 2021 local DDP does not overlap it), no fused attention (2021), and
/// blocking pipeline sends and receives with the scatter/gather split (2021
/// `megatron/p2p_communication.py`, `--scatter-gather-tensors-in-pipeline` on by default).
fn narayanan(i: usize, r: &NarayananRow, approximate: bool) -> Result<Case, PublishedError> {
    let src = Source::Narayanan2021;
    if !r.recompute.starts_with("full") {
        return Err(row_err(
            src,
            i,
            format!("recompute '{}' not understood", r.recompute),
        ));
    }
    if !r.precision.starts_with("fp16") {
        return Err(row_err(
            src,
            i,
            format!("precision '{}' not understood", r.precision),
        ));
    }
    if r.tp * r.pp * r.dp != r.num_gpus {
        return Err(row_err(src, i, "tp x pp x dp differs from the GPU count"));
    }
    let vpp = r.interleave_chunks_per_rank.max(1);
    let config = Config {
        model: gpt(
            &r.model,
            (
                r.num_layers,
                r.hidden_size,
                r.num_attention_heads,
                r.ffn_hidden_size,
            ),
            r.vocab_size,
            r.seq_len,
            true,
        ),
        cluster: cluster("a100-80g", r.num_gpus),
        parallel: ParallelConfig {
            tp: r.tp,
            sp: false,
            cp: 1,
            cp_comm: CpComm::P2p,
            pp: r.pp,
            vpp,
            schedule: if vpp > 1 {
                ScheduleKind::Interleaved1F1B
            } else {
                ScheduleKind::OneFOneB
            },
            zero: 0,
            dp: Some(r.dp),
            tp_comm_overlap: false,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            cp_comm_overlap: false,
            // 2021 Megatron-LM's p2p_communication waits for every send and receive.
            pp_p2p: Some(PpP2p::Blocking),
            ..ParallelConfig::default()
        },
        training: TrainingConfig {
            seq_length: r.seq_len,
            micro_batch_size: r.micro_batch_size,
            global_batch_size: r.global_batch_size,
            precision: Precision::Fp16,
            grad_dtype: Dtype::Fp32,
            recompute: Recompute::Full,
            flash_attention: false,
            flops_attention: FlopsAttention::Full,
            ..TrainingConfig::default()
        },
        run: Default::default(),
    };
    Ok(Case {
        source: src,
        index: i,
        label: format!(
            "{} t{} p{} v{} d{} mbs{}",
            r.model, r.tp, r.pp, vpp, r.dp, r.micro_batch_size
        ),
        gpu: "a100-80g",
        config,
        published_tflops: r.achieved_tflops_per_gpu,
        convention: FlopsConvention::Narayanan2021,
        published_params: None,
        assumed: Vec::new(),
        approximate,
        out_of_scope: None,
    })
}

/// Megatron-Core r0.8.0 H100 weak scaling (Megatron-LM README). The README gives the shape,
/// TP/PP/DP, batch, sequence 4096, vocabulary 131072 and says TP communication overlap and
/// DP gradient-reduce / parameter-gather overlap are on. The model is a GPT with a 4h GeLU
/// MLP and untied embeddings (the parameter counts in the model names match only that).
/// Not given, and assumed: bf16, micro batch 1, no recomputation, flash attention, sequence
/// parallelism with TP, the distributed optimizer (ZeRO-1), and plain 1F1B (no virtual
/// stages: 92/4 and 112/16 layers per stage admit none but one layer per chunk).
fn megatron(i: usize, r: &MegatronRow, approximate: bool) -> Result<Case, PublishedError> {
    let src = Source::MegatronCore2024;
    if r.tp * r.pp * r.dp != r.num_gpus {
        return Err(row_err(src, i, "tp x pp x dp differs from the GPU count"));
    }
    let h = r.hidden_size;
    let config = Config {
        model: gpt(
            &r.model,
            (r.num_layers, h, r.num_attention_heads, 4 * h),
            r.vocab_size,
            r.seq_len,
            false,
        ),
        cluster: cluster("h100-sxm", r.num_gpus),
        parallel: ParallelConfig {
            tp: r.tp,
            sp: true,
            cp: 1,
            pp: r.pp,
            vpp: 1,
            schedule: ScheduleKind::OneFOneB,
            zero: 1,
            dp: Some(r.dp),
            tp_comm_overlap: true,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            ..ParallelConfig::default()
        },
        training: TrainingConfig {
            seq_length: r.seq_len,
            micro_batch_size: 1,
            global_batch_size: r.global_batch_size,
            precision: Precision::Bf16,
            grad_dtype: Dtype::Fp32,
            recompute: Recompute::None,
            flash_attention: true,
            // Transformer Engine's fused attention on Hopper is cuDNN's kernel (assumed: the
            // README does not name the backend).
            attention_kernel: Some("cudnn".into()),
            flops_attention: FlopsAttention::Full,
            ..TrainingConfig::default()
        },
        run: Default::default(),
    };
    Ok(Case {
        source: src,
        index: i,
        label: format!("{} t{} p{} d{}", r.model, r.tp, r.pp, r.dp),
        gpu: "h100-sxm",
        config,
        published_tflops: r.tflops_per_gpu,
        convention: FlopsConvention::Megatron2024,
        published_params: None,
        assumed: vec![
            "micro batch size (assumed 1)".into(),
            "virtual pipeline stages (assumed none)".into(),
            "recomputation (assumed none)".into(),
            "precision (assumed bf16)".into(),
        ],
        approximate,
        out_of_scope: None,
    })
}

/// llm-foundry's MPT benchmarks: pure data parallelism with PyTorch FSDP. The parameter
/// counts the README prints fit only the MPT yamls as the benchmark ran them: learned
/// absolute positions (max_seq_len x d_model), biases on every linear layer and LayerNorm
/// (the yamls leave `no_bias` and ALiBi at MPTConfig's defaults), tied embeddings, a 4h GeLU
/// MLP, no dropout. FULL_SHARD is ZeRO-3 and SHARD_GRAD_OP ZeRO-2 over all GPUs;
/// activation checkpointing is full recomputation; `mp_mode` PURE reduces gradients in bf16,
/// DEFAULT in fp32; attention is a fused flash kernel.
fn foundry(i: usize, r: &FoundryRow, approximate: bool) -> Result<Case, PublishedError> {
    let src = Source::LlmFoundry;
    let &(_, h, a, l) = MPT_SHAPES
        .iter()
        .find(|(n, ..)| *n == r.model)
        .ok_or_else(|| row_err(src, i, format!("unknown MPT size '{}'", r.model)))?;
    let gpu = match r.gpu.as_str() {
        "a100_40gb" => "a100-40g",
        "a100_80gb" => "a100-80g",
        "h100_80gb" => "h100-sxm",
        g => return Err(row_err(src, i, format!("unknown GPU '{g}'"))),
    };
    let precision = match r.precision.as_str() {
        "bf16" | "amp_bf16" => Precision::Bf16,
        "amp_fp8" => Precision::Fp8,
        p => return Err(row_err(src, i, format!("unknown precision '{p}'"))),
    };
    let zero = match r.sharding_strategy.as_str() {
        "FULL_SHARD" => 3,
        "SHARD_GRAD_OP" => 2,
        s => return Err(row_err(src, i, format!("unknown sharding '{s}'"))),
    };
    let grad_dtype = match r.mp_mode.as_str() {
        "PURE" => Dtype::Bf16,
        "DEFAULT" => Dtype::Fp32,
        m => return Err(row_err(src, i, format!("unknown mp_mode '{m}'"))),
    };
    let flag = |s: &str, field: &str| match s {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(row_err(src, i, format!("{field} '{s}' is not True/False"))),
    };
    let checkpointing = flag(&r.activation_checkpointing, "activation_checkpointing")?;
    if flag(&r.activation_cpuoffload, "activation_cpuoffload")? {
        return Err(PublishedError::Underspecified {
            row: format!("{} #{i}", src.short()),
            missing: "the cost of activation CPU offload (not modelled)".into(),
        });
    }
    if r.microbatchsize * r.gradaccum * r.num_gpus as u64 != r.globalbatchsize {
        return Err(row_err(
            src,
            i,
            "micro batch x grad accumulation x GPUs differs from the global batch",
        ));
    }
    let s = r.seqlen_t;
    let model = ModelConfig {
        name: format!("mpt-{}", r.model),
        num_layers: l,
        hidden_size: h,
        num_attention_heads: a,
        num_query_groups: a,
        kv_channels: None,
        ffn_hidden_size: 4 * h,
        vocab_size: MPT_VOCAB,
        make_vocab_size_divisible_by: 1,
        max_position_embeddings: s,
        position_embedding: PositionEmbedding::Learned,
        activation: Activation::Gelu,
        normalization: Normalization::Layernorm,
        add_bias_linear: true,
        add_qkv_bias: true,
        tied_embeddings: true,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        ..ModelConfig::default()
    };
    let config = Config {
        model,
        cluster: cluster(gpu, r.num_gpus),
        parallel: ParallelConfig {
            tp: 1,
            sp: false,
            cp: 1,
            pp: 1,
            vpp: 1,
            schedule: ScheduleKind::OneFOneB,
            zero,
            dp: Some(r.num_gpus),
            tp_comm_overlap: false,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            ..ParallelConfig::default()
        },
        training: TrainingConfig {
            seq_length: s,
            micro_batch_size: r.microbatchsize,
            global_batch_size: r.globalbatchsize,
            precision,
            grad_dtype,
            recompute: if checkpointing {
                Recompute::Full
            } else {
                Recompute::None
            },
            flash_attention: true,
            // MPT's attention ran in llm-foundry's Triton flash kernel in 2023, derived from
            // FlashAttention's Triton implementation, whose A100 rates the FlashAttention-2
            // paper publishes (Figure 4); its H100 rates are derived from those
            // (calibration/data/attention-kernels.json, `derived`).
            attention_kernel: Some("flash-attention-triton".into()),
            flops_attention: FlopsAttention::Full,
            // llm-foundry trains with PyTorch FSDP (per-block units, BACKWARD_PRE).
            framework: crate::config::Framework::Fsdp,
            ..TrainingConfig::default()
        },
        run: Default::default(),
    };
    Ok(Case {
        source: src,
        index: i,
        label: format!(
            "mpt-{} {} s{} n{} mbs{} {}{}{}",
            r.model,
            gpu,
            s,
            r.num_gpus,
            r.microbatchsize,
            if zero == 3 { "z3" } else { "z2" },
            if checkpointing { " ckpt" } else { "" },
            if precision == Precision::Fp8 {
                " fp8"
            } else {
                ""
            },
        ),
        gpu,
        config,
        published_tflops: r.model_tflops_per_gpu,
        convention: FlopsConvention::LlmFoundry {
            params: r.numparams,
        },
        published_params: Some(r.numparams),
        // The A100 tables name their network (1600 Gb/s RoCE per node = 25 GB/s per GPU, the
        // profile's figure); the H100 tables do not.
        assumed: if gpu == "h100-sxm" && r.num_gpus > 8 {
            vec![
                "the H100 cluster's inter-node network (assumed the profile's 400 Gb/s per GPU)"
                    .into(),
            ]
        } else {
            Vec::new()
        },
        approximate,
        out_of_scope: None,
    })
}

#[cfg(test)]
mod tests {
    use super::marked_approximate;
    use serde_json::json;

    /// The walk agrees with the JSON text's substring (the definition it replaces) on rows
    /// with the mark in a value, a key, a nested array, and none.
    #[test]
    fn approximate_mark_is_the_texts() {
        for v in [
            json!({"tflops": 120.0, "note": "APPROXIMATE, read from Fig. 3"}),
            json!({"APPROXIMATE_tflops": 120.0}),
            json!({"notes": [1, {"x": "approximately APPROXIMATE"}]}),
            json!({"note": "approximate", "model": "GPT-3 \"175B\"", "n": null}),
        ] {
            assert_eq!(
                marked_approximate(&v),
                v.to_string().contains("APPROXIMATE"),
                "{v}"
            );
        }
        assert!(!marked_approximate(&json!({"note": "approximate"})));
    }
}
