//! The attention block: norm, QKV projection (MHA/GQA) or multi-head latent attention's
//! low-rank projections (DeepSeek-V2), rotary, the attention core with its context-parallel
//! exchange, the output projection and dropout.

use super::dims::Dims;
use super::linear::{lora_adapter, row_bias, tp_comm, Linear, SavedInput, Split};
use super::norm::{dropout, norm};
use super::op::{
    Collective, CollectiveKind, Flops, Op, OpKind, ParamClass, Params, Phase, RingCalls, TensorRole,
};
use crate::config::{
    AttentionSpan, CpComm, LoraTarget, MlaConfig, ModelConfig, PositionEmbedding, TrainingConfig,
};
use crate::layout::GroupKind;

fn targeted(tr: &TrainingConfig, d: &Dims, target: LoraTarget) -> Option<u64> {
    (d.lora && tr.lora.targets.contains(&target)).then_some(tr.lora.rank)
}

/// Appends a linear layer (and its LoRA adapter and row-parallel bias) to `ops`.
pub fn push_linear(
    ops: &mut Vec<Op>,
    lin: Linear,
    d: &Dims,
    lora: Option<u64>,
    bias_name: &'static str,
    lora_name: &'static str,
) {
    ops.push(lin.op(d));
    if lin.bias && lin.split == Split::Row {
        ops.push(row_bias(bias_name, lin.out_features, lin.trainable));
    }
    if let Some(r) = lora {
        ops.push(lora_adapter(lora_name, &lin, r, d));
    }
}

/// Appends the attention block's ops for a layer whose queries attend over `span`.
pub fn attention_block(
    ops: &mut Vec<Op>,
    m: &ModelConfig,
    tr: &TrainingConfig,
    d: &Dims,
    span: AttentionSpan,
) {
    let trainable = !d.lora;
    ops.push(norm("attn.norm", m.normalization, d.h, d.n_sp, d));
    let bias = m.add_bias_linear;
    // (heads on this rank, q/k head dim, v head dim, K/V heads on this rank)
    let (a_r, dqk, dv, g_r) = match &m.mla {
        None => {
            let qkv = Linear {
                input: SavedInput::NormFused,
                ..Linear::sharded(
                    "attn.qkv",
                    d.h,
                    (d.a + 2 * d.g) * d.d,
                    Split::Column,
                    bias || m.add_qkv_bias,
                    trainable,
                )
            };
            push_linear(
                ops,
                qkv,
                d,
                targeted(tr, d, LoraTarget::Qkv),
                "attn.qkv_bias",
                "attn.qkv_lora",
            );
            (d.a / d.t, d.d, d.d, d.g / d.t)
        }
        Some(mla) => mla_projections(ops, m, mla, d),
    };
    // MLA already normalises its query and KV latents (`attn.q_norm`, `attn.kv_norm`), which
    // is what Megatron's --qk-layernorm builds for it.
    if m.qk_layernorm && m.mla.is_none() {
        ops.push(qk_norm(d, a_r, g_r, dqk));
    }
    if m.position_embedding == PositionEmbedding::Rope {
        let rope_bytes = d.n * (a_r * dqk + g_r * dqk) * d.act;
        ops.push(Op::new(
            "attn.rotary",
            OpKind::MemoryBound {
                bytes: 2 * rope_bytes,
            },
        ));
    }
    ops.push(core_attention(d, a_r, g_r, dqk, dv, span));
    if m.attention_sinks {
        ops.push(sinks(d));
    }
    let proj = Linear {
        input: SavedInput::AttentionOutput,
        ..Linear::sharded("attn.proj", d.a * dv, d.h, Split::Row, bias, trainable)
    };
    push_linear(
        ops,
        proj,
        d,
        targeted(tr, d, LoraTarget::Proj),
        "attn.proj_bias",
        "attn.proj_lora",
    );
    ops.push(dropout("attn.dropout", d.n_sp, d.h, d.hidden_dropout));
}

/// MLA's projections (DeepSeek-V2): the query through an optional low-rank latent, keys and
/// values through a joint latent with a decoupled rotary key. Returns (heads on this rank, q/k
/// head dim, v head dim, K/V heads on this rank).
fn mla_projections(
    ops: &mut Vec<Op>,
    m: &ModelConfig,
    mla: &MlaConfig,
    d: &Dims,
) -> (u64, u64, u64, u64) {
    let trainable = !d.lora;
    // Simplification: the down projections are replicated over TP and run on the
    // gathered sequence; the latent gradients are all-reduced over TP in backward.
    let dqk = mla.qk_head_dim();
    let latent_q = mla.q_lora_rank;
    if latent_q > 0 {
        let down = Linear {
            communicate: false,
            ..Linear::sharded(
                "attn.q_down",
                d.h,
                latent_q,
                Split::Replicated,
                false,
                trainable,
            )
        };
        ops.push(down.op(d).comm(tp_comm(
            d,
            CollectiveKind::AllReduce,
            Phase::Backward,
            d.n * latent_q * d.act,
        )));
        ops.push(norm("attn.q_norm", m.normalization, latent_q, d.n, d));
        let up = Linear {
            communicate: false,
            sp_gathered_input: false,
            ..Linear::sharded(
                "attn.q_up",
                latent_q,
                d.a * dqk,
                Split::Column,
                false,
                trainable,
            )
        };
        ops.push(up.op(d));
    } else {
        let q = Linear {
            communicate: false,
            ..Linear::sharded("attn.q", d.h, d.a * dqk, Split::Column, false, trainable)
        };
        ops.push(q.op(d));
    }
    // Its input is the query down projection's; a recipe's TELinear keeps its own quantised
    // copy of it.
    let kv_down = Linear {
        save_input: d.quantized.is_some(),
        communicate: false,
        ..Linear::sharded(
            "attn.kv_down",
            d.h,
            mla.kv_lora_rank + mla.qk_rope_head_dim,
            Split::Replicated,
            false,
            trainable,
        )
    };
    let kv_grad = d.n * mla.kv_lora_rank * d.act;
    let mut kv_down_op = kv_down.op(d).comm(tp_comm(
        d,
        CollectiveKind::AllReduce,
        Phase::Backward,
        kv_grad,
    ));
    // With SP the block input is gathered once for both down projections (forward, and
    // again in backward for their weight gradients).
    if d.sp && d.t > 1 {
        let full_in = d.n * d.h * d.act;
        kv_down_op = kv_down_op
            .comm(tp_comm(
                d,
                CollectiveKind::AllGather,
                Phase::Forward,
                full_in,
            ))
            .comm(tp_comm(
                d,
                CollectiveKind::AllGather,
                Phase::Backward,
                full_in,
            ));
    }
    ops.push(kv_down_op);
    ops.push(norm(
        "attn.kv_norm",
        m.normalization,
        mla.kv_lora_rank,
        d.n,
        d,
    ));
    let kv_up = Linear {
        communicate: false,
        sp_gathered_input: false,
        ..Linear::sharded(
            "attn.kv_up",
            mla.kv_lora_rank,
            d.a * (mla.qk_nope_head_dim + mla.v_head_dim),
            Split::Column,
            false,
            trainable,
        )
    };
    ops.push(kv_up.op(d));
    (d.a / d.t, dqk, mla.v_head_dim, d.a / d.t)
}

/// QK norm (Qwen3): an RMSNorm over each of this rank's query and key heads, `head_dim`
/// weights for the queries and as many for the keys (TP-replicated, as the norms), saving
/// its input.
fn qk_norm(d: &Dims, a_r: u64, g_r: u64, dqk: u64) -> Op {
    let bytes = d.n * (a_r + g_r) * dqk * d.act;
    let mut op = Op::new("attn.qk_norm", OpKind::MemoryBound { bytes: 2 * bytes });
    op.params = Some(Params {
        total: 2 * dqk,
        rank: 2 * dqk,
        class: ParamClass::TpReplicated,
        trainable: !d.lora,
    });
    op.save(TensorRole::Input, bytes)
}

/// Learned attention sinks (GPT-OSS): one logit per head, split over TP with the heads.
fn sinks(d: &Dims) -> Op {
    let mut op = Op::new("attn.sinks", OpKind::MemoryBound { bytes: 0 });
    op.params = Some(Params {
        total: d.a,
        rank: d.a.div_ceil(d.t),
        class: ParamClass::TpSharded,
        trainable: !d.lora,
    });
    op
}

/// The query-key pairs a span leaves, over s^2: (under the causal mask, counting every
/// unmasked pair of the span's blocks as the `full` FLOPs convention does). A window of w
/// keys leaves w s - w^2 / 2 causal pairs (s^2 / 2 at w = s, as the full causal count); k
/// chunks of c tokens (and a last one of r) leave k c^2 / 2 + r^2 / 2.
pub fn span_pair_fractions(s: u64, span: AttentionSpan) -> (f64, f64) {
    let sf = s.max(1) as f64;
    match span {
        AttentionSpan::Full => (0.5, 1.0),
        AttentionSpan::Window(w) => {
            let w = w.min(s) as f64;
            ((w * sf - w * w / 2.0) / (sf * sf), w / sf)
        }
        AttentionSpan::Chunk(c) => {
            let c = c.clamp(1, s.max(1));
            let (k, r) = ((s / c) as f64, (s % c) as f64);
            let c = c as f64;
            let dense = (k * c * c + r * r) / (sf * sf);
            (dense / 2.0, dense)
        }
    }
}

/// How far back a query of this span reaches beyond its own position: w - 1 keys for a
/// window, at most c - 1 for a chunk; `None` for full attention.
fn span_reach(span: AttentionSpan) -> Option<u64> {
    match span {
        AttentionSpan::Full => None,
        AttentionSpan::Window(w) | AttentionSpan::Chunk(w) => Some(w.saturating_sub(1)),
    }
}

/// The CP exchange a window or chunk leaves: each of the rank's sequence pieces (two under
/// zigzag's load balancing, else one of s/cp) needs the keys and values of the `reach` tokens
/// before it, which the neighbouring pieces hold, hop by hop. `None` when that is no less
/// than the ring moves (cp - 1 shards of s/cp tokens). Returns (bytes of K/V received, hops).
fn window_exchange(d: &Dims, span: AttentionSpan, kv_per_token: u64) -> Option<(u64, u32)> {
    let reach = span_reach(span)?;
    let pieces = if d.cp_comm == CpComm::Zigzag { 2 } else { 1 };
    let piece = (d.s / (d.c * pieces)).max(1);
    if pieces * reach >= (d.c - 1) * (d.s / d.c) {
        return None;
    }
    let hops = reach.div_ceil(piece).clamp(1, d.c - 1);
    Some((pieces * reach * kv_per_token, hops as u32))
}

/// The attention core on this rank: a_r query heads and g_r K/V heads of this TP rank, over
/// the local sequence shard, with the context-parallel exchange of K/V. A window or chunk
/// (`span`) cuts the pairs computed and, under CP, the K/V exchanged to the neighbours'.
fn core_attention(d: &Dims, a_r: u64, g_r: u64, dqk: u64, dv: u64, span: AttentionSpan) -> Op {
    let (s, b) = (d.s as f64, d.b as f64);
    let a = d.a as f64;
    // QK^T and softmax(.)V over all s x s pairs, 2 FLOPs per multiply-add.
    let full = 2.0 * b * s * s * a * (dqk + dv) as f64;
    let spanned = span != AttentionSpan::Full;
    // The K/V this rank's g_r heads hold per sequence position (all microbatch rows).
    let kv_per_token = d.b * g_r * (dqk + dv) * d.act;
    let windowed = if spanned && d.c > 1 && d.cp_comm != CpComm::A2a {
        window_exchange(d, span, kv_per_token)
    } else {
        None
    };
    // One kernel call: the whole local sequence under the causal mask, except that a ring
    // (p2p, zigzag) runs cp calls over s/cp-long blocks, all but the diagonal one unmasked;
    // Ulysses (a2a) attends over the full sequence with heads split. A windowed exchange runs
    // the local queries against their neighbours' keys under the window's mask.
    let (seq_len, causal) = match d.cp_comm {
        _ if d.c == 1 => (d.s, true),
        _ if windowed.is_some() => (d.s / d.c, true),
        CpComm::P2p | CpComm::Zigzag => (d.s / d.c, false),
        CpComm::Allgather => (d.s / d.c, true),
        CpComm::A2a => (d.s, true),
    };
    // The pairs counted (model FLOPs) and computed (a flash kernel skips masked blocks; an
    // unfused one computes every s x s score and masks them).
    let (model_fraction, hw_fraction) = if spanned {
        let (causal_pairs, dense_pairs) = span_pair_fractions(d.s, span);
        let model = if d.attn_model_fraction < 1.0 {
            causal_pairs
        } else {
            dense_pairs
        };
        (model, if d.flash { causal_pairs } else { 1.0 })
    } else {
        (d.attn_model_fraction, d.attn_hw_fraction)
    };
    let ring = (d.c > 1 && windowed.is_none())
        .then_some(d.cp_comm)
        .and_then(|m| match m {
            CpComm::P2p => Some(false),
            CpComm::Zigzag => Some(true),
            _ => None,
        })
        .map(|zigzag| RingCalls {
            blocks: d.c as u32,
            zigzag,
        });
    let mut op = Op::new(
        "attn.core",
        OpKind::Attention {
            seq_len,
            causal,
            fused: d.flash,
            head_dim: dqk.max(dv),
            ring,
            window: match span {
                AttentionSpan::Window(w) if d.flash => Some(w.min(d.s)),
                _ => None,
            },
        },
    );
    op.recomputed_by_selective = true;
    op.model_flops = Flops {
        fwd: full * model_fraction,
        dgrad: 2.0 * full * model_fraction,
        wgrad: 0.0,
    };
    // A contiguous ring under a causal mask loads the last CP rank most: rank r computes
    // r + 1/2 of its blocks' c^2 pairs, so the hottest does (2cp - 1)/cp of the average
    // (zigzag, all-gather and Ulysses balance it; so does a window, each query seeing at
    // most w keys wherever it sits).
    let hottest = if d.c > 1 && d.cp_comm == CpComm::P2p && !spanned {
        (2 * d.c - 1) as f64 / d.c as f64
    } else {
        1.0
    };
    let per_rank = full * hw_fraction / (d.t * d.c) as f64 * hottest;
    op.rank_flops = Flops {
        fwd: per_rank,
        dgrad: 2.0 * per_rank,
        wgrad: 0.0,
    };
    let q = d.n * a_r * dqk * d.act;
    let k = d.n * g_r * dqk * d.act;
    let v = d.n * g_r * dv * d.act;
    if d.flash {
        // FlashAttention keeps Q, K, V and the fp32 log-sum-exp of each query row; the output
        // is the projection's saved input.
        let lse = d.b * a_r * (d.s / d.c) * 4;
        op = op
            .save(TensorRole::Query, q)
            .save(TensorRole::Key, k)
            .save(TensorRole::Value, v)
            .save_selective(TensorRole::SoftmaxLse, lse);
    } else {
        // Korthikanti et al. 2022: Q and K for QK^T, the softmax output, the dropout mask and
        // output, and V; s x s tensors per head of this rank.
        let scores = d.b * a_r * d.s * d.s;
        op = op
            .save(TensorRole::Query, q)
            .save(TensorRole::Key, k)
            .save(TensorRole::Value, v)
            .save_selective(TensorRole::Softmax, scores * d.act);
        if d.attention_dropout {
            op = op
                .save_selective(TensorRole::DropoutMask, scores)
                .save_selective(TensorRole::DropoutOut, scores * d.act);
        }
    }
    // A kernel that materialises scores holds the profile's count of (s/cp)^2 fp32 tiles in
    // backward (probabilities and their gradient), beside dQ, dK, dV and the held
    // activations. Its forward tile lives only inside the call, before the layer's later
    // activations exist, so without CP it never adds to the peak.
    let tile = (d.s / d.c) * (d.s / d.c) * 4;
    op.backward_scratch_bytes = d.attention_score_tiles * tile;
    // The output gradient dO (the projection's input gradient) is held through the core's
    // backward.
    op.grad_out_bytes = d.n * a_r * dv * d.act;
    if d.c > 1 {
        let o = d.n * a_r * dv * d.act;
        op = match windowed {
            Some((needed, hops)) => windowed_exchange(op, d, a_r, needed, hops, tile),
            None => cp_exchange(op, d, a_r, q, k + v, o, tile),
        };
    }
    op
}

/// The buffers every CP exchange of a flash core holds: the online softmax's running maximum
/// and sum (fp32, per query row and head), the forward's score tile, and the backward scratch
/// with FlashAttention-2's D = rowsum(dO * O): (stats, forward tile, backward scratch) bytes.
fn flash_cp_buffers(op: &Op, d: &Dims, a_r: u64, tile: u64) -> (u64, u64, u64) {
    let stats = 2 * d.b * a_r * (d.s / d.c) * 4;
    let delta = d.n * a_r * 4;
    let fwd_tile = d.attention_score_tiles.min(1) * tile;
    (stats, fwd_tile, op.backward_scratch_bytes + delta)
}

/// The context-parallel exchange of a windowed attention core (`d.c > 1`): only the
/// neighbours' K/V within the window travel (`needed` bytes in `hops` messages): forward, and
/// in backward the K/V again and their dK/dV back, as the ring does.
fn windowed_exchange(op: Op, d: &Dims, a_r: u64, needed: u64, hops: u32, tile: u64) -> Op {
    let (stats, fwd_tile, scratch) = flash_cp_buffers(&op, d, a_r, tile);
    let per_hop = needed.div_ceil(hops as u64);
    let send = |phase| Collective {
        kind: CollectiveKind::SendRecv,
        group: GroupKind::Cp,
        group_size: d.c as u32,
        phase,
        payload_bytes: per_hop,
        count: hops,
    };
    let op = op
        .comm(send(Phase::Forward))
        .comm(send(Phase::Backward))
        .comm(send(Phase::Backward))
        .temp(needed + fwd_tile + stats);
    Op {
        backward_scratch_bytes: scratch + 2 * needed,
        ..op
    }
}

/// The context-parallel exchange of the attention core (`d.c > 1`): its collectives over the
/// CP group and the buffers they hold, given the rank's Q, K+V and output bytes and the
/// score tile.
fn cp_exchange(op: Op, d: &Dims, a_r: u64, q: u64, kv: u64, o: u64, tile: u64) -> Op {
    let (stats, fwd_tile, scratch) = flash_cp_buffers(&op, d, a_r, tile);
    let cp = |kind, phase, bytes, count| Collective {
        kind,
        group: GroupKind::Cp,
        group_size: d.c as u32,
        phase,
        payload_bytes: bytes,
        count,
    };
    let steps = (d.c - 1) as u32;
    match d.cp_comm {
        // Ring attention: K/V blocks travel cp-1 hops forward; K/V and dK/dV backward.
        // Double-buffered: forward holds the visiting block and the next (one block at
        // cp 2); backward the visiting K/V and its dK/dV accumulator, and the next of each
        // (cp > 2).
        CpComm::P2p | CpComm::Zigzag => {
            let op = op
                .comm(cp(CollectiveKind::SendRecv, Phase::Forward, kv, steps))
                .comm(cp(CollectiveKind::SendRecv, Phase::Backward, kv, steps))
                .comm(cp(CollectiveKind::SendRecv, Phase::Backward, kv, steps))
                .temp(d.c.min(3).saturating_sub(1) * kv + fwd_tile + stats);
            Op {
                backward_scratch_bytes: scratch + (2 * (d.c - 1)).min(4) * kv,
                ..op
            }
        }
        // All-gather K/V forward (only the local shard is saved), again in backward beside
        // the whole-sequence dK/dV that is then reduce-scattered (the local dK/dV exist
        // only after the gathered K/V are freed, hence one kv less than the proxy).
        CpComm::Allgather => {
            let op = op
                .comm(cp(CollectiveKind::AllGather, Phase::Forward, d.c * kv, 1))
                .comm(cp(CollectiveKind::AllGather, Phase::Backward, d.c * kv, 1))
                .comm(cp(
                    CollectiveKind::ReduceScatter,
                    Phase::Backward,
                    d.c * kv,
                    1,
                ))
                .temp(d.c * kv + fwd_tile + stats);
            Op {
                backward_scratch_bytes: scratch + (2 * d.c - 1) * kv,
                ..op
            }
        }
        // Ulysses: all-to-all Q/K/V to head shards and the output back; reversed backward.
        // Forward holds a send and a receive buffer of Q/K/V at once; backward trades dO
        // for its head shards, then holds dQ/dK/dV in both layouts while they travel.
        CpComm::A2a => {
            let op = op
                .comm(cp(CollectiveKind::AllToAll, Phase::Forward, q + kv, 1))
                .comm(cp(CollectiveKind::AllToAll, Phase::Forward, o, 1))
                .comm(cp(CollectiveKind::AllToAll, Phase::Backward, q + kv, 1))
                .comm(cp(CollectiveKind::AllToAll, Phase::Backward, o, 1))
                .temp(q + kv);
            Op {
                backward_scratch_bytes: scratch.max((q + kv).saturating_sub(o)),
                ..op
            }
        }
    }
}
