//! Configuration flags shared by the subcommands. What the user typed becomes one override
//! layer (shaped like the file) that is merged over the file, so flags and files go through
//! the same deserialization and validation.

use super::registry_help;
use super::source_args::put;
pub use super::source_args::SourceArgs;
use clap::Args;
use parsim::config::{
    Activation, Config, CpComm, Dtype, FlopsAttention, Fp8Recipe, Optimizer, OptimizerStateDtype,
    PpP2p, Precision, Recompute, RecomputeModule, Resolved, RouterScore, ScheduleKind,
    TrainingMode,
};
use parsim::scaling::GpuRange;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// The cluster and the workload: what `search` keeps fixed while it searches the parallel mix.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkloadArgs {
    /// Number of GPUs; `search` also takes a range LOW..HIGH (the powers of two inside it
    /// and both ends). [default from config: 8]
    #[arg(long, value_name = "N|LOW..HIGH", value_parser = gpu_count)]
    pub gpus: Option<GpuCount>,
    /// GPUs per node (a host: CPU memory, NICs). [default: the GPU profile's gpus_per_node]
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// GPUs per NVLink domain: a group inside one runs at NVLink rates across nodes. [default:
    /// automatic; on a profile whose NVLink spans racks, a job of at most a rack is one domain,
    /// else whole racks, else the profile's racks a job is scheduled on (64 of an NVL72's 72),
    /// else the node, with a warning]
    #[arg(long, value_name = "GPUS")]
    pub nvlink_domain_size: Option<u32>,
    #[arg(long, help = registry_help::gpu())]
    pub gpu: Option<String>,
    /// Sequence length. [default from config: 8192]
    #[arg(long)]
    pub seq: Option<u64>,
    /// Global batch size. [default from config: 64]
    #[arg(long)]
    pub gbs: Option<u64>,
    #[arg(long, help = registry_help::precision())]
    pub precision: Option<Precision>,
    /// Fraction of GPU memory kept free for allocator fragmentation and reserve, e.g. 0.1 or
    /// 10% [default: the profile's memory_margin_fraction, 0.05 when it names none].
    #[arg(long, value_name = "FRACTION", value_parser = margin_fraction)]
    pub memory_margin: Option<f64>,
    /// Tokens to train, e.g. 15.6T, 300B or 1000000: adds the run (wall days, GPU-hours,
    /// energy, cost, goodput; docs/planning.md). [config: run.train_tokens]
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = parsim::config::parse_token_count)]
    pub train_tokens: Option<u64>,
    /// Price of one GPU-hour in US dollars, for the run's cost (no default price).
    /// [config: run.price_per_gpu_hour_usd]
    #[arg(long, value_name = "USD", allow_hyphen_values = true, value_parser = positive_f64)]
    pub gpu_hour_price: Option<f64>,
}

/// Parses a finite number above zero.
fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a finite number above 0, got {s}")),
    }
}

/// Parses a memory margin: a fraction in [0, 1) or a percentage such as `10%`.
fn margin_fraction(s: &str) -> Result<f64, String> {
    let (text, per) = match s.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (s, 1.0),
    };
    let v = text.trim().parse::<f64>().map_err(|e| format!("{e}"))? / per;
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "must be a fraction in [0, 1) or a percentage below 100%, got {s}"
        ))
    }
}

impl WorkloadArgs {
    /// Adds the cluster and workload flags to the override layer `m`.
    fn put_overrides(&self, m: &mut Map<String, Value>) {
        if let Some(GpuCount::One(n)) = self.gpus {
            put(m, "cluster", "num_gpus", Some(n));
        }
        put(m, "cluster", "gpus_per_node", self.gpus_per_node);
        put(m, "cluster", "nvlink_domain_size", self.nvlink_domain_size);
        put(m, "cluster", "gpu", self.gpu.clone());
        put(m, "training", "seq_length", self.seq);
        put(m, "training", "global_batch_size", self.gbs);
        put(m, "training", "precision", self.precision);
        put(m, "cluster", "memory_margin_fraction", self.memory_margin);
        put(m, "run", "train_tokens", self.train_tokens);
        put(m, "run", "price_per_gpu_hour_usd", self.gpu_hour_price);
    }

    /// The file and model source with these flags and the training flags over them (for
    /// `search`).
    pub fn load(&self, source: &SourceArgs, training: &TrainingArgs) -> anyhow::Result<Config> {
        let mut m = Map::new();
        source.put_overrides(&mut m);
        self.put_overrides(&mut m);
        training.put_overrides(&mut m);
        source.load_with(Value::Object(m))
    }
}

/// Every configuration flag: the source, the cluster and workload, and the rest.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Tensor-parallel degree. [default from config: 2]
    #[arg(long)]
    pub tp: Option<u32>,
    /// Turn sequence parallelism on (needs tp > 1). [default from config: on]
    #[arg(long, overrides_with = "no_sp")]
    pub sp: bool,
    /// Turn sequence parallelism off.
    #[arg(long)]
    pub no_sp: bool,
    /// Context-parallel degree. [default from config: 1]
    #[arg(long)]
    pub cp: Option<u32>,
    /// Context-parallel exchange: p2p, zigzag, allgather, a2a. [default from config: p2p]
    #[arg(long)]
    pub cp_comm: Option<CpComm>,
    /// Pipeline-parallel degree. [default from config: 1]
    #[arg(long)]
    pub pp: Option<u32>,
    /// Virtual pipeline stages (model chunks) per pipeline rank. [default from config: 1]
    #[arg(long)]
    pub vpp: Option<u32>,
    /// Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, dualpipe-v. [default from config: 1f1b]
    #[arg(long)]
    pub schedule: Option<ScheduleKind>,
    /// Expert-parallel degree. [default from config: 1]
    #[arg(long)]
    pub ep: Option<u32>,
    /// Tensor-parallel degree of the routed experts. [default from config: 1]
    #[arg(long)]
    pub expert_tp: Option<u32>,
    /// ZeRO stage 0-3. [default from config: 1]
    #[arg(long)]
    pub zero: Option<u8>,
    /// The FSDP implementation whose buffers the ZeRO stage has: megatron (Megatron-FSDP; --zero 0-3 = no_shard, optim, optim_grads, optim_grads_params) or torch (FSDP2's fully_shard, --zero 3). [default from config: none, the generic ZeRO model]
    #[arg(long, value_name = "NAME")]
    pub fsdp: Option<String>,
    /// Data-parallel degree. [default from config: GPUs / (tp x cp x pp)]
    #[arg(long)]
    pub dp: Option<u32>,
    /// Rank order, fastest first. [default from config: tp-cp-ep-dp-pp]
    #[arg(long)]
    pub order: Option<String>,
    /// Layers on the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers). [default from config: an even split]
    #[arg(long)]
    pub first_stage_layers: Option<u32>,
    /// Layers on the last pipeline stage (Megatron's --decoder-last-pipeline-num-layers). [default from config: an even split]
    #[arg(long)]
    pub last_stage_layers: Option<u32>,
    /// Every virtual pipeline stage's contents in order (Megatron-Core's
    /// --pipeline-model-parallel-layout), e.g. 'Et*3|(tt|)*29,m|L': E embedding, t layer,
    /// m MTP layer, L loss, '|' between stages; pp x vpp stages. [default from config: none]
    #[arg(long, value_name = "LAYOUT")]
    pub pipeline_layout: Option<String>,
    /// The embedding takes one layer slot on the first pipeline stage (Megatron-Core's
    /// --account-for-embedding-in-pipeline-split).
    #[arg(long)]
    pub account_for_embedding_in_pipeline_split: bool,
    /// The output layer and loss take one layer slot on the last pipeline stage
    /// (Megatron-Core's --account-for-loss-in-pipeline-split).
    #[arg(long)]
    pub account_for_loss_in_pipeline_split: bool,
    /// Micro batch size, or `max` (estimate): the largest that fits. [default from config: 1]
    #[arg(long, value_name = "N|max", value_parser = micro_batch)]
    pub mbs: Option<MicroBatch>,
    #[command(flatten)]
    pub training: TrainingArgs,
}

/// Training, precision, model-variant and overlap settings that are neither searched nor part of
/// the parallel mix: `estimate` and `search` both take them.
#[derive(Debug, Clone, Default, Args)]
pub struct TrainingArgs {
    /// A hardware profile TOML (e.g. one written by `parsim calibrate`); the same as --gpu PATH.
    #[arg(long, value_name = "FILE", conflicts_with = "gpu")]
    pub profile: Option<PathBuf>,
    /// Gradient buffer dtype: fp32, bf16. [default from config: fp32]
    #[arg(long)]
    pub grad_dtype: Option<Dtype>,
    /// FP8 scaling recipe (with --precision fp8): delayed, current, blockwise. [default: delayed]
    #[arg(long)]
    pub fp8_recipe: Option<Fp8Recipe>,
    /// Hold the fp8/mxfp8 linear weights in 8 bits and all-gather them so (Megatron's
    /// --fp8-param-gather). [default: off]
    #[arg(long)]
    pub fp8_param_gather: bool,
    /// Decoder layers at the start kept in bf16 under a low-precision recipe. [default: 1
    /// under nvfp4, else 0]
    #[arg(long, value_name = "N")]
    pub bf16_layers_at_start: Option<u32>,
    /// Decoder layers at the end kept in bf16 under a low-precision recipe. [default: 1 under
    /// nvfp4, else 0]
    #[arg(long, value_name = "N")]
    pub bf16_layers_at_end: Option<u32>,
    /// Activation recomputation: none, selective, full. [default from config: selective]
    #[arg(long)]
    pub recompute: Option<Recompute>,
    /// What selective recompute reruns, comma-separated: core_attn, moe_act, layernorm,
    /// mla_up_proj, mlp, moe, shared_experts (Megatron's --recompute-modules). [default:
    /// core_attn]
    #[arg(long, value_delimiter = ',', value_name = "MODULES")]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// Decoder layers whose saved activations are offloaded to host memory (Megatron's
    /// --cpu-offloading --cpu-offloading-num-layers N). [default: 0]
    #[arg(long, value_name = "N")]
    pub offload_activation_layers: Option<u32>,
    /// The optimizer: adam, muon (Muon on the 2-D weights, Adam on the rest). [default: adam]
    #[arg(long)]
    pub optimizer: Option<Optimizer>,
    /// Fused (flash) attention on or off. [default from config: true]
    #[arg(long, value_name = "BOOL")]
    pub flash_attention: Option<bool>,
    /// Vocabulary size before padding (Megatron's --vocab-size), e.g. for a model imported
    /// with a tokenizer whose size is not read. [default from config: the model's]
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<u64>,
    /// Pad the vocabulary to a multiple of N x TP (Megatron; 1 = no padding). [default from config: the model's; 1 for the built-in model]
    #[arg(long, value_name = "N")]
    pub make_vocab_size_divisible_by: Option<u64>,
    /// Attention FLOPs counting: causal (Megatron-LM today) or full (Narayanan et al. 2021, PaLM). [default from config: causal]
    #[arg(long)]
    pub flops_attention: Option<FlopsAttention>,
    /// Training mode: full or lora. [default from config: full]
    #[arg(long)]
    pub mode: Option<TrainingMode>,
    /// LoRA rank (with --mode lora). [default from config: 16]
    #[arg(long)]
    pub lora_rank: Option<u64>,
    /// MLP activation: swiglu or gelu. [default from config: the model's; swiglu for the built-in model]
    #[arg(long)]
    pub activation: Option<Activation>,
    /// MoE load imbalance: the hottest expert's tokens over a uniform share (>= 1). [default from config: 1.0]
    #[arg(long, value_parser = finite_f64)]
    pub moe_load_imbalance: Option<f64>,
    /// MoE expert capacity factor: each expert takes at most ceil(f x tokens x topk / experts) assignments, 0 = no dropping (Megatron's --moe-expert-capacity-factor). [default from config: 0]
    #[arg(long, value_parser = finite_f64)]
    pub moe_capacity_factor: Option<f64>,
    /// MoE: the fraction of routed assignments the capacity drops, in [0, 1), for a router that drops more than a balanced one (`parsim execute` reports the measured one); needs a capacity factor. [default from config: a balanced router's]
    #[arg(long, value_parser = finite_f64)]
    pub moe_dropped_fraction: Option<f64>,
    /// MoE load-balancing loss coefficient (Megatron's --moe-aux-loss-coeff; 0 = none). [default from config: 0]
    #[arg(long, value_parser = finite_f64)]
    pub moe_aux_loss_coeff: Option<f64>,
    /// MoE experts chosen per token (Megatron's --moe-router-topk). [default from config: the model's]
    #[arg(long)]
    pub moe_router_topk: Option<u32>,
    /// MoE router score function: softmax or sigmoid (DeepSeek-V3). [default from config: the model's; softmax]
    #[arg(long)]
    pub moe_router_score_function: Option<RouterScore>,
    /// Renormalise the MoE gates over the k chosen experts: true or false. [default from config: the model's; false]
    #[arg(long, value_name = "BOOL")]
    pub moe_router_renormalize: Option<bool>,
    /// DeepSeek-V3's selection-only expert bias (auxiliary-loss-free balancing): true or false. [default from config: the model's]
    #[arg(long, value_name = "BOOL")]
    pub moe_router_bias: Option<bool>,
    /// Benchmarking: override the MoE router's choice by an exactly balanced one (Megatron's --moe-router-force-load-balancing): true or false. [default from config: false]
    #[arg(long, value_name = "BOOL")]
    pub moe_router_force_load_balancing: Option<bool>,
    /// Step of the expert bias's update per training step (Megatron's --moe-router-bias-update-rate). [default from config: 0.001]
    #[arg(long, value_parser = finite_f64)]
    pub moe_router_bias_update_rate: Option<f64>,
    /// Group-limited routing: the experts in N equal groups (Megatron's --moe-router-num-groups; 0 = none). [default from config: the model's]
    #[arg(long, value_name = "N")]
    pub moe_router_num_groups: Option<u32>,
    /// Group-limited routing: a token's experts in at most M groups (Megatron's --moe-router-group-topk). [default from config: the model's]
    #[arg(long, value_name = "M")]
    pub moe_router_group_topk: Option<u32>,
    /// Multi-token-prediction modules (DeepSeek-V3), on the last pipeline stage. [default from config: the model's; 0 for the built-in model]
    #[arg(long)]
    pub mtp_layers: Option<u32>,
    /// Weight lambda of the MTP losses: lambda / D times their sum joins the loss (Megatron's --mtp-loss-scaling-factor). [default from config: 0.1]
    #[arg(long, value_parser = finite_f64)]
    pub mtp_loss_scaling_factor: Option<f64>,
    /// Overlap TP collectives with the GEMMs they feed (Megatron's --tp-comm-overlap).
    #[arg(long)]
    pub tp_comm_overlap: bool,
    /// The training framework whose overlap and bucketing defaults apply: megatron-core (or nemo), deepspeed, fsdp (docs/time-model.md). Explicit flags override them. [default from config: megatron-core]
    #[arg(long, value_name = "NAME")]
    pub framework: Option<String>,
    /// The fused-attention kernel whose published rates time the core (flash-attention-3, cudnn-9.4, ...), or a release that names one (cudnn-9.4.0, ngc-pytorch-25.04). [default from config: the GPU profile's]
    #[arg(long, value_name = "KERNEL|RELEASE")]
    pub attention_kernel: Option<String>,
    /// Overlap the DP gradient reduction with backward, all but the last bucket. [default from config: the framework's]
    #[arg(long, conflicts_with = "no_overlap_grad_reduce")]
    pub overlap_grad_reduce: bool,
    /// Expose the DP gradient reduction instead of overlapping it with backward.
    #[arg(long)]
    pub no_overlap_grad_reduce: bool,
    /// Overlap ZeRO parameter all-gathers with compute (ZeRO-3: as far as the prefetch reaches). [default from config: the framework's]
    #[arg(long, conflicts_with = "no_overlap_param_gather")]
    pub overlap_param_gather: bool,
    /// Expose ZeRO parameter all-gathers instead of overlapping them with forward.
    #[arg(long)]
    pub no_overlap_param_gather: bool,
    /// Parameters ZeRO-3 gathers ahead of the layer computing (DeepSpeed's stage3_prefetch_bucket_size; 0 = none). [default from config: the framework's: one layer, DeepSpeed 5e7]
    #[arg(long, value_name = "PARAMS")]
    pub zero3_prefetch_params: Option<u64>,
    /// Expose the ring-attention K/V exchange instead of overlapping it with attention.
    #[arg(long)]
    pub no_cp_comm_overlap: bool,
    /// DP gradient bucket size in parameters (Megatron's --ddp-bucket-size, DeepSpeed's reduce_bucket_size). [default from config: the framework's: Megatron-Core max(40M, 1M x dp), DeepSpeed 5e8, FSDP one layer]
    #[arg(long)]
    pub ddp_bucket_size: Option<u64>,
    /// How pipeline sends and receives run: overlapped (asynchronous, Megatron-Core) or blocking (each transfer holds both stages' compute: DeepSpeed's PipelineEngine, 2021 Megatron-LM). [default from config: the framework's: blocking for deepspeed, else overlapped]
    #[arg(long, value_name = "MODE")]
    pub pp_p2p: Option<PpP2p>,
    /// Pure-bf16 training: no fp32 master copy, the optimizer updates the bf16 weights (FSDP,
    /// DeepSpeed's bf16_master_weights_and_grads; needs --grad-dtype bf16). [default: master
    /// weights kept]
    #[arg(long)]
    pub no_master_weights: bool,
    /// Adam's moments: fp32, bf16, fp16, fp8 (Megatron's --exp-avg-dtype), int8
    /// (bitsandbytes). [default from config: fp32, bf16 with --no-master-weights]
    #[arg(long, value_name = "DTYPE")]
    pub optimizer_state_dtype: Option<OptimizerStateDtype>,
}

/// `--gpus`: a count, or a range for `search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuCount {
    One(u32),
    Range(GpuRange),
}

fn gpu_count(s: &str) -> Result<GpuCount, String> {
    if s.contains("..") {
        return GpuRange::parse(s)
            .map(GpuCount::Range)
            .map_err(|e| e.to_string());
    }
    s.parse::<u32>()
        .map(GpuCount::One)
        .map_err(|e| format!("expected a GPU count or LOW..HIGH: {e}"))
}

impl WorkloadArgs {
    /// The `--gpus LOW..HIGH` range, if one was given.
    pub fn gpu_range(&self) -> Option<GpuRange> {
        match self.gpus {
            Some(GpuCount::Range(r)) => Some(r),
            _ => None,
        }
    }
}

/// `--mbs`: a micro batch size, or the largest that fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatch {
    Size(u64),
    /// `max`: `estimate` tries every micro batch that divides the batch per replica.
    Max,
}

fn micro_batch(s: &str) -> Result<MicroBatch, String> {
    if s.eq_ignore_ascii_case("max") {
        return Ok(MicroBatch::Max);
    }
    s.parse::<u64>()
        .map(MicroBatch::Size)
        .map_err(|e| format!("expected a micro batch size or `max`: {e}"))
}

/// Parses a finite float (JSON has no NaN or infinity, so they are refused here).
fn finite_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("must be a finite number, got {s}"))
    }
}

impl TrainingArgs {
    /// Adds these flags to the override layer `m`.
    fn put_overrides(&self, m: &mut Map<String, Value>) {
        put(m, "model", "vocab_size", self.vocab_size);
        put(
            m,
            "model",
            "make_vocab_size_divisible_by",
            self.make_vocab_size_divisible_by,
        );
        put(m, "model", "activation", self.activation);
        put(m, "model", "moe_load_imbalance", self.moe_load_imbalance);
        put(m, "model", "moe_capacity_factor", self.moe_capacity_factor);
        put(
            m,
            "model",
            "moe_dropped_fraction",
            self.moe_dropped_fraction,
        );
        put(m, "model", "moe_aux_loss_coeff", self.moe_aux_loss_coeff);
        put(m, "model", "moe_router_topk", self.moe_router_topk);
        put(
            m,
            "model",
            "moe_router_score_function",
            self.moe_router_score_function,
        );
        put(
            m,
            "model",
            "moe_router_renormalize",
            self.moe_router_renormalize,
        );
        put(m, "model", "moe_router_bias", self.moe_router_bias);
        put(
            m,
            "model",
            "moe_router_force_load_balancing",
            self.moe_router_force_load_balancing,
        );
        put(
            m,
            "model",
            "moe_router_bias_update_rate",
            self.moe_router_bias_update_rate,
        );
        put(
            m,
            "model",
            "moe_router_num_groups",
            self.moe_router_num_groups,
        );
        put(
            m,
            "model",
            "moe_router_group_topk",
            self.moe_router_group_topk,
        );
        put(m, "model", "mtp_num_layers", self.mtp_layers);
        put(
            m,
            "model",
            "mtp_loss_scaling_factor",
            self.mtp_loss_scaling_factor,
        );
        if self.tp_comm_overlap {
            put(m, "parallel", "tp_comm_overlap", Some(true));
        }
        put(m, "training", "framework", self.framework.clone());
        put(
            m,
            "training",
            "attention_kernel",
            self.attention_kernel.clone(),
        );
        if self.overlap_grad_reduce {
            put(m, "parallel", "overlap_grad_reduce", Some(true));
        }
        if self.no_overlap_grad_reduce {
            put(m, "parallel", "overlap_grad_reduce", Some(false));
        }
        if self.overlap_param_gather {
            put(m, "parallel", "overlap_param_gather", Some(true));
        }
        if self.no_overlap_param_gather {
            put(m, "parallel", "overlap_param_gather", Some(false));
        }
        put(
            m,
            "parallel",
            "zero3_prefetch_params",
            self.zero3_prefetch_params,
        );
        if self.no_cp_comm_overlap {
            put(m, "parallel", "cp_comm_overlap", Some(false));
        }
        put(m, "parallel", "ddp_bucket_size", self.ddp_bucket_size);
        put(m, "parallel", "pp_p2p", self.pp_p2p);
        put(
            m,
            "cluster",
            "gpu",
            self.profile.as_ref().map(|p| p.display().to_string()),
        );
        put(m, "training", "grad_dtype", self.grad_dtype);
        put(m, "training", "fp8_recipe", self.fp8_recipe);
        if self.fp8_param_gather {
            put(m, "training", "fp8_param_gather", Some(true));
        }
        put(
            m,
            "training",
            "bf16_layers_at_start",
            self.bf16_layers_at_start,
        );
        put(m, "training", "bf16_layers_at_end", self.bf16_layers_at_end);
        put(m, "training", "recompute", self.recompute);
        put(
            m,
            "training",
            "recompute_modules",
            self.recompute_modules.clone(),
        );
        put(
            m,
            "training",
            "offload_activation_layers",
            self.offload_activation_layers,
        );
        put(m, "training", "optimizer", self.optimizer);
        put(m, "training", "flash_attention", self.flash_attention);
        put(m, "training", "flops_attention", self.flops_attention);
        put(m, "training", "mode", self.mode);
        if let Some(r) = self.lora_rank {
            let sec = m.entry("training").or_insert_with(|| json!({}));
            sec["lora"] = json!({ "rank": r });
        }
        if self.no_master_weights {
            put(m, "training", "master_weights", Some(false));
        }
        put(
            m,
            "training",
            "optimizer_state_dtype",
            self.optimizer_state_dtype,
        );
    }
}

impl ConfigArgs {
    /// The flags as one override layer.
    pub fn overrides(&self) -> Value {
        let mut m = Map::new();
        self.source.put_overrides(&mut m);
        self.workload.put_overrides(&mut m);
        put(&mut m, "parallel", "tp", self.tp);
        if self.sp || self.no_sp {
            put(&mut m, "parallel", "sp", Some(self.sp && !self.no_sp));
        }
        put(&mut m, "parallel", "cp", self.cp);
        put(&mut m, "parallel", "cp_comm", self.cp_comm);
        put(&mut m, "parallel", "pp", self.pp);
        put(&mut m, "parallel", "vpp", self.vpp);
        put(&mut m, "parallel", "schedule", self.schedule);
        put(&mut m, "parallel", "ep", self.ep);
        put(&mut m, "parallel", "expert_tp", self.expert_tp);
        put(&mut m, "parallel", "zero", self.zero);
        put(&mut m, "parallel", "fsdp", self.fsdp.clone());
        put(&mut m, "parallel", "dp", self.dp);
        put(&mut m, "parallel", "order", self.order.clone());
        put(
            &mut m,
            "parallel",
            "first_stage_layers",
            self.first_stage_layers,
        );
        put(
            &mut m,
            "parallel",
            "last_stage_layers",
            self.last_stage_layers,
        );
        put(
            &mut m,
            "parallel",
            "pipeline_layout",
            self.pipeline_layout.clone(),
        );
        for (key, on) in [
            (
                "account_for_embedding_in_pipeline_split",
                self.account_for_embedding_in_pipeline_split,
            ),
            (
                "account_for_loss_in_pipeline_split",
                self.account_for_loss_in_pipeline_split,
            ),
        ] {
            if on {
                put(&mut m, "parallel", key, Some(true));
            }
        }
        if let Some(MicroBatch::Size(n)) = self.mbs {
            put(&mut m, "training", "micro_batch_size", Some(n));
        }
        self.training.put_overrides(&mut m);
        Value::Object(m)
    }

    /// The merged configuration (file, then flags); flags it ignores are named on stderr.
    /// With `--gpus` alone (no tp, cp, pp or dp
    /// from a flag or the file), degrees that do not divide the GPU count are lowered, with a
    /// note on stderr.
    pub fn load(&self) -> anyhow::Result<Config> {
        let mut warnings = Vec::new();
        let config = self.load_noting(&mut warnings);
        for w in warnings {
            eprintln!("{w}");
        }
        config
    }

    /// [`ConfigArgs::load`], its warnings and notes (`warning: ...`, `note: ...`) added to
    /// `warnings` instead of printed.
    pub fn load_noting(&self, warnings: &mut Vec<String>) -> anyhow::Result<Config> {
        if self.mbs == Some(MicroBatch::Max) {
            anyhow::bail!("--mbs max: only `parsim estimate` looks for the largest micro batch");
        }
        if self.workload.gpu_range().is_some() {
            anyhow::bail!("--gpus LOW..HIGH: only `parsim search` takes a range of GPU counts");
        }
        let mut loaded = Vec::new();
        let mut config = self.source.load_noting(self.overrides(), &mut loaded)?;
        loaded.extend(self.ignored(&config));
        warnings.extend(loaded.into_iter().map(|w| format!("warning: {w}")));
        let degrees_given = self.tp.is_some()
            || self.cp.is_some()
            || self.pp.is_some()
            || self.dp.is_some()
            || self.source.file_sets_degrees()?;
        if self.workload.gpus.is_some() && !degrees_given {
            if let Some(note) = super::gpu_defaults::fit_degrees(&mut config) {
                warnings.push(format!("note: {note}"));
            }
        }
        Ok(config)
    }

    /// These flags with `--mbs N`.
    pub fn with_mbs(&self, mbs: u64) -> ConfigArgs {
        ConfigArgs {
            mbs: Some(MicroBatch::Size(mbs)),
            ..self.clone()
        }
    }

    /// The merged and validated configuration.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        Ok(Resolved::new(self.load()?)?)
    }
}
