//! Training settings: batch, sequence, precision, recomputation, optimizer, fine-tuning mode.

use super::enums::{
    Dtype, FlopsAttention, Fp8Recipe, LoraTarget, Optimizer, OptimizerStateDtype, Precision,
    Recompute, RecomputeModule, TrainingMode,
};
use super::framework::Framework;
use serde::{Deserialize, Serialize};

/// LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: u64,
    pub targets: Vec<LoraTarget>,
    /// The adapter output is scaled by alpha / rank; absent: alpha = rank (scale 1, Hu et al.
    /// set alpha to the first rank tried). Changes no estimate, only the executed update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 16,
            targets: vec![LoraTarget::Qkv, LoraTarget::Proj],
            alpha: None,
        }
    }
}

/// One training step's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// The framework running the step: its overlap and bucketing defaults apply where the
    /// configuration sets none (src/config/framework.rs; docs/time-model.md).
    #[serde(default)]
    pub framework: Framework,
    pub seq_length: u64,
    pub micro_batch_size: u64,
    pub global_batch_size: u64,
    pub precision: Precision,
    /// FP8's scaling recipe (delayed, current, blockwise); only with `precision = "fp8"`.
    /// Absent: delayed scaling, Transformer Engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_recipe: Option<Fp8Recipe>,
    /// Keep the linear weights in the low-precision format and all-gather them so
    /// (Megatron's `--fp8-param-gather`; under nvfp4 its `--fp4-param-gather`): the bf16 copy
    /// of those weights is no longer held and the distributed optimizer's parameter all-gather
    /// moves 1 byte per weight (NVFP4: half a byte) and its scales. fp8, mxfp8 and nvfp4.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp8_param_gather: bool,
    /// Decoder layers at the start and the end of the model kept in bf16 under a
    /// low-precision recipe (Megatron's `--num-layers-at-start-in-bf16` /
    /// `--num-layers-at-end-in-bf16`). Absent: 1 and 1 under nvfp4 (NVIDIA's NVFP4 recipe
    /// keeps its first and last layers in bf16), 0 otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_layers_at_start: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_layers_at_end: Option<u32>,
    /// Gradient accumulation buffer dtype (Megatron's fp32 `main_grad` by default).
    pub grad_dtype: Dtype,
    pub recompute: Recompute,
    /// What `recompute = "selective"` reruns (Megatron's `--recompute-modules`); absent:
    /// `["core_attn"]`, the attention core. Only with selective recomputation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// Decoder layers whose saved activations are offloaded to host memory between their
    /// forward and backward (Megatron's `--cpu-offloading --cpu-offloading-num-layers N`
    /// with activations and not weights offloaded); 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offload_activation_layers: u32,
    /// The share of the optimizer state kept in host memory and updated on the CPU (CPU
    /// optimizer offload: Megatron-Core's `--optimizer-cpu-offload` with
    /// `--optimizer-offload-fraction`, DeepSpeed's `offload_optimizer` with `device: cpu`);
    /// 0: none, 1: all of it (src/memory/optimizer_offload.rs).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub optimizer_offload_fraction: f64,
    /// The optimizer: `adam` (default) or `muon` (Adam on the parameters Muon does not
    /// take: embeddings, output layer, norms, biases).
    #[serde(default, skip_serializing_if = "is_adam")]
    pub optimizer: Optimizer,
    /// The optimizer keeps an fp32 master copy of the low-precision weights (Micikevicius et
    /// al. 2018); false: pure-bf16 training, the optimizer updates the bf16 weights (torch's
    /// AdamW on bf16 parameters; DeepSpeed's `bf16_master_weights_and_grads`, which keeps a
    /// bf16 copy of its partition). Megatron-Core has no such mode.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub master_weights: bool,
    /// What the optimizer stores its moments in (Megatron's `--exp-avg-dtype` and
    /// `--exp-avg-sq-dtype`, DeepSpeed's `bf16_optimizer_states`, bitsandbytes' 8-bit Adam).
    /// Absent: fp32, or the weights' bf16 without a master copy (torch's AdamW keeps its
    /// moments in the parameters' dtype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_state_dtype: Option<OptimizerStateDtype>,
    /// Fused attention (FlashAttention): no s x s tensors are saved.
    pub flash_attention: bool,
    /// The fused attention kernel the framework runs ("flash-attention-2",
    /// "flash-attention-3", "cudnn", "flash-attention-triton"), timed at its published (or
    /// derived) rates on this GPU (calibration/data/attention-kernels.json); "none" times it
    /// at the profile's `efficiency.attention` instead. Default: the GPU profile's kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_kernel: Option<String>,
    pub flops_attention: FlopsAttention,
    /// The layers run as captured CUDA graphs (Megatron's `--enable-cuda-graph`, torch.compile's
    /// mode "reduce-overhead"): the host issues one graph launch per layer and pass instead
    /// of each kernel (calibration/data/host-overhead.json).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cuda_graphs: bool,
    /// Every kernel launch returns only once the kernel has run (`CUDA_LAUNCH_BLOCKING=1` in
    /// the launch environment): the host's issue adds to the device's time instead of hiding
    /// under it, each launch waits for the kernel's completion to reach the host, and no
    /// communication overlaps compute (calibration/data/host-overhead.json).
    #[serde(default, skip_serializing_if = "is_false")]
    pub launch_blocking: bool,
    /// Megatron-Core runs the routed experts as one fused grouped MLP of Transformer Engine's
    /// op fuser (`use_transformer_engine_op_fuser` with `NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`;
    /// moe/experts.py, `_is_fused_impl_supported`): fc1, the (clamped) gated activation and
    /// fc2 with its probability-scaled bias in one CuTe DSL kernel chain, so the unfused
    /// path's clamp and bias kernels do not run.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fused_grouped_mlp: bool,
    pub mode: TrainingMode,
    pub lora: LoraConfig,
    /// CUDA loads every kernel of every library when the context is created
    /// (`CUDA_MODULE_LOADING=EAGER`, the only behaviour before CUDA 11.7 and PyTorch 1.13):
    /// the context takes the profile's `runtime_memory.cuda_context_eager_bytes`. Default:
    /// lazy loading, the default since.
    #[serde(default, skip_serializing_if = "is_false")]
    pub eager_module_loading: bool,
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            framework: Framework::MegatronCore,
            seq_length: 8192,
            micro_batch_size: 1,
            global_batch_size: 64,
            precision: Precision::Bf16,
            fp8_recipe: None,
            fp8_param_gather: false,
            bf16_layers_at_start: None,
            bf16_layers_at_end: None,
            grad_dtype: Dtype::Fp32,
            recompute: Recompute::Selective,
            recompute_modules: None,
            offload_activation_layers: 0,
            optimizer_offload_fraction: 0.0,
            optimizer: Optimizer::Adam,
            master_weights: true,
            optimizer_state_dtype: None,
            flash_attention: true,
            attention_kernel: None,
            flops_attention: FlopsAttention::Causal,
            cuda_graphs: false,
            launch_blocking: false,
            fused_grouped_mlp: false,
            mode: TrainingMode::Full,
            lora: LoraConfig::default(),
            eager_module_loading: false,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

fn is_adam(o: &Optimizer) -> bool {
    *o == Optimizer::Adam
}

impl TrainingConfig {
    /// What selective recomputation reruns: the configured modules, or the attention core.
    pub fn recompute_modules(&self) -> &[RecomputeModule] {
        self.recompute_modules
            .as_deref()
            .unwrap_or(&[RecomputeModule::CoreAttn])
    }

    /// Whether selective recomputation reruns `module`.
    pub fn recomputes(&self, module: RecomputeModule) -> bool {
        self.recompute == Recompute::Selective && self.recompute_modules().contains(&module)
    }

    /// Decoder layers kept in bf16 at the (start, end) of the model under a low-precision
    /// recipe: the settings, or 1 and 1 under nvfp4 and 0 otherwise (see the fields).
    pub fn bf16_layers(&self) -> (u32, u32) {
        let default = u32::from(self.precision == Precision::Nvfp4);
        match self.precision {
            Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4 => (
                self.bf16_layers_at_start.unwrap_or(default),
                self.bf16_layers_at_end.unwrap_or(default),
            ),
            _ => (0, 0),
        }
    }

    /// The moments' element type: the setting, or fp32 with a master copy and bf16 without
    /// (see the field).
    pub fn optimizer_state_dtype(&self) -> OptimizerStateDtype {
        self.optimizer_state_dtype
            .unwrap_or(if self.master_weights {
                OptimizerStateDtype::Fp32
            } else {
                OptimizerStateDtype::Bf16
            })
    }

    /// Bytes of one weight element during the step.
    pub fn weight_bytes(&self) -> u64 {
        match self.precision {
            Precision::Fp32 => 4,
            _ => 2,
        }
    }

    /// Bytes of one saved activation element (fp8 saves linear inputs in 1 byte; see the ledger).
    pub fn activation_bytes(&self) -> u64 {
        match self.precision {
            Precision::Fp32 => 4,
            _ => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `launch_blocking` is absent from a written configuration unless set, and round-trips
    /// through JSON and TOML when it is.
    #[test]
    fn launch_blocking_round_trips() {
        let off = TrainingConfig::default();
        assert!(!off.launch_blocking);
        let v = serde_json::to_value(&off).unwrap();
        assert!(v.get("launch_blocking").is_none(), "{v}");
        let on = TrainingConfig {
            launch_blocking: true,
            ..TrainingConfig::default()
        };
        let v = serde_json::to_value(&on).unwrap();
        assert_eq!(v["launch_blocking"], true);
        let back: TrainingConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back, on);
        let text = toml::to_string(&on).unwrap();
        assert!(text.contains("launch_blocking = true"), "{text}");
        assert_eq!(toml::from_str::<TrainingConfig>(&text).unwrap(), on);
    }
}
