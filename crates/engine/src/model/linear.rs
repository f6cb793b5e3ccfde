//! Linear layers as Megatron-LM shards them (Shoeybi et al. 2019): column-parallel (output
//! features split over TP), row-parallel (input features split), or replicated; with sequence
//! parallelism (Korthikanti et al. 2022) the column-parallel input is all-gathered forward and
//! re-gathered in backward (only the sequence shard is saved), and the row-parallel output
//! reduce-scattered; without SP the input gradient (column) and output (row) are all-reduced.

use super::dims::Dims;
use super::op::{
    Collective, CollectiveKind, Flops, Op, OpKind, OpRole, ParamClass, Params, Phase, TensorRole,
};
use crate::layout::GroupKind;

/// How a linear layer's weight is split over TP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Column,
    Row,
    Replicated,
}

/// What a linear layer keeps of its input under a low-precision recipe, by the Transformer
/// Engine module Megatron-Core's layer spec builds it with (megatron/core/models/gpt/
/// gpt_layer_specs.py); without a recipe every kind keeps the input at the activation dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedInput {
    /// TELinear, TEColumnParallelLinear, TERowParallelLinear, TEGroupedLinear: the quantised
    /// copy ([`Dims::saved_input_bytes`]).
    Quantized,
    /// TELayerNormColumnParallelLinear (the QKV projection, a dense MLP's fc1): the norm
    /// kernel's quantised output, both usages of it under NVFP4 where backward re-gathers it.
    NormFused,
    /// The attention output projection: the fused attention's output, saved by the attention
    /// kernel in bf16 and shared with the projection when Megatron-Core sets
    /// `save_original_input`, else the projection's quantised copy beside it.
    AttentionOutput,
}

/// A linear layer `in_features -> out_features` (unsharded sizes).
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub name: &'static str,
    pub in_features: u64,
    pub out_features: u64,
    pub split: Split,
    /// Column-parallel bias (sharded) or, for row-parallel, see [`row_bias`].
    pub bias: bool,
    pub trainable: bool,
    /// Saves its input for the weight gradient (false when another op already saves the same tensor).
    pub save_input: bool,
    /// Issues the TP collectives of its input/output (false for a second projection that
    /// shares an already-gathered input).
    pub communicate: bool,
    /// Its input is the all-gathered sequence-parallel activation, so with SP only the
    /// sequence shard is saved (false for inputs that are already whole on every TP rank).
    pub sp_gathered_input: bool,
    /// What it keeps of its input under a low-precision recipe.
    pub input: SavedInput,
}

/// A TP collective on the `t` ranks of the tensor-parallel group.
pub fn tp_comm(d: &Dims, kind: CollectiveKind, phase: Phase, bytes: u64) -> Collective {
    Collective {
        kind,
        group: GroupKind::Tp,
        group_size: d.t as u32,
        phase,
        payload_bytes: bytes,
        count: 1,
    }
}

impl Linear {
    /// A tensor-parallel projection that saves its input, issues its own TP collectives and
    /// reads the gathered sequence-parallel activation: Megatron's ColumnParallelLinear /
    /// RowParallelLinear as most layers use them.
    pub fn sharded(
        name: &'static str,
        in_features: u64,
        out_features: u64,
        split: Split,
        bias: bool,
        trainable: bool,
    ) -> Linear {
        Linear {
            name,
            in_features,
            out_features,
            split,
            bias,
            trainable,
            save_input: true,
            communicate: true,
            sp_gathered_input: true,
            input: SavedInput::Quantized,
        }
    }

    /// Bytes the layer keeps of its input, `rows` tokens of its `cols` input features on this
    /// rank, for its weight gradient.
    fn saved_input_bytes(&self, d: &Dims, rows: u64, cols: u64) -> u64 {
        let whole = rows * cols * d.act;
        match (self.input, &d.quantized) {
            (_, None) => whole,
            (SavedInput::Quantized, Some(_)) => d.saved_input_bytes(rows, cols, false),
            (SavedInput::NormFused, Some(_)) => {
                let regathered = self.split == Split::Column && d.sp && d.t > 1;
                d.saved_input_bytes(rows, cols, regathered && self.sp_gathered_input)
            }
            (SavedInput::AttentionOutput, Some(_)) if d.proj_input_original => whole,
            // Delayed scaling: the projection's 1-byte copy. The fused attention's bf16 output
            // is alive beside it too, and not counted yet (docs/engine.md).
            (SavedInput::AttentionOutput, Some(q)) => q.saved_input_bytes(rows, cols, false),
        }
    }

    /// The op for this layer on one rank, over the n tokens of this CP rank.
    pub fn op(&self, d: &Dims) -> Op {
        let (i, o, t) = (self.in_features, self.out_features, d.t);
        let (rank_in, rank_out, class) = match self.split {
            Split::Column => (i, o.div_ceil(t), ParamClass::TpSharded),
            Split::Row => (i.div_ceil(t), o, ParamClass::TpSharded),
            Split::Replicated => (i, o, ParamClass::TpReplicated),
        };
        let bias_total = if self.bias && self.split == Split::Column {
            o
        } else {
            0
        };
        let bias_rank = if self.bias && self.split == Split::Column {
            rank_out
        } else {
            0
        };
        let mut op = Op::new(
            self.name,
            OpKind::Matmul {
                m: d.n,
                n: rank_out,
                k: rank_in,
            },
        );
        op.params = Some(Params {
            total: i * o + bias_total,
            rank: rank_in * rank_out + bias_rank,
            class,
            trainable: self.trainable,
        });
        if self.input == SavedInput::NormFused {
            op.role = OpRole::NormFusedLinear;
        }
        op.model_flops = Flops::matmul(2.0 * d.tokens as f64 * i as f64 * o as f64, self.trainable);
        op.rank_flops = Flops::matmul(
            2.0 * d.n as f64 * rank_in as f64 * rank_out as f64,
            self.trainable,
        );
        if self.save_input {
            let rows = match self.split {
                Split::Column | Split::Replicated if d.sp && self.sp_gathered_input => d.n_sp,
                _ => d.n,
            };
            op = op.save(TensorRole::Input, self.saved_input_bytes(d, rows, rank_in));
        }
        if self.communicate && t > 1 {
            let full_in = d.n * i * d.act;
            let full_out = d.n * o * d.act;
            op = match (self.split, d.sp) {
                (Split::Column, true) => op
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
                    ))
                    .comm(tp_comm(
                        d,
                        CollectiveKind::ReduceScatter,
                        Phase::Backward,
                        full_in,
                    )),
                (Split::Column, false) => op.comm(tp_comm(
                    d,
                    CollectiveKind::AllReduce,
                    Phase::Backward,
                    full_in,
                )),
                // The unreduced output (n x h) exists before the reduce-scatter shrinks it to
                // the sequence shard: a transient t times the output.
                (Split::Row, true) => op
                    .temp(full_out)
                    .comm(tp_comm(
                        d,
                        CollectiveKind::ReduceScatter,
                        Phase::Forward,
                        full_out,
                    ))
                    .comm(tp_comm(
                        d,
                        CollectiveKind::AllGather,
                        Phase::Backward,
                        full_out,
                    )),
                (Split::Row, false) => op.comm(tp_comm(
                    d,
                    CollectiveKind::AllReduce,
                    Phase::Forward,
                    full_out,
                )),
                (Split::Replicated, _) => op,
            };
        }
        op
    }
}

/// A row-parallel layer's bias: added after the reduction, so replicated on every TP rank.
pub fn row_bias(name: &'static str, features: u64, trainable: bool) -> Op {
    let mut op = Op::new(name, OpKind::MemoryBound { bytes: 0 });
    op.params = Some(Params {
        total: features,
        rank: features,
        class: ParamClass::TpReplicated,
        trainable,
    });
    op
}

/// A LoRA adapter (Hu et al. 2021) beside a frozen linear: A (r x in) and B (out x r), split
/// over TP with the base layer as Hugging Face PEFT's `LoraParallelLinear` splits it for
/// Megatron layers: a column-parallel layer's A is
/// replicated and its B split by output rows, a row-parallel layer's A split by input columns
/// and its B replicated. Saves the rank-r intermediate (alpha/r) A x on the sequence-parallel
/// region, and holds the adapter's output (B's half of the layer output) as a forward
/// transient before it is added to the base output.
pub fn lora_adapter(name: &'static str, base: &Linear, rank: u64, d: &Dims) -> Op {
    let (i, o) = (base.in_features, base.out_features);
    let total = i * rank + rank * o;
    // (A's elements and the tokens it sees, B's and its tokens) on this rank: the replicated
    // factor works on the sequence-parallel region (n_sp tokens), the split one on all n.
    let ((a, a_rows), (b, b_rows)) = match base.split {
        Split::Column => ((i * rank, d.n_sp), ((rank * o).div_ceil(d.t), d.n)),
        Split::Row => (((i * rank).div_ceil(d.t), d.n), (rank * o, d.n_sp)),
        Split::Replicated => ((i * rank, d.n), (rank * o, d.n)),
    };
    let per_rank = a + b;
    let (out_rows, out_cols) = (b_rows, b / rank.max(1));
    let mut op = Op::new(
        name,
        OpKind::Matmul {
            m: d.n,
            n: rank,
            k: i,
        },
    );
    op.params = Some(Params {
        total,
        rank: per_rank,
        class: ParamClass::TpSharded,
        trainable: true,
    });
    op.model_flops = Flops::matmul(2.0 * d.tokens as f64 * total as f64, true);
    op.rank_flops = Flops::matmul(2.0 * (a_rows * a + b_rows * b) as f64, true);
    op.lora_replicated_params = match base.split {
        Split::Column => i * rank,
        Split::Row => rank * o,
        Split::Replicated => 0,
    };
    op.temp(out_rows * out_cols * d.act)
        .save(TensorRole::LoraIntermediate, d.n_sp * rank * d.act)
}
