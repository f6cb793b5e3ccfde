//! Learned absolute position embeddings (GPT-2/3; Megatron's `--position-embedding-type
//! learned_absolute`): a [rows, h] table replicated over TP, row p added to the word embedding
//! of every token at sequence position p. With CP each rank looks up its own rows' positions
//! (zigzag included), so the sum is the single-rank run's.

use super::params::{seg, BlockLayout, Builder};
use super::Ctx;
use crate::backend::{Backend, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::memory::Category;

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

/// Sequence positions of the microbatch's rows on this rank (batch-major, before SP).
fn row_positions<B: Backend>(ctx: &Ctx<B>) -> Vec<u32> {
    let b = ctx.plan.model.micro_batch;
    (0..b).flat_map(|_| ctx.positions.iter().copied()).collect()
}

/// Adds the position rows to the word embedding's TP partial sum [n, h] on TP rank 0 only,
/// so the TP reduction adds them once.
pub fn add_rows<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    partial: &mut B::Tensor,
) -> Result<(), ExecError> {
    if ctx.plan.model.learned_positions == 0 || ctx.rd.tp_rank != 0 {
        return Ok(());
    }
    let mut rows = ctx.zeros(Category::Buffers, &[ctx.n, ctx.rd.h])?;
    let table = p.sub(l.tensors[1].range());
    ctx.ops
        .embedding_gather(table, &row_positions(ctx), 0, &mut rows)?;
    ctx.ops.axpy(1.0, View::all(&rows), ViewMut::all(partial))
}

/// grad[position of row r] += dy[r] for the full (expanded) output gradient `dy` [n, h].
pub fn scatter_grad<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    dy: &B::Tensor,
    mut grad: ViewMut<'_, B::Tensor>,
) -> Result<(), ExecError> {
    if ctx.plan.model.learned_positions == 0 {
        return Ok(());
    }
    let r = l.tensors[1].range();
    ctx.ops
        .embedding_scatter_add(dy, &row_positions(ctx), 0, grad.sub(r))
}
