//! Learned absolute position embeddings (GPT-2/3; Megatron's `--position-embedding-type
//! learned_absolute`): a [rows, h] table replicated over TP, row p added to the word embedding
//! of every token at sequence position p. With CP each rank looks up its own rows' positions
//! (zigzag included), so the sum is the single-rank run's. A multi-token-prediction depth k
//! embeds the tokens k ahead with the positions k ahead: Megatron-Core rolls the position ids
//! with the input ids (`roll_tensor`, shifts -1 per depth), the last k positions of each
//! sequence rolling in as 0.

use super::blocks::{seg, BlockLayout, Builder};
use super::ctx::Ctx;
use crate::backend::ops::*;
use crate::backend::{Backend, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;

/// Appends the position table to the embedding block (nothing with rotary positions). Every
/// TP rank computes its full gradient (from the expanded output gradient), so it is not
/// summed over TP.
pub(super) fn push_table(b: &mut Builder, rows: usize, h: usize, std: f32) {
    if rows == 0 {
        return;
    }
    let s = seg("embedding.position.weight".into(), h, 0..rows, 0..h, std);
    b.push(rows, h, vec![s], false);
}

/// Position ids of the microbatch's rows on this rank (batch-major, before SP), `shift`
/// ahead: p + shift, or 0 past the sequence (Megatron's roll).
fn row_positions<B: Backend>(ctx: &Ctx<B>, shift: usize) -> Vec<u32> {
    let (b, seq) = (ctx.plan.model.micro_batch, ctx.plan.model.seq);
    let ahead = |p: u32| rolled(p as usize, shift, seq) as u32;
    (0..b)
        .flat_map(|_| ctx.positions.iter().map(move |&p| ahead(p)))
        .collect()
}

/// Position `p` rolled `shift` ahead within a sequence of `seq`: p + shift, 0 past the end.
pub fn rolled(p: usize, shift: usize, seq: usize) -> usize {
    if p + shift < seq {
        p + shift
    } else {
        0
    }
}

/// Adds the position rows (`shift` ahead) to the word embedding's TP partial sum [n, h] on TP
/// rank 0 only, so the TP reduction adds them once.
pub fn add_rows<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    partial: &mut B::Tensor,
    shift: usize,
) -> Result<(), ExecError> {
    if ctx.plan.model.learned_positions == 0 || ctx.rd.tp_rank != 0 {
        return Ok(());
    }
    let mut rows = ctx.zeros(Category::Buffers, &[ctx.n, ctx.rd.h])?;
    let table = p.sub(l.tensors[1].range());
    ctx.ops
        .embedding_gather(table, &row_positions(ctx, shift), 0, &mut rows)?;
    ctx.ops.axpy(1.0, View::all(&rows), ViewMut::all(partial))
}

/// grad[position of row r, `shift` ahead] += dy[r] for the full (expanded) output gradient
/// `dy` [n, h].
pub fn scatter_grad<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    dy: &B::Tensor,
    mut grad: ViewMut<'_, B::Tensor>,
    shift: usize,
) -> Result<(), ExecError> {
    if ctx.plan.model.learned_positions == 0 {
        return Ok(());
    }
    let r = l.tensors[1].range();
    ctx.ops
        .embedding_scatter_add(dy, &row_positions(ctx, shift), 0, grad.sub(r))
}

#[cfg(test)]
mod tests {
    use super::rolled;

    #[test]
    fn positions_roll_as_megatron_rolls_the_position_ids() {
        // seq 6, depth 1: [0 1 2 3 4 5] rolled by -1 with the last filled by 0.
        let d1: Vec<usize> = (0..6).map(|p| rolled(p, 1, 6)).collect();
        assert_eq!(d1, vec![1, 2, 3, 4, 5, 0]);
        // Depth 2 rolls twice: the last two are 0.
        let d2: Vec<usize> = (0..6).map(|p| rolled(p, 2, 6)).collect();
        assert_eq!(d2, vec![2, 3, 4, 5, 0, 0]);
        assert_eq!(rolled(3, 0, 6), 3);
    }
}
