//! One op of the ledger: what it owns (parameters and their sharding), what it costs (FLOPs
//! forward, input gradient, weight gradient), what it keeps for backward, what it allocates
//! transiently, and which collectives it issues.

use super::cast_kernels::CastPass;
use crate::layout::GroupKind;
use serde::Serialize;

/// How an op's parameters are laid out over ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamClass {
    /// Split over TP (column- or row-parallel weights, vocab-parallel embedding).
    TpSharded,
    /// A full copy on every TP rank (norms, row-parallel biases, router, position embedding).
    TpReplicated,
    /// Routed experts: split over EP (whole experts) and expert TP.
    Expert,
}

/// Parameters of one op: the unsharded count and the most loaded rank's shard.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Params {
    pub total: u64,
    pub rank: u64,
    pub class: ParamClass,
    /// False for LoRA's frozen base weights and DeepSeek's rule-updated router bias.
    pub trainable: bool,
}

/// FLOPs of one op for one microbatch, split as zero-bubble schedules split the backward.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Flops {
    pub fwd: f64,
    /// Input gradient (the I of zero-bubble schedules).
    pub dgrad: f64,
    /// Weight gradient (W).
    pub wgrad: f64,
}

impl Flops {
    /// A matmul of 2*m*n*k FLOPs forward, the same for the input and (if trained) weight gradient.
    pub fn matmul(mnk2: f64, trainable: bool) -> Flops {
        Flops {
            fwd: mnk2,
            dgrad: mnk2,
            wgrad: if trainable { mnk2 } else { 0.0 },
        }
    }

    pub fn total(&self) -> f64 {
        self.fwd + self.dgrad + self.wgrad
    }

    pub fn scaled(&self, k: f64) -> Flops {
        Flops {
            fwd: self.fwd * k,
            dgrad: self.dgrad * k,
            wgrad: self.wgrad * k,
        }
    }

    pub fn add(&mut self, o: &Flops) {
        self.fwd += o.fwd;
        self.dgrad += o.dgrad;
        self.wgrad += o.wgrad;
    }
}

/// A ring attention's kernel calls on the busiest CP rank, as Transformer Engine's context
/// parallelism runs them (one call per KV block the ring brings): first the diagonal block
/// under the causal mask, then `blocks - 1` unmasked ones. Contiguous layout: full s/cp x s/cp
/// blocks, and the last rank (the busiest) computes all of them. Zigzag layout (each rank
/// holds chunks r and 2cp-1-r): the off-diagonal calls are half blocks (half the queries or
/// half the keys, s/2cp long), so every rank does the same work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RingCalls {
    /// CP ranks in the ring: the calls per pass.
    pub blocks: u32,
    pub zigzag: bool,
}

impl RingCalls {
    /// The shares of the rank's core FLOPs in the diagonal call and in each other call: the
    /// diagonal holds half a block's pairs; contiguous, c - 1/2 blocks in all; zigzag, c
    /// halves.
    pub fn flop_shares(self) -> (f64, f64) {
        let c = f64::from(self.blocks.max(1));
        if self.zigzag {
            (1.0 / c, 1.0 / c)
        } else {
            (0.5 / (c - 0.5), 1.0 / (c - 0.5))
        }
    }
}

/// What an op costs on this rank, for the time model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum OpKind {
    /// A GEMM of [m x k] . [k x n] on this rank (one microbatch).
    Matmul { m: u64, n: u64, k: u64 },
    /// The attention core (scores, softmax, weighted sum). `seq_len` is the query (and key)
    /// length of one kernel call on this rank; `causal` whether that call applies the causal
    /// mask (the fused kernel's rate depends on both: FlashAttention-3, Figures 5 and 6);
    /// `fused` whether it is one flash kernel rather than separate matmuls and softmax.
    Attention {
        seq_len: u64,
        causal: bool,
        fused: bool,
        /// Head dimension (the larger of the query/key and value ones), which picks the
        /// published kernel series nearest to it.
        head_dim: u64,
        /// Ring context parallelism: the core runs as one kernel call per KV block as the
        /// ring turns (`seq_len` and `causal` then describe the off-diagonal calls).
        #[serde(skip_serializing_if = "Option::is_none")]
        ring: Option<RingCalls>,
        /// A causal sliding window of this many keys per query (GPT-OSS's 128, Mistral's
        /// 4096): the kernel skips the key tiles outside it, and its rate is the published
        /// window series' (src/attention_rates.rs).
        #[serde(skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
    },
    /// Bandwidth-bound: bytes read and written on this rank, forward.
    MemoryBound { bytes: u64 },
    /// A low-precision recipe's quantise (and transpose) kernels beside one linear layer
    /// (src/model/low_precision.rs, kernels as src/op_cost/cast.rs runs them): forward, its
    /// input X cast; backward, its output gradient dY cast; and its weights, cast once a step
    /// and cached.
    Quantize {
        fwd: CastPass,
        bwd: CastPass,
        /// Weight elements cast.
        weight_elements: u64,
        /// Bytes of the cached low-precision weight copies with their scales.
        weight_cache_bytes: u64,
        /// HBM bytes of casting the weights once a step (bf16 read, copies written, and the
        /// amax pass's read under current scaling).
        weight_step_bytes: u64,
        /// Routed experts' weights (sharded over expert data parallelism).
        expert: bool,
    },
}

/// What a saved tensor is, for the models that treat some tensors specially (the unfused
/// attention core's s x s tensors, a linear layer's input kept for its weight gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// The op's input (a linear layer's X for dW = X^T dY; a norm's or activation's input).
    Input,
    Query,
    Key,
    Value,
    /// The attention core's s x s softmax probabilities (unfused kernels).
    Softmax,
    /// Log-sum-exp of each attention row (fused kernels).
    SoftmaxLse,
    /// A dropout mask (1 byte per element).
    DropoutMask,
    /// The attention dropout's s x s output (unfused kernels).
    DropoutOut,
    /// The output layer's fp32 softmax probabilities kept by the cross-entropy.
    Probabilities,
    Logits,
    /// MoE routing weights and indices.
    Routing,
    /// The routed experts' outputs, kept for the combine's backward.
    ExpertOutputs,
    /// LoRA's rank-r intermediate x A.
    LoraIntermediate,
    /// The op's output, kept by a checkpoint policy that saves it (torchtitan's per-op one).
    Output,
}

/// What an op is, where another model needs to find it (the word embedding's output gradient
/// for a split backward, the final norm's parameters apart from the output layer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpRole {
    WordEmbedding,
    FinalNorm,
    /// A linear layer whose input its norm quantises (Transformer Engine's LayerNormLinear,
    /// src/op_cost/cast.rs).
    NormFusedLinear,
    #[default]
    Other,
}

/// A tensor kept from forward to backward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Saved {
    pub role: TensorRole,
    pub bytes: u64,
    /// Dropped (and recomputed) under selective recompute: the core-attention internals.
    pub selective: bool,
}

/// Collective kinds with NCCL's semantics: the plan contract's, one vocabulary for the ledger,
/// the time model and the executor's measured ops.
pub use parsim_plan::op_timing::CollectiveKind;

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
}

/// A collective issued by an op, `count` times per microbatch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Collective {
    pub kind: CollectiveKind,
    pub group: GroupKind,
    pub group_size: u32,
    pub phase: Phase,
    /// The full buffer: all-reduce's buffer, all-gather's output, reduce-scatter's input,
    /// all-to-all's send buffer, a send's message.
    pub payload_bytes: u64,
    pub count: u32,
}

impl Collective {
    /// Bytes each rank sends on the wire per call with ring algorithms: all-reduce
    /// 2(n-1)/n B, all-gather and reduce-scatter (n-1)/n B, all-to-all (n-1)/n B, send B.
    pub fn wire_bytes_per_call(&self) -> f64 {
        self.kind.bus_factor(self.group_size) * self.payload_bytes as f64
    }

    /// Wire bytes of all `count` calls.
    pub fn wire_bytes(&self) -> f64 {
        self.wire_bytes_per_call() * self.count as f64
    }
}

pub(crate) fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// What a partial rerun repeats of an op's forward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PartialRerun {
    /// The share of its compute (FLOPs and time).
    pub compute_share: f64,
    /// Whether its forward collectives run again (not when their outputs were kept).
    pub comms: bool,
}

/// One op of the ledger, sized for one microbatch on the most loaded rank of its kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    pub name: &'static str,
    pub role: OpRole,
    pub kind: OpKind,
    pub params: Option<Params>,
    /// Model FLOPs of the whole microbatch (all ranks of one model replica), counted as
    /// Megatron-LM counts them (attention per `training.flops_attention`).
    pub model_flops: Flops,
    /// FLOPs this rank executes.
    pub rank_flops: Flops,
    /// Selective recompute reruns this op's forward.
    pub recomputed_by_selective: bool,
    /// Where selective recompute reruns the op only in part (torchtitan's per-op policy: a
    /// fused QKV projection whose K third alone reruns); `None`: it reruns whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_rerun: Option<PartialRerun>,
    pub saved: Vec<Saved>,
    /// Transient bytes alive while the op runs (not kept for backward).
    pub temp_bytes: u64,
    /// Working memory the op's backward holds beside the gradients it produces (attention
    /// kernels that materialise score tiles).
    pub backward_scratch_bytes: u64,
    /// The gradient of the op's output, held while its backward runs (set where it is not
    /// already counted as another op's transient: the attention core's dO).
    pub grad_out_bytes: u64,
    /// The op's input gradient is written over the tensor it saved, so its backward adds no
    /// bytes and the saved tensor lives on as that gradient until the op before it has run
    /// its backward (Megatron-LM's vocab-parallel cross-entropy turns the kept softmax into
    /// the logits' gradient in place; so does the executor).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub grad_in_saved: bool,
    /// LoRA: the adapter elements this rank holds whole though TP splits the base layer (a
    /// column-parallel layer's A, a row-parallel layer's B); under SP their gradients are
    /// partial sums over the sequence shards, reduced over TP like the norms'.
    #[serde(skip_serializing_if = "is_zero")]
    pub lora_replicated_params: u64,
    /// A matmul run as one grouped GEMM of this many equal groups (a rank's local experts:
    /// the m rows split evenly over them, each group with its own [k x n] weight); 1 for one
    /// GEMM.
    #[serde(skip_serializing_if = "is_one")]
    pub gemm_groups: u64,
    pub comms: Vec<Collective>,
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

impl Op {
    /// An op with no parameters, FLOPs, saved tensors or communication.
    pub fn new(name: &'static str, kind: OpKind) -> Op {
        Op {
            name,
            role: OpRole::Other,
            kind,
            params: None,
            model_flops: Flops::default(),
            rank_flops: Flops::default(),
            recomputed_by_selective: false,
            partial_rerun: None,
            saved: Vec::new(),
            temp_bytes: 0,
            backward_scratch_bytes: 0,
            grad_out_bytes: 0,
            grad_in_saved: false,
            lora_replicated_params: 0,
            gemm_groups: 1,
            comms: Vec::new(),
        }
    }

    /// The same matmul run as one grouped GEMM of `groups` equal groups.
    pub fn grouped(mut self, groups: u64) -> Op {
        self.gemm_groups = groups.max(1);
        self
    }

    /// The share of the op's forward compute a rerun repeats (1 unless it reruns in part).
    pub fn rerun_compute_share(&self) -> f64 {
        self.partial_rerun.map_or(1.0, |p| p.compute_share)
    }

    /// Whether a rerun repeats the op's forward collectives.
    pub fn rerun_repeats_comms(&self) -> bool {
        self.partial_rerun.is_none_or(|p| p.comms)
    }

    /// The same op in role `role`.
    pub fn with_role(mut self, role: OpRole) -> Op {
        self.role = role;
        self
    }

    pub fn save(mut self, role: TensorRole, bytes: u64) -> Op {
        if bytes > 0 {
            self.saved.push(Saved {
                role,
                bytes,
                selective: false,
            });
        }
        self
    }

    /// Saves a tensor that selective recompute drops.
    pub fn save_selective(mut self, role: TensorRole, bytes: u64) -> Op {
        if bytes > 0 {
            self.saved.push(Saved {
                role,
                bytes,
                selective: true,
            });
        }
        self
    }

    pub fn comm(mut self, c: Collective) -> Op {
        if c.group_size > 1 && c.payload_bytes > 0 && c.count > 0 {
            self.comms.push(c);
        }
        self
    }

    /// Marks the op's input gradient as computed in place of its saved tensor.
    pub fn grad_in_place(mut self) -> Op {
        self.grad_in_saved = true;
        self
    }

    pub fn temp(mut self, bytes: u64) -> Op {
        self.temp_bytes = self.temp_bytes.max(bytes);
        self
    }
}
