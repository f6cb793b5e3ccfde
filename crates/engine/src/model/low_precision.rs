//! Low-precision recipes (Transformer Engine's FP8, MXFP8 and NVFP4 recipes): what each
//! keeps of a quantised linear layer (its weight copies, their transposes and scale tensors)
//! and the quantise kernels it runs, as memory-bound ops beside each linear layer.
//!
//! Transformer Engine's "Performance considerations" (docs/features/low_precision_training)
//! sets the rules: every GEMM operand needs a rowwise and a columnwise usage; on Hopper an
//! FP8 tensor's columnwise usage is a physical transpose, on Blackwell one per-tensor FP8
//! copy serves both; block-scaled formats (MXFP8, NVFP4, 128 x 128 blockwise FP8) scale along
//! one axis, so the two usages are two tensors with their own scales. Weights are quantised
//! once per step and cached across microbatches (Megatron passes `is_first_microbatch`).
//!
//! Every recipe's cast kernels are timed, as Transformer Engine runs them
//! (src/op_cost/cast.rs): per-tensor FP8's amax pass under current scaling, the casts its
//! norms fuse left out, block scaling's one kernel per cast.

use super::cast_kernels::{CastInput, CastPass, Scaling};
use super::op::{CollectiveKind, Op, OpKind, OpRole, ParamClass, Phase};
use crate::config::{Fp8Recipe, Precision, Resolved};
use crate::layout::GroupKind;

/// How a recipe stores a quantised tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One scale per tensor (delayed or current scaling): 1 byte a value and an FP32 scale.
    PerTensorFp8,
    /// DeepSeek-V3's blockwise FP8: one FP32 scale per 128 x 128 block of a weight and per
    /// 1 x 128 tile of an activation.
    BlockwiseFp8,
    /// MXFP8: E4M3 values with one E8M0 byte per 32 along the scaled axis.
    Mxfp8,
    /// NVFP4: E2M1 values (half a byte), one E4M3 byte per 16 along the scaled axis and a
    /// per-tensor FP32 scale.
    Nvfp4,
}

/// The recipe a configuration runs, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    pub format: Format,
    /// Copies of each quantised tensor: 2 when its columnwise usage is a tensor of its own
    /// (block scaling, or per-tensor FP8 on a GPU without native columnwise FP8 access), 1
    /// when one copy serves both.
    pub copies: u64,
    /// How its casts find their scales.
    pub scaling: Scaling,
}

/// Values per scale along the scaled axis: MXFP8's 32, NVFP4's 16, blockwise FP8's 128.
const MX_BLOCK: u64 = 32;
const NVFP4_BLOCK: u64 = 16;
const BLOCKWISE: u64 = 128;
/// An FP32 scale.
const FP32_BYTES: u64 = 4;

impl Recipe {
    /// The recipe of `r`'s precision: none for bf16, fp16 and fp32. Per-tensor FP8 keeps a
    /// transpose on GPUs whose profile has no FP4 rate (Hopper, Ada, CDNA 3), whose tensor
    /// cores read FP8 only rowwise; Blackwell and CDNA 4 read it both ways.
    pub fn of(r: &Resolved) -> Option<Recipe> {
        let tr = &r.config.training;
        let native_columnwise = r.gpu.peak_flops.fp4.is_some();
        let (format, copies, scaling) = match tr.precision {
            Precision::Fp8 => match tr.fp8_recipe.unwrap_or_default() {
                Fp8Recipe::Delayed => (
                    Format::PerTensorFp8,
                    if native_columnwise { 1 } else { 2 },
                    Scaling::Delayed,
                ),
                Fp8Recipe::Current => (
                    Format::PerTensorFp8,
                    if native_columnwise { 1 } else { 2 },
                    Scaling::Current,
                ),
                Fp8Recipe::Blockwise => (Format::BlockwiseFp8, 2, Scaling::Block),
            },
            Precision::Mxfp8 => (Format::Mxfp8, 2, Scaling::Block),
            Precision::Nvfp4 => (Format::Nvfp4, 2, Scaling::Block),
            Precision::Bf16 | Precision::Fp16 | Precision::Fp32 => return None,
        };
        Some(Recipe {
            format,
            copies,
            scaling,
        })
    }

    /// Bytes of one copy of a [rows x cols] tensor quantised along `cols` (its rows are
    /// contiguous), scales included; `weight` picks blockwise FP8's 128 x 128 weight blocks
    /// over its 1 x 128 activation tiles.
    pub fn copy_bytes(&self, rows: u64, cols: u64, weight: bool) -> u64 {
        let values = rows * cols;
        match self.format {
            Format::PerTensorFp8 => values + FP32_BYTES,
            Format::Mxfp8 => values + rows * cols.div_ceil(MX_BLOCK),
            Format::Nvfp4 => values.div_ceil(2) + rows * cols.div_ceil(NVFP4_BLOCK) + FP32_BYTES,
            Format::BlockwiseFp8 => {
                let scales = if weight {
                    rows.div_ceil(BLOCKWISE) * cols.div_ceil(BLOCKWISE)
                } else {
                    rows * cols.div_ceil(BLOCKWISE)
                };
                values + scales * FP32_BYTES
            }
        }
    }

    /// Bytes of the values of `elements` weight elements in the recipe's format: what
    /// `training.fp8_param_gather` holds in place of the bf16 weights and all-gathers
    /// (Megatron-Core's param buffer under `--fp8-param-gather` or `--fp4-param-gather` maps
    /// the rowwise data only, 1 byte a value or NVFP4's packed half byte: `_get` with
    /// `get_nvfp4_rowwise_packed_shape`, megatron/core/distributed/param_and_grad_buffer.py);
    /// the scales stay with Transformer Engine's cached copy.
    pub fn held_weight_bytes(&self, elements: u64) -> u64 {
        match self.format {
            Format::Nvfp4 => elements.div_ceil(2),
            Format::PerTensorFp8 | Format::Mxfp8 | Format::BlockwiseFp8 => elements,
        }
    }

    /// Bytes of every copy of a [rows x cols] tensor: the rowwise one and, with two copies,
    /// the columnwise one ([cols x rows], scaled along the rows).
    pub fn tensor_bytes(&self, rows: u64, cols: u64, weight: bool) -> u64 {
        let rowwise = self.copy_bytes(rows, cols, weight);
        if self.copies > 1 {
            rowwise + self.copy_bytes(cols, rows, weight)
        } else {
            rowwise
        }
    }

    /// Bytes Transformer Engine keeps of a GEMM input X, `rows` tokens of `cols` features, for
    /// the weight gradient dW = dY^T X (transformer_engine/pytorch/module/linear.py,
    /// `_Linear.forward`; layernorm_linear.py, `_LayerNormLinear.forward`; grouped_linear.py):
    /// the quantised input with its row-wise usage discarded, so the column-wise usage alone,
    /// scaled along the tokens: MXFP8 1 byte a value and an E8M0 byte per 32 tokens, NVFP4
    /// half a byte and an E4M3 byte per 16 and the FP32 tensor scale, blockwise FP8 an FP32
    /// scale per 128. Per-tensor FP8 keeps one 1-byte copy in either usage (the row-wise one
    /// where backward re-gathers it, since its column-wise data cannot be all-gathered:
    /// `supports_only_rowwise_all_gather`). A layer-norm-fused layer whose backward re-gathers
    /// its sequence-parallel input (`norm_gather`) drops the row-wise usage only for MXFP8 and
    /// blockwise FP8, so under NVFP4 it keeps both usages.
    pub fn saved_input_bytes(&self, rows: u64, cols: u64, norm_gather: bool) -> u64 {
        match self.format {
            Format::PerTensorFp8 => rows * cols + FP32_BYTES,
            Format::Mxfp8 | Format::BlockwiseFp8 => self.copy_bytes(cols, rows, false),
            Format::Nvfp4 => {
                let columnwise = self.copy_bytes(cols, rows, false);
                if norm_gather {
                    columnwise + self.copy_bytes(rows, cols, false)
                } else {
                    columnwise
                }
            }
        }
    }

    /// Whether Megatron-Core has a layer save its original (bf16) input rather than the
    /// quantised copy (megatron/core/transformer/attention.py, `Attention.__init__`: the
    /// output projection under every recipe but delayed-scaling FP8, since the fused
    /// attention already saves its output; `set_save_original_input` in
    /// megatron/core/extensions/transformer_engine.py).
    pub fn saves_original_projection_input(&self, fp8_recipe: Option<Fp8Recipe>) -> bool {
        !(self.format == Format::PerTensorFp8
            && fp8_recipe.unwrap_or_default() == Fp8Recipe::Delayed)
    }

    /// The cast kernels of a [rows x cols] bf16 tensor (every copy written); `norm_fused`:
    /// the norm before the layer quantises it (src/op_cost/cast.rs).
    pub fn cast(&self, rows: u64, cols: u64, weight: bool, norm_fused: bool) -> CastPass {
        CastPass::of(CastInput {
            scaling: self.scaling,
            elements: rows * cols,
            quantized_bytes: self.tensor_bytes(rows, cols, weight),
            copies: self.copies,
            norm_fused,
        })
    }

    /// The quantise op of a linear layer (`l`): forward, its input X cast (by the norm where
    /// `norm_fused`); backward, the output gradient dY (`grad_output_preprocess` in
    /// transformer_engine/pytorch/module/base.py: never fused with a norm); per step, the
    /// weights, cast on the first microbatch and cached over the rest (Megatron passes
    /// `is_first_microbatch`; module/linear.py `quantize_weight`).
    pub fn quantize_op(&self, l: &QuantizedLinear) -> Op {
        let Gemm { n, k, .. } = l.gemm;
        let weights = l.tensors * self.tensor_bytes(n, k, true);
        let w = self.cast(n, k, true, false);
        Op::new(
            "quantize",
            OpKind::Quantize {
                fwd: self.cast(l.input_rows, k, false, l.norm_fused),
                bwd: self.cast(l.grad_rows, n, false, false),
                weight_elements: l.tensors * n * k,
                weight_cache_bytes: weights,
                weight_step_bytes: l.tensors * (w.amax_bytes + w.cast_bytes),
                expert: l.expert,
            },
        )
    }
}

/// A GEMM's shape: [m x k] . [k x n].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// One linear layer as its recipe casts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizedLinear {
    /// Its GEMM on this rank, [m x k] . [k x n] (weights [n x k] as TE keeps them).
    pub gemm: Gemm,
    /// Rows of X and of dY this rank casts: m, or under sequence parallelism the sequence
    /// shard of a tensor TE casts before gathering it in FP8 (a column-parallel layer's
    /// input, a row-parallel layer's output gradient: `_Linear.forward` and
    /// `grad_output_preprocess` quantise the local shard, then all-gather it).
    pub input_rows: u64,
    pub grad_rows: u64,
    /// Weight tensors of that shape (a rank's experts).
    pub tensors: u64,
    /// Routed experts' weights.
    pub expert: bool,
    /// The norm before the layer quantises its input (TE's LayerNormLinear).
    pub norm_fused: bool,
}

/// The TP ranks `op` shards a tensor over before the sequence-parallel collective `kind` of
/// `phase` gathers or scatters it; 1 without one.
fn sp_shards(op: &Op, phase: Phase, kind: CollectiveKind) -> u64 {
    op.comms
        .iter()
        .find(|c| c.group == GroupKind::Tp && c.phase == phase && c.kind == kind)
        .map_or(1, |c| u64::from(c.group_size.max(1)))
}

/// Appends a quantise op after every linear layer of a layer block that the recipe casts:
/// GEMMs with weights, but the MoE router (Megatron runs it in fp32) and LoRA adapters
/// (kept in bf16 beside the frozen base).
pub fn add_quantize_ops(ops: &mut Vec<Op>, recipe: &Recipe) {
    let mut out = Vec::with_capacity(ops.len() * 2);
    for op in ops.drain(..) {
        let q = match (op.kind, op.params) {
            (OpKind::Matmul { m, n, k }, Some(p))
                if !op.name.contains("router") && !op.name.contains("lora") && n * k > 0 =>
            {
                // A column-parallel layer all-gathers its input forward, a row-parallel one
                // reduce-scatters its output (and gathers dY backward).
                let input = sp_shards(&op, Phase::Forward, CollectiveKind::AllGather);
                let grad = sp_shards(&op, Phase::Forward, CollectiveKind::ReduceScatter);
                Some(recipe.quantize_op(&QuantizedLinear {
                    gemm: Gemm { m, n, k },
                    input_rows: m.div_ceil(input),
                    grad_rows: m.div_ceil(grad),
                    tensors: (p.rank / (n * k)).max(1),
                    expert: p.class == ParamClass::Expert,
                    norm_fused: op.role == OpRole::NormFusedLinear,
                }))
            }
            _ => None,
        };
        out.push(op);
        out.extend(q);
    }
    *ops = out;
}

/// A block's quantised weights: what the recipe caches and what casting them costs a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizedWeights {
    /// Weight elements quantised (dense and expert).
    pub dense_elements: u64,
    pub expert_elements: u64,
    /// Bytes of their cached low-precision copies with scales.
    pub cache_bytes: u64,
    /// HBM bytes of casting them once a step.
    pub step_bytes: u64,
}

impl QuantizedWeights {
    /// The sums over a block's quantise ops.
    pub fn of(ops: &[Op]) -> QuantizedWeights {
        let mut q = QuantizedWeights::default();
        for op in ops {
            if let OpKind::Quantize {
                weight_elements,
                weight_cache_bytes,
                weight_step_bytes,
                expert,
                ..
            } = op.kind
            {
                q.step_bytes += weight_step_bytes;
                if expert {
                    q.expert_elements += weight_elements;
                } else {
                    q.dense_elements += weight_elements;
                }
                q.cache_bytes += weight_cache_bytes;
            }
        }
        q
    }

    /// `n` blocks' worth added.
    pub fn add(&mut self, o: &QuantizedWeights, n: u64) {
        self.dense_elements += o.dense_elements * n;
        self.expert_elements += o.expert_elements * n;
        self.cache_bytes += o.cache_bytes * n;
        self.step_bytes += o.step_bytes * n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 4096 x 4096 weight by hand: MXFP8 16 MiB of values and 512 KiB of E8M0 scales
    /// per copy, two copies; NVFP4 8 MiB and 1 MiB (+4 B) per copy; blockwise FP8 16 MiB and
    /// 32 x 32 FP32 scales per copy; per-tensor FP8 on Hopper 16 MiB + 4 B twice.
    #[test]
    fn weight_copies_by_hand() {
        let n = 4096u64;
        let mib = 1u64 << 20;
        let r = |format, copies| Recipe {
            format,
            copies,
            scaling: Scaling::Block,
        };
        assert_eq!(
            r(Format::Mxfp8, 2).tensor_bytes(n, n, true),
            2 * (16 * mib + mib / 2)
        );
        assert_eq!(
            r(Format::Nvfp4, 2).tensor_bytes(n, n, true),
            2 * (8 * mib + mib + 4)
        );
        assert_eq!(
            r(Format::BlockwiseFp8, 2).tensor_bytes(n, n, true),
            2 * (16 * mib + 32 * 32 * 4)
        );
        assert_eq!(
            r(Format::PerTensorFp8, 2).tensor_bytes(n, n, true),
            2 * (16 * mib + 4)
        );
        assert_eq!(
            r(Format::PerTensorFp8, 1).tensor_bytes(n, n, true),
            16 * mib + 4
        );
        // Activations of blockwise FP8: 1 x 128 tiles, 32 scales a row of 4096.
        assert_eq!(
            r(Format::BlockwiseFp8, 1).copy_bytes(8, n, false),
            8 * n + 8 * 32 * 4
        );
    }
}
