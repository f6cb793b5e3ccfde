//! The first stage's embedding and the last stage's final norm, output layer and
//! vocab-parallel cross-entropy (Megatron-LM), and DeepSeek-V3's multi-token-prediction extras.

use super::dims::Dims;
use super::linear::{tp_comm, Linear, Split};
use super::norm::{dropout, norm};
use super::op::{CollectiveKind, Op, OpKind, OpRole, ParamClass, Params, Phase, TensorRole};
use crate::config::{ModelConfig, PositionEmbedding};

/// Vocab-parallel word embedding (+ learned positions, + dropout). Each TP rank looks up its
/// vocabulary rows; the partial sums are all-reduced (reduce-scattered with SP).
pub fn embedding_block(ops: &mut Vec<Op>, m: &ModelConfig, d: &Dims) {
    let trainable = !d.lora;
    let partial = d.n * d.h * d.act;
    let mut word = Op::new("embedding.word", OpKind::MemoryBound { bytes: partial })
        .with_role(OpRole::WordEmbedding);
    word.params = Some(Params {
        total: d.v * d.h,
        rank: d.vocab_rank() * d.h,
        class: ParamClass::TpSharded,
        trainable,
    });
    word = if d.sp {
        word.comm(tp_comm(
            d,
            CollectiveKind::ReduceScatter,
            Phase::Forward,
            partial,
        ))
        .comm(tp_comm(
            d,
            CollectiveKind::AllGather,
            Phase::Backward,
            partial,
        ))
    } else {
        word.comm(tp_comm(
            d,
            CollectiveKind::AllReduce,
            Phase::Forward,
            partial,
        ))
    };
    ops.push(word.temp(partial));
    if m.position_embedding == PositionEmbedding::Learned {
        let mut pos = Op::new(
            "embedding.position",
            OpKind::MemoryBound {
                bytes: d.n_sp * d.h * d.act,
            },
        );
        pos.params = Some(Params {
            total: m.max_position_embeddings * d.h,
            rank: m.max_position_embeddings * d.h,
            class: ParamClass::TpReplicated,
            trainable,
        });
        ops.push(pos);
    }
    ops.push(dropout("embedding.dropout", d.n_sp, d.h, d.hidden_dropout));
}

/// Final norm, output layer and cross-entropy. `owns_weight`: the output layer has its own
/// parameters (untied, or tied with the embedding on another pipeline stage, where Megatron
/// keeps a copy whose gradient is all-reduced with the first stage's).
pub fn output_block(
    ops: &mut Vec<Op>,
    m: &ModelConfig,
    d: &Dims,
    owns_weight: bool,
    copy_of_tied: bool,
) {
    ops.push(norm("output.norm", m.normalization, d.h, d.n_sp, d).with_role(OpRole::FinalNorm));
    let trainable = !d.lora;
    let lin = Linear::sharded("output.layer", d.h, d.v, Split::Column, false, trainable);
    let mut op = lin.op(d);
    if !owns_weight {
        op.params = None;
    } else if copy_of_tied {
        if let Some(p) = op.params.as_mut() {
            p.total = 0;
        }
    }
    ops.push(op);
    // Vocab-parallel cross-entropy: logits come out of the matmul in the activation dtype,
    // are turned into fp32 softmax probabilities kept for backward, and three small fp32
    // all-reduces (max, sum of exponentials, target logit) run over TP. Backward turns the
    // probabilities into the logits' gradient in place (Megatron's
    // _VocabParallelCrossEntropy.backward; the executor's ce_grad), which the output layer's
    // backward reads.
    let v_r = d.vocab_rank();
    let logits = d.n * v_r * d.act;
    let probs = d.n * v_r * 4;
    let mut ce = Op::new(
        "output.cross_entropy",
        OpKind::MemoryBound {
            bytes: logits + 2 * probs,
        },
    )
    .save(TensorRole::Probabilities, probs)
    .temp(logits)
    .grad_in_place();
    let small = tp_comm(d, CollectiveKind::AllReduce, Phase::Forward, d.n * 4);
    ce = ce.comm(crate::model::op::Collective { count: 3, ..small });
    ops.push(ce);
}

/// The extra ops of one multi-token-prediction module (DeepSeek-V3, Sec. 2.2): two norms and
/// the 2h -> h projection before its transformer layer (the embedding and output head are
/// shared with the main model).
pub fn mtp_prelude(ops: &mut Vec<Op>, m: &ModelConfig, d: &Dims) {
    ops.push(norm("mtp.enorm", m.normalization, d.h, d.n_sp, d));
    ops.push(norm("mtp.hnorm", m.normalization, d.h, d.n_sp, d));
    let proj = Linear::sharded("mtp.eh_proj", 2 * d.h, d.h, Split::Column, false, !d.lora);
    ops.push(proj.op(d));
}

/// The last stage's copy of the embedding for its multi-token-prediction modules when the first
/// stage lies on another pipeline rank (Megatron-Core builds the embedding where `mtp_process`
/// and all-reduces its gradient over the embedding group): the word table (untied only: tied,
/// the output layer's copy is that table) and the learned position table. Copies: they count on
/// the rank, not in the model's total.
pub fn mtp_embedding_copy(ops: &mut Vec<Op>, m: &ModelConfig, d: &Dims) {
    let trainable = !d.lora;
    if !m.tied_embeddings {
        let mut word = Op::new("mtp.embedding_copy.word", OpKind::MemoryBound { bytes: 0 });
        word.params = Some(Params {
            total: 0,
            rank: d.vocab_rank() * d.h,
            class: ParamClass::TpSharded,
            trainable,
        });
        ops.push(word);
    }
    if m.position_embedding == PositionEmbedding::Learned {
        let mut pos = Op::new(
            "mtp.embedding_copy.position",
            OpKind::MemoryBound { bytes: 0 },
        );
        pos.params = Some(Params {
            total: 0,
            rank: m.max_position_embeddings * d.h,
            class: ParamClass::TpReplicated,
            trainable,
        });
        ops.push(pos);
    }
}
