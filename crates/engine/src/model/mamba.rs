//! The Mamba-2 mixer of a hybrid layer (Dao and Gu 2024, "Transformers are SSMs: Generalized
//! Models and Efficient Algorithms Through Structured State Space Duality", sec. 6-7;
//! Megatron-Core's MambaMixer): the pre-norm, an input projection to z, x, B, C and dt
//! (column-parallel: TP splits the heads and the B/C groups), a causal depthwise convolution
//! over x, B and C, the SSD chunked scan, a gated RMSNorm over the inner width and the output
//! projection (row-parallel).

use super::attention::push_linear;
use super::dims::Dims;
use super::linear::{Linear, Split};
use super::norm::{dropout, norm};
use super::op::{Flops, Op, OpKind, ParamClass, Params, TensorRole};
use crate::config::{MambaConfig, ModelConfig};

/// The SSD's FLOPs for `tokens` tokens over `heads` heads of `p` channels and `groups` B/C
/// groups of state `n`, in chunks of `q` (Dao and Gu 2024, sec. 6, the four steps of the
/// chunked algorithm, 2 FLOPs a multiply-add): C B^T inside each chunk, tokens x q x n per
/// group; its masked product with X, tokens x q x p per head; the chunk states B^T X and the
/// outputs C h from them, tokens x n x p each per head (the state passing between chunks,
/// tokens / q x n x p per head, is the memory-bound scan).
pub fn ssd_flops(tokens: u64, heads: u64, p: u64, groups: u64, n: u64, q: u64) -> f64 {
    let t = tokens as f64;
    let (heads, p, groups, n, q) = (heads as f64, p as f64, groups as f64, n as f64, q as f64);
    2.0 * t * (groups * q * n + heads * (q * p + 2.0 * n * p))
}

/// Appends a Mamba-2 layer: its norm, mixer and the dropout after it.
pub fn mamba_layer(ops: &mut Vec<Op>, m: &ModelConfig, mc: &MambaConfig, d: &Dims) {
    let trainable = !d.lora;
    let (heads, groups) = (mc.num_heads as u64, mc.num_groups as u64);
    let (p, n, q) = (mc.head_dim, mc.state_dim, mc.chunk_size.max(1));
    let inner = mc.inner();
    let conv = mc.conv_channels();
    // This TP rank's share: heads and groups split evenly (the rules ask it).
    let (heads_r, groups_r) = (heads.div_ceil(d.t), groups.div_ceil(d.t));
    let inner_r = heads_r * p;
    let conv_r = inner_r + 2 * groups_r * n;
    ops.push(norm("mamba.norm", m.normalization, d.h, d.n_sp, d));
    let in_proj = Linear::sharded(
        "mamba.in_proj",
        d.h,
        2 * inner + 2 * groups * n + heads,
        Split::Column,
        m.add_bias_linear,
        trainable,
    );
    push_linear(ops, in_proj, d, None, "", "");

    // The causal depthwise convolution (and SiLU) over x, B, C: conv_kernel weights and a bias
    // a channel, split with the channels; it saves its input.
    let conv_in = d.n * conv_r * d.act;
    let mut conv_op = Op::new("mamba.conv1d", OpKind::MemoryBound { bytes: 2 * conv_in })
        .save(TensorRole::Input, conv_in);
    conv_op.params = Some(Params {
        total: conv * (mc.conv_kernel + 1),
        rank: conv_r * (mc.conv_kernel + 1),
        class: ParamClass::TpSharded,
        trainable,
    });
    let conv_flops = 2.0 * (d.n * conv_r * mc.conv_kernel) as f64;
    conv_op.rank_flops = Flops {
        fwd: conv_flops,
        dgrad: conv_flops,
        wgrad: conv_flops,
    };
    conv_op.model_flops = conv_op.rank_flops.scaled((d.t * d.c) as f64);
    ops.push(conv_op);

    // The SSD chunked scan as its GEMMs (batched over chunks of q): the ledger times them as
    // one [tokens x q] . [q x k] product whose 2 m n k equals the scan's FLOPs.
    let rank_flops = ssd_flops(d.n, heads_r, p, groups_r, n, q);
    let model_flops = ssd_flops(d.tokens, heads, p, groups, n, q);
    let k = (groups_r * n + heads_r * p + (2 * heads_r * n * p).div_ceil(q)).max(1);
    let mut ssd = Op::new("mamba.ssd", OpKind::Matmul { m: d.n, n: q, k });
    // Backward: the input gradients of the four products, twice the forward; the scan has no
    // weights of its own (A, D and dt's bias below are element-wise).
    ssd.rank_flops = Flops {
        fwd: rank_flops,
        dgrad: 2.0 * rank_flops,
        wgrad: 0.0,
    };
    ssd.model_flops = Flops {
        fwd: model_flops,
        dgrad: 2.0 * model_flops,
        wgrad: 0.0,
    };
    ssd.params = Some(Params {
        // A_log, D and dt's bias: one each a head.
        total: 3 * heads,
        rank: 3 * heads_r,
        class: ParamClass::TpSharded,
        trainable,
    });
    // mamba_ssm's combined kernel saves x, B, C, dt and its cumulative decay (fp32) and its
    // output; the chunk states (fp32, tokens / q x heads x p x n) exist between its kernels
    // and are recomputed in backward.
    let chunks = d.n.div_ceil(q);
    let states = chunks * heads_r * p * n * 4;
    ssd = ssd
        .save(TensorRole::Input, conv_in)
        .save(TensorRole::Input, 2 * d.n * heads_r * 4)
        .save(TensorRole::Input, d.n * inner_r * d.act)
        .temp(states);
    ssd.backward_scratch_bytes = states;
    ops.push(ssd);
    // The state passing between chunks and the element-wise work (decays, dt's softplus, the
    // skip D x): memory-bound, the states read and written once each, x and y once.
    ops.push(Op::new(
        "mamba.scan",
        OpKind::MemoryBound {
            bytes: 2 * states + 2 * d.n * inner_r * d.act,
        },
    ));

    // The gated RMSNorm, norm(y) x SiLU(z), grouped over the TP shards: its weight is split
    // with the inner width; it saves z (its y is the scan's output, saved above: one tensor
    // that both keep).
    let y = d.n * inner_r * d.act;
    let mut gated = Op::new("mamba.gated_norm", OpKind::MemoryBound { bytes: 3 * y })
        .save(TensorRole::Input, y);
    gated.params = Some(Params {
        total: inner,
        rank: inner_r,
        class: ParamClass::TpSharded,
        trainable,
    });
    ops.push(gated);
    let out_proj = Linear::sharded(
        "mamba.out_proj",
        inner,
        d.h,
        Split::Row,
        m.add_bias_linear,
        trainable,
    );
    push_linear(ops, out_proj, d, None, "mamba.out_proj_bias", "");
    ops.push(dropout("mamba.dropout", d.n_sp, d.h, d.hidden_dropout));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssd_flops_are_the_four_products_of_the_chunked_algorithm() {
        // One group, one head, p = n = q = 2, four tokens: C B^T 4 x 2 x 2, its product
        // with X 4 x 2 x 2, B^T X and C h 4 x 2 x 2 each: 4 x 16 = 64 multiply-adds, 128
        // FLOPs.
        assert_eq!(ssd_flops(4, 1, 2, 1, 2, 2), 128.0);
        // Linear in the tokens (a scan, not attention's square).
        assert_eq!(
            ssd_flops(8, 1, 2, 1, 2, 2),
            2.0 * ssd_flops(4, 1, 2, 1, 2, 2)
        );
    }
}
