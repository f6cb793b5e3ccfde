//! LoRA adapters (Hu et al. 2021) on the routed experts' fc1 and fc2: one pair A [r, in],
//! B [out, r] per expert, as NeMo's LoRA puts a `ParallelLinearAdapter` with `is_expert` on
//! each expert's `linear_fc1`/`linear_fc2` (Megatron-Core's `SequentialMLP`). Under expert TP
//! they split as the dense adapters do (`lora_adapter`): fc1 (column-parallel) keeps A whole
//! and splits B's output rows, fc2 (row-parallel) splits A's input columns and keeps B whole.

use super::dims::Dims;
use super::linear::tp_comm;
use super::op::{CollectiveKind, Flops, Op, OpKind, ParamClass, Params, Phase, TensorRole};

/// The adapters of the rank's `local` experts (of `experts`, each token routed to `k`) beside
/// an expert projection of `i` x `o` run on `rows` rows (gathered over expert TP); `split_out`
/// for fc1.
pub fn expert_adapter(
    name: &'static str,
    (rows, i, o, split_out): (u64, u64, u64, bool),
    rank: u64,
    (experts, local, k): (u64, u64, u64),
    d: &Dims,
) -> Op {
    let per_expert = i * rank + rank * o;
    // (A's and B's elements of one expert on this rank)
    let (a, b) = if split_out {
        (i * rank, (rank * o).div_ceil(d.etp))
    } else {
        ((i * rank).div_ceil(d.etp), rank * o)
    };
    let mut op = Op::new(
        name,
        OpKind::Matmul {
            m: rows,
            n: rank,
            k: if split_out { i } else { i.div_ceil(d.etp) },
        },
    );
    op.params = Some(Params {
        total: experts * per_expert,
        rank: local * (a + b),
        class: ParamClass::Expert,
        trainable: true,
    });
    op.model_flops = Flops::matmul(2.0 * (d.tokens * k) as f64 * per_expert as f64, true);
    op.rank_flops = Flops::matmul(2.0 * rows as f64 * (a + b) as f64, true);
    // Every expert-TP rank sees all gathered rows, so the rank-r intermediate is whole there:
    // fc2's A x is a partial sum over expert TP (reduced in forward), fc1's gradient of it one
    // in backward.
    let r_bytes = rows * rank * d.act;
    if d.etp > 1 {
        let phase = if split_out {
            Phase::Backward
        } else {
            Phase::Forward
        };
        let mut c = tp_comm(d, CollectiveKind::AllReduce, phase, r_bytes);
        c.group_size = d.etp as u32;
        op = op.comm(c);
    }
    let out_cols = if split_out { o.div_ceil(d.etp) } else { o };
    op.temp(rows * out_cols * d.act)
        .save(TensorRole::LoraIntermediate, r_bytes)
}
