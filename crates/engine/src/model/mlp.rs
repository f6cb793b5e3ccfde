//! The dense MLP block: norm, up (and gate) projection, GeLU or SwiGLU, down projection, dropout.

use super::attention::push_linear;
use super::dims::Dims;
use super::linear::{Linear, SavedInput, Split};
use super::norm::{dropout, norm};
use super::op::{Op, OpKind, TensorRole};
use crate::config::{Activation, LoraTarget, ModelConfig, TrainingConfig};

/// Width of the first projection: f for GeLU, 2f (gate and up, fused) for SwiGLU.
pub fn fc1_width(act: Activation, f: u64) -> u64 {
    match act {
        Activation::Gelu => f,
        Activation::Swiglu => 2 * f,
    }
}

/// The element-wise activation on `rows` x `width` (its input is saved for backward).
pub fn activation_op(name: &'static str, rows: u64, width: u64, d: &Dims) -> Op {
    let bytes = rows * width * d.act;
    Op::new(name, OpKind::MemoryBound { bytes: 2 * bytes }).save(TensorRole::Input, bytes)
}

/// Appends the pre-MLP norm (shared by dense and MoE layers).
pub fn mlp_norm(ops: &mut Vec<Op>, m: &ModelConfig, d: &Dims) {
    ops.push(norm("mlp.norm", m.normalization, d.h, d.n_sp, d));
}

/// Appends a TP-split MLP of intermediate size `f` (after the norm). `save_input`: fc1 saves
/// its input (a dense MLP's fc1 is layer-norm-fused in Megatron-Core's TE spec); a shared
/// expert's input is the router's saved input, beside which a low-precision recipe's fc1
/// (TEColumnParallelLinear) keeps its own quantised copy.
pub fn mlp_body(
    ops: &mut Vec<Op>,
    names: [&'static str; 6],
    f: u64,
    m: &ModelConfig,
    tr: &TrainingConfig,
    d: &Dims,
    save_input: bool,
) {
    let [fc1_name, act_name, fc2_name, fc2_bias, fc1_lora, fc2_lora] = names;
    let trainable = !d.lora;
    let lora = |t: LoraTarget| (d.lora && tr.lora.targets.contains(&t)).then_some(tr.lora.rank);
    let width = fc1_width(m.activation, f);
    let fc1 = Linear {
        name: fc1_name,
        in_features: d.h,
        out_features: width,
        split: Split::Column,
        bias: m.add_bias_linear,
        trainable,
        save_input: save_input || d.quantized.is_some(),
        communicate: true,
        sp_gathered_input: true,
        input: if save_input {
            SavedInput::NormFused
        } else {
            SavedInput::Quantized
        },
    };
    push_linear(ops, fc1, d, lora(LoraTarget::Fc1), "", fc1_lora);
    ops.push(activation_op(act_name, d.n, width.div_ceil(d.t), d));
    let fc2 = Linear::sharded(fc2_name, f, d.h, Split::Row, m.add_bias_linear, trainable);
    push_linear(ops, fc2, d, lora(LoraTarget::Fc2), fc2_bias, fc2_lora);
}

/// Appends the whole dense MLP block.
pub fn mlp_block(ops: &mut Vec<Op>, m: &ModelConfig, tr: &TrainingConfig, d: &Dims) {
    mlp_norm(ops, m, d);
    let names = [
        "mlp.fc1",
        "mlp.act",
        "mlp.fc2",
        "mlp.fc2_bias",
        "mlp.fc1_lora",
        "mlp.fc2_lora",
    ];
    mlp_body(ops, names, m.ffn_hidden_size, m, tr, d, true);
    ops.push(dropout("mlp.dropout", d.n_sp, d.h, d.hidden_dropout));
}
