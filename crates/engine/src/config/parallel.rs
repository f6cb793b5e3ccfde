//! The parallel mix: tensor, sequence, context, pipeline, data (with ZeRO) and expert parallelism.

use super::enums::{CpComm, FlexBackend, PpP2p, ScheduleKind, TokenDispatcher};
use super::fsdp::Fsdp;
use serde::{Deserialize, Serialize};

/// How the model and the batch are split over the GPUs. World = tp x cp x pp x dp; ep lies on the
/// expert grid (expert_tp x ep x expert dp over tp x cp x dp).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    /// Tensor parallel degree (Megatron column/row split of the linear layers).
    pub tp: u32,
    /// Sequence parallelism with TP (Korthikanti et al. 2022); turned off when tp = 1.
    pub sp: bool,
    /// Context parallel degree (every activation split along the sequence).
    pub cp: u32,
    pub cp_comm: CpComm,
    /// Pipeline parallel degree.
    pub pp: u32,
    /// Virtual pipeline stages (model chunks) per pipeline rank.
    pub vpp: u32,
    pub schedule: ScheduleKind,
    /// Expert parallel degree: on Megatron-Core's expert grid, expert_tp x ep divides tp x cp x dp.
    pub ep: u32,
    /// Tensor parallel degree of the routed experts; `None` = 1 (Megatron's MoE recipes
    /// use expert TP 1 with EP).
    pub expert_tp: Option<u32>,
    /// ZeRO stage: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters.
    pub zero: u8,
    /// The FSDP implementation whose buffers the ZeRO stage has (`megatron`: Megatron-FSDP,
    /// `zero` 0-3 = no_shard, optim, optim_grads, optim_grads_params; `torch`: FSDP2's
    /// `fully_shard`, `zero` 3); `None` = the generic ZeRO model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp: Option<Fsdp>,
    /// Data parallel degree; `None` = derived from the GPU count.
    pub dp: Option<u32>,
    /// Rank order, fastest-varying first (Megatron: tp-cp-ep-dp-pp).
    pub order: String,
    /// Megatron's `--decoder-first-pipeline-num-layers`: layers on the first pipeline stage.
    pub first_stage_layers: Option<u32>,
    /// Megatron's `--decoder-last-pipeline-num-layers`: layers on the last pipeline stage.
    pub last_stage_layers: Option<u32>,
    /// Megatron-Core's `--pipeline-model-parallel-layout`: every virtual stage's contents in
    /// order, e.g. `Et*3|(tt|)*29,m|L` (E embedding, t layer, m MTP, L loss, `|` between
    /// stages); stage s runs on rank s mod pp. Excludes the other split settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_layout: Option<String>,
    /// Megatron-Core's `--account-for-embedding-in-pipeline-split`: the embedding takes one
    /// layer slot on the first stage, so that stage holds one decoder layer fewer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub account_for_embedding_in_pipeline_split: bool,
    /// Megatron-Core's `--account-for-loss-in-pipeline-split`: the output layer and loss take
    /// one layer slot on the last stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub account_for_loss_in_pipeline_split: bool,
    /// Megatron's `--tp-comm-overlap`: TP collectives overlapped with the GEMMs they feed
    /// (exposed only where the communication outlasts the GEMM). Off: TP communication exposed.
    pub tp_comm_overlap: bool,
    /// Megatron's `--overlap-grad-reduce`: DP gradient reduction overlapped with backward, all
    /// but the last bucket.
    pub overlap_grad_reduce: bool,
    /// Megatron's `--overlap-param-gather`: ZeRO parameter all-gathers overlapped with forward.
    pub overlap_param_gather: bool,
    /// Parameters per data-parallel gradient bucket (Megatron's `--ddp-bucket-size`,
    /// DeepSpeed's `reduce_bucket_size`); `None` = the framework's (`training.framework`).
    pub ddp_bucket_size: Option<u64>,
    /// Parameters ZeRO-3 gathers ahead of the layer computing (DeepSpeed's
    /// `stage3_prefetch_bucket_size`); `None` = the framework's (one layer for Megatron-Core
    /// and FSDP, 5e7 for DeepSpeed); 0 = no prefetch, every gather exposed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero3_prefetch_params: Option<u64>,
    /// DeepSpeed's `stage3_prefetch_bucket_size`: elements each ZeRO-3 prefetch all-gather
    /// collects (parameters in use order until the sum reaches it; one larger parameter alone);
    /// `None` = DeepSpeed's 5e7; 0 = no prefetch, each module gathered when it runs. Only under
    /// `training.framework = "deepspeed"` at `zero = 3` (src/estimate/dp_calls.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero3_prefetch_bucket_size: Option<u64>,
    /// DeepSpeed's `stage3_param_persistence_threshold`: parameters of at most this many
    /// elements are never partitioned, so never gathered; `None` = DeepSpeed's 1e5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero3_param_persistence_threshold: Option<u64>,
    /// DeepSpeed's `stage3_max_live_parameters`: gathered elements a rank holds at most, which
    /// bounds how far its prefetch runs ahead; `None` = DeepSpeed's 1e9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero3_max_live_parameters: Option<u64>,
    /// Ring attention sends the next K/V block while computing on the current one (exposed =
    /// max(0, transfer - compute) per ring step). Off: the exchange is exposed.
    pub cp_comm_overlap: bool,
    /// How MoE layers dispatch their routed tokens (Megatron-Core's
    /// `--moe-token-dispatcher-type`): `alltoall` (NCCL), `allgather`, or `flex` (DeepEP or
    /// HybridEP kernels, `moe_flex_dispatcher_backend`), each timed at its own bandwidth
    /// (calibration/data/ep-dispatch.json).
    #[serde(default, skip_serializing_if = "is_default")]
    pub moe_token_dispatcher: TokenDispatcher,
    /// The flex dispatcher's kernels (Megatron-Core's `--moe-flex-dispatcher-backend`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub moe_flex_dispatcher_backend: FlexBackend,
    /// Megatron-Core's `--overlap-moe-expert-parallel-comm`: the combined 1F1B schedule runs
    /// one microbatch's forward beside another's backward layer by layer, hiding each EP
    /// dispatch and combine behind the other pass's compute (model_chunk_schedule_plan.py,
    /// `TransformerLayerSchedulePlan.run`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap_moe_expert_parallel_comm: bool,
    /// How pipeline sends and receives run: `overlapped` (asynchronous, the sender computes
    /// on) or `blocking` (each transfer holds both stages' compute); `None` = the framework's
    /// (`training.framework`: blocking for DeepSpeed, overlapped otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_p2p: Option<PpP2p>,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            tp: 2,
            sp: true,
            cp: 1,
            cp_comm: CpComm::P2p,
            pp: 1,
            vpp: 1,
            schedule: ScheduleKind::OneFOneB,
            ep: 1,
            expert_tp: None,
            zero: 1,
            fsdp: None,
            dp: None,
            order: "tp-cp-ep-dp-pp".into(),
            first_stage_layers: None,
            last_stage_layers: None,
            pipeline_layout: None,
            account_for_embedding_in_pipeline_split: false,
            account_for_loss_in_pipeline_split: false,
            tp_comm_overlap: false,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            ddp_bucket_size: None,
            zero3_prefetch_params: None,
            zero3_prefetch_bucket_size: None,
            zero3_param_persistence_threshold: None,
            zero3_max_live_parameters: None,
            cp_comm_overlap: true,
            pp_p2p: None,
            moe_token_dispatcher: TokenDispatcher::AllToAll,
            moe_flex_dispatcher_backend: FlexBackend::DeepEp,
            overlap_moe_expert_parallel_comm: false,
        }
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl ParallelConfig {
    /// Expert tensor-parallel degree (default 1).
    pub fn etp(&self) -> u32 {
        self.expert_tp.unwrap_or(1)
    }

    /// How pipeline sends and receives run: `parallel.pp_p2p`, or `framework`'s default.
    pub fn pp_p2p_under(&self, framework: super::Framework) -> PpP2p {
        self.pp_p2p.unwrap_or_else(|| framework.pp_p2p())
    }

    /// True when sequence parallelism is in effect (requested and tp > 1).
    pub fn sp_active(&self) -> bool {
        self.sp && self.tp > 1
    }
}
