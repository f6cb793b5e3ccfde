//! Latent MoE (NVIDIA 2026, Nemotron 3 Super and Ultra; Megatron's `--moe-latent-size`): an MoE
//! layer projects its tokens from the hidden size down to a latent width before routing them
//! to the experts, and the combined expert output back up after, so the all-to-all and the
//! routed experts work at the latent width. Megatron-Core's moe_layer.py builds both as
//! `TELinear(..., parallel_mode="duplicated")`: the whole weight on every TP rank, applied to
//! the rank's sequence-parallel shard of tokens, like the router.

use super::dims::Dims;
use super::op::{Flops, Op, OpKind, ParamClass, Params, TensorRole};
use crate::config::ModelConfig;

/// Appends `fc1_latent_proj` on the rank's `rows` routed tokens when the model has a latent.
pub fn project_down(ops: &mut Vec<Op>, m: &ModelConfig, rows: u64, d: &Dims) {
    if let Some(latent) = m.moe_latent_size {
        let dims = (d.h, latent);
        ops.push(latent_proj(
            "moe.fc1_latent_proj",
            rows,
            dims,
            d.quantized.is_some(),
            d,
        ));
    }
}

/// Appends `fc2_latent_proj` on the rank's `rows` combined tokens when the model has a latent.
pub fn project_up(ops: &mut Vec<Op>, m: &ModelConfig, rows: u64, d: &Dims) {
    if let Some(latent) = m.moe_latent_size {
        ops.push(latent_proj(
            "moe.fc2_latent_proj",
            rows,
            (latent, d.h),
            true,
            d,
        ));
    }
}

/// One latent projection, `i` -> `o`, on the rank's `rows` routed tokens (the sequence shard):
/// `fc1_latent_proj` (hidden -> latent) before the dispatch, `fc2_latent_proj` (latent ->
/// hidden) after the combine. It saves its input for the weight gradient when `save_input`
/// (the down-projection's input is the router's, which the router saves at activation width;
/// under FP8 Transformer Engine keeps its own quantised copy beside it).
fn latent_proj(
    name: &'static str,
    rows: u64,
    (i, o): (u64, u64),
    save_input: bool,
    d: &Dims,
) -> Op {
    let trainable = !d.lora;
    let mut op = Op::new(
        name,
        OpKind::Matmul {
            m: rows,
            n: o,
            k: i,
        },
    );
    op.params = Some(Params {
        total: i * o,
        rank: i * o,
        class: ParamClass::TpReplicated,
        trainable,
    });
    op.model_flops = Flops::matmul(2.0 * (d.tokens * i * o) as f64, trainable);
    op.rank_flops = Flops::matmul(2.0 * (rows * i * o) as f64, trainable);
    if save_input {
        op = op.save(TensorRole::Input, d.saved_input_bytes(rows, i, false));
    }
    op
}
