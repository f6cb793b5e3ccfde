//! Small closed vocabularies of the configuration (serde names follow Megatron-LM where it has one).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Defines a kebab/snake-named enum with serde, Display and FromStr that agree on the names.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The configuration-file spellings of `values`, comma-separated (for messages).
            pub fn names(values: &[$name]) -> String {
                values.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
            /// The configuration-file spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!(
                        "unknown value '{s}' (expected one of: {})",
                        [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}

named_enum!(
    /// Pipeline schedule. Stages are numbered globally 0..pp*vpp-1.
    ScheduleKind {
        /// All forwards, then all backwards (Huang et al. 2019, GPipe).
        Gpipe => "gpipe",
        /// One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021).
        OneFOneB => "1f1b",
        /// Megatron-LM's interleaved 1F1B with `vpp` model chunks per rank.
        Interleaved1F1B => "interleaved-1f1b",
        /// Zero-bubble ZB-H1 (Qi et al. 2024): backward split into input (I) and weight (W) gradients.
        ZbH1 => "zb-h1",
        /// Zero-bubble ZB-V (Qi et al. 2024): two chunks per rank in a V shape.
        ZbV => "zb-v",
        /// DeepSeek's DualPipe, V-shaped single-direction form (DualPipeV).
        DualPipeV => "dualpipe-v",
    }
);

named_enum!(
    /// How the pipeline engine runs its sends and receives between stages
    /// (`parallel.pp_p2p`).
    PpP2p {
        /// Asynchronous: a hop delays only the receiving stage; the sender computes on
        /// (Megatron-Core's p2p, issued on its own stream).
        Overlapped => "overlapped",
        /// Blocking: every send and receive holds the stage's compute stream for the transfer,
        /// as 2021 Megatron-LM (`_communicate` then `torch.cuda.synchronize()`) and DeepSpeed's
        /// `PipelineEngine` (send/recv instructions between the compute instructions) ran them.
        Blocking => "blocking",
    }
);

named_enum!(
    /// The MoE router's score function (Megatron's `--moe-router-score-function`).
    #[derive(Default)]
    RouterScore {
        /// Softmax over the experts (Switch Transformer, GShard, Mixtral).
        #[default]
        Softmax => "softmax",
        /// A sigmoid per expert (DeepSeek-V3).
        Sigmoid => "sigmoid",
    }
);

named_enum!(
    /// How an MoE layer moves its routed tokens to the experts' EP ranks and back
    /// (Megatron-Core's `moe_token_dispatcher_type`, megatron/core/transformer/moe/
    /// token_dispatcher.py).
    #[derive(Default)]
    TokenDispatcher {
        /// `MoEAlltoAllTokenDispatcher`: each (token, expert) row permuted and sent by an NCCL
        /// all-to-all over the EP group.
        #[default]
        AllToAll => "alltoall",
        /// `MoEAllGatherTokenDispatcher`: every rank all-gathers the hidden states of the EP
        /// group, keeps its experts' rows, and reduce-scatters the outputs back.
        AllGather => "allgather",
        /// `MoEFlexTokenDispatcher`: the fused dispatch and combine kernels of the backend in
        /// `parallel.moe_flex_dispatcher_backend` (each token sent once per destination).
        Flex => "flex",
    }
);

named_enum!(
    /// The kernels of the flex token dispatcher (Megatron-Core's
    /// `moe_flex_dispatcher_backend`, megatron/core/transformer/moe/fused_a2a.py).
    #[derive(Default)]
    FlexBackend {
        /// DeepEP's normal (high-throughput) dispatch and combine kernels: NVLink inside a
        /// node of at most 8 GPUs, RDMA between nodes (deepseek-ai/DeepEP).
        #[default]
        DeepEp => "deepep",
        /// NVIDIA's HybridEP (DeepEP's hybrid-ep branch): TMA over NVLink, RDMA between NVLink
        /// domains; the backend that spans a multi-node NVLink domain (MNNVL).
        HybridEp => "hybridep",
    }
);

named_enum!(
    /// How context-parallel ranks exchange keys and values.
    CpComm {
        /// Ring attention with a contiguous sequence split (Liu et al. 2023, Ring Attention).
        P2p => "p2p",
        /// Ring attention with the load-balanced zigzag split (2*cp chunks).
        Zigzag => "zigzag",
        /// All-gather K/V before attention, reduce-scatter dK/dV after (Megatron's all-gather CP).
        Allgather => "allgather",
        /// DeepSpeed-Ulysses all-to-all of Q/K/V and output (needs heads divisible by cp).
        A2a => "a2a",
    }
);

named_enum!(
    /// Numeric type of weights and activations during the step.
    Precision {
        Bf16 => "bf16",
        Fp16 => "fp16",
        /// FP8 matmuls (Transformer Engine): bf16 weights kept, linear inputs saved in 1 byte.
        /// The scaling recipe is `training.fp8_recipe`.
        Fp8 => "fp8",
        Fp32 => "fp32",
        /// MXFP8 (Transformer Engine's MXFP8BlockScaling, OCP microscaling): E4M3 values with
        /// one E8M0 scale per 32, scaled in the tensor cores (Blackwell, CDNA 4); GEMMs at the
        /// FP8 rate, linear inputs saved in 1 byte.
        Mxfp8 => "mxfp8",
        /// NVFP4 (Transformer Engine's NVFP4BlockScaling): E2M1 values with one E4M3 scale per
        /// 16 and a per-tensor FP32 scale; linear-layer GEMMs at the FP4 rate (Blackwell).
        Nvfp4 => "nvfp4",
    }
);

named_enum!(
    /// How FP8 training scales its tensors (`training.fp8_recipe`; Transformer Engine's
    /// recipes, Megatron-Core's `--fp8-recipe`).
    #[derive(Default)]
    Fp8Recipe {
        /// One scale per tensor from the amax history of past steps (TE's DelayedScaling, the
        /// default).
        #[default]
        Delayed => "delayed",
        /// One scale per tensor from the tensor's own amax, computed before each cast (TE's
        /// Float8CurrentScaling; Megatron's "tensorwise").
        Current => "current",
        /// DeepSeek-V3's fine-grained scaling: one FP32 scale per 128 x 128 block of weights
        /// and per 1 x 128 tile of activations (TE's Float8BlockScaling).
        Blockwise => "blockwise",
    }
);

named_enum!(
    /// Element type of a stored buffer.
    Dtype {
        Fp32 => "fp32",
        Bf16 => "bf16",
        Fp16 => "fp16",
        Fp8 => "fp8",
    }
);

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp8 => 1,
        }
    }
}

named_enum!(
    /// Element type of Adam's two moments (and Muon's momentum) as the optimizer stores them.
    OptimizerStateDtype {
        Fp32 => "fp32",
        /// Megatron-Core's precision-aware optimizer (TE FusedAdam), DeepSpeed's
        /// `bf16_optimizer_states`, or torch's AdamW on bf16 parameters.
        Bf16 => "bf16",
        /// Megatron-Core's precision-aware optimizer, with one fp32 scale per tensor.
        Fp16 => "fp16",
        /// FP8 E4M3 with one fp32 scale per tensor (TE FusedAdam's `torch.uint8` states).
        Fp8 => "fp8",
        /// bitsandbytes' 8-bit Adam (Dettmers et al. 2022, "8-bit Optimizers via Block-wise
        /// Quantization"): one byte per element and one fp32 absmax per block of 2048.
        Int8 => "int8",
    }
);

/// Elements per block of bitsandbytes' block-wise 8-bit optimizer states, each block with
/// one fp32 absmax (bitsandbytes/optim/optimizer.py, `Optimizer2State.init_state`).
pub const INT8_STATE_BLOCK: u64 = 2048;

impl OptimizerStateDtype {
    /// Bytes of `n` elements of one moment: the elements, and for int8 the fp32 absmax of
    /// each block of [`INT8_STATE_BLOCK`] (fp16 and fp8 keep one fp32 scale per tensor,
    /// left out: 4 bytes beside millions of elements).
    pub fn moment_bytes(self, n: u64) -> u64 {
        match self {
            OptimizerStateDtype::Fp32 => 4 * n,
            OptimizerStateDtype::Bf16 | OptimizerStateDtype::Fp16 => 2 * n,
            OptimizerStateDtype::Fp8 => n,
            OptimizerStateDtype::Int8 => n + 4 * n.div_ceil(INT8_STATE_BLOCK),
        }
    }
}

named_enum!(
    /// Activation recomputation (Korthikanti et al. 2022).
    Recompute {
        None => "none",
        /// Recompute the core attention only (softmax, dropout, attention over V).
        Selective => "selective",
        /// Recompute whole layers from their saved inputs.
        Full => "full",
    }
);

named_enum!(
    /// A part of a layer that selective recomputation drops and reruns (Megatron-Core's
    /// `--recompute-modules`, megatron/core/transformer/transformer_config.py). `moe_act`,
    /// `layernorm` and `mla_up_proj` discard only their output after its consumer has run
    /// (output-discarding checkpoints); the others checkpoint a whole submodule from its input.
    RecomputeModule {
        /// The attention core (today's `selective`).
        CoreAttn => "core_attn",
        /// The routed experts' activation function: the expert fc2's saved input is rebuilt.
        MoeAct => "moe_act",
        /// The norms Transformer Engine does not fuse into the next linear layer (the MoE
        /// layer's pre-MLP norm, MLA's input norm): their outputs are rebuilt.
        Layernorm => "layernorm",
        /// MLA's query and key/value up-projections (and RoPE): Q, K, V are rebuilt.
        MlaUpProj => "mla_up_proj",
        /// The dense MLP, from its input.
        Mlp => "mlp",
        /// The whole MoE block (router, dispatch, experts, combine), from its input.
        Moe => "moe",
        /// The shared experts, from their input.
        SharedExperts => "shared_experts",
        /// torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`): a
        /// dense layer is one checkpoint that keeps only the outputs of the ops on
        /// torchtitan's save list and reruns every other op (src/model/per_op.rs).
        PerOp => "per_op",
    }
);

named_enum!(
    /// The optimizer of the step (Megatron's `--optimizer`).
    #[derive(Default)]
    Optimizer {
        /// Adam (Kingma & Ba 2015) with an fp32 master copy and two fp32 moments.
        #[default]
        Adam => "adam",
        /// Muon (Jordan et al. 2024; Liu et al. 2025, "Muon is Scalable for LLM Training") on
        /// the 2-D weight matrices: one fp32 momentum buffer and a Newton-Schulz
        /// orthogonalisation per step; Adam on embeddings, output layer, norms and biases.
        Muon => "muon",
    }
);

/// Muon's Newton-Schulz iterations a step (Megatron's `--muon-num-ns-steps`, default 5): the
/// count parsim models, so the importer refuses another.
pub const MUON_NS_STEPS: u64 = 5;

named_enum!(
    /// How attention FLOPs are counted for model FLOPs.
    FlopsAttention {
        /// Half of the s x s scores for a causal mask (Megatron-LM's current accounting).
        Causal => "causal",
        /// All s x s scores (Narayanan et al. 2021; PaLM's MFU).
        Full => "full",
    }
);

named_enum!(
    /// MLP non-linearity.
    Activation {
        Swiglu => "swiglu",
        Gelu => "gelu",
    }
);

named_enum!(
    /// Normalisation layer.
    Normalization {
        Rmsnorm => "rmsnorm",
        Layernorm => "layernorm",
    }
);

named_enum!(
    /// Position embedding.
    PositionEmbedding {
        /// Rotary (Su et al. 2021): no parameters.
        Rope => "rope",
        /// Learned absolute positions (GPT-2/3): max_position_embeddings x hidden parameters.
        Learned => "learned",
        None => "none",
    }
);

named_enum!(
    /// Full fine-tuning / pre-training, or LoRA adapters on frozen base weights (Hu et al. 2021).
    TrainingMode {
        Full => "full",
        Lora => "lora",
    }
);

named_enum!(
    /// Linear projections that LoRA adapters can target.
    LoraTarget {
        Qkv => "qkv",
        Proj => "proj",
        Fc1 => "fc1",
        Fc2 => "fc2",
    }
);
