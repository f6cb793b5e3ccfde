//! Expert tensor parallelism (expert TP > 1) around the routed experts, as Megatron-Core's
//! token dispatchers (`MoEAlltoAllTokenDispatcher`, `tp_size > 1`): each TP rank routes its
//! own sequence shard and dispatches its rows over its EP group; the rows the members of its
//! expert-TP group (`ctx.etp`: the TP group when expert TP = tp, else a block of expert-TP
//! consecutive TP ranks, MoE Parallel Folding) received are all-gathered over that group
//! before the expert GEMMs (each rank holds a slice of every local expert's intermediate
//! size), and the experts' partial outputs reduce-scatter back to the rows each rank received
//! before the combine. Backward mirrors
//! it: the received output gradients are all-gathered, the experts' input gradients
//! reduce-scattered. The gathers have variable sizes (each rank receives what its EP group
//! routed to it), so they run as range collectives over the member-after-member layout.

use super::ctx::Ctx;
use crate::backend::{Backend, DeviceCollectives, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;

/// The expert-TP layout of the received rows: per (expert-TP member, EP source), in that order, the
/// rows of each local expert, and this rank's first row and rows in the gathered buffer.
#[derive(Debug, Clone)]
pub struct EtRows {
    pub per_source: Vec<Vec<usize>>,
    pub lo: usize,
    pub rows: usize,
}

impl EtRows {
    /// The gathered rows of every expert-TP member.
    pub fn total(&self) -> usize {
        self.per_source.iter().flatten().sum()
    }
}

/// The layout of the rows this rank received (`own`: per EP source, rows per local expert):
/// with expert TP the expert-TP members' layouts are exchanged (host counts); without, its own.
pub fn layout<B: Backend>(ctx: &Ctx<B>, own: Vec<Vec<usize>>) -> Result<EtRows, ExecError> {
    let rows = own.iter().flatten().sum();
    let t = ctx.rd.et;
    if t == 1 {
        return Ok(EtRows {
            per_source: own,
            lo: 0,
            rows,
        });
    }
    let local = own.first().map_or(0, Vec::len);
    let flat: Vec<usize> = own.iter().flatten().copied().collect();
    // all_to_all_counts sends chunk r to member r: every member gets this rank's whole list.
    let send: Vec<usize> = (0..t).flat_map(|_| flat.iter().copied()).collect();
    let got = ctx.comm.all_to_all_counts(&ctx.etp, &send)?;
    let lo = got[..ctx.rd.et_rank * flat.len()].iter().sum();
    Ok(EtRows {
        per_source: got.chunks(local.max(1)).map(<[usize]>::to_vec).collect(),
        lo,
        rows,
    })
}

/// All-gathers this rank's received rows `own` [rows, h] over expert TP into [total, h] (category
/// `cat`); without expert TP, `own` itself.
pub fn gather<B: Backend>(
    ctx: &Ctx<B>,
    own: B::Tensor,
    at: &EtRows,
    h: usize,
    cat: Category,
) -> Result<B::Tensor, ExecError> {
    if ctx.rd.et == 1 {
        return Ok(own);
    }
    let total = at.total();
    let mut all = ctx.zeros(cat, &[total, h])?;
    ctx.comm.gather_range(
        &ctx.etp,
        at.lo * h,
        View::all(&own),
        0..total * h,
        ViewMut::all(&mut all),
    )?;
    Ok(all)
}

/// Reduce-scatters the experts' partial results `all` [total, h] over expert TP: the sum over
/// the expert-TP members of this rank's received rows [rows, h] (category `cat`); without
/// expert TP, `all`.
pub fn reduce_scatter<B: Backend>(
    ctx: &Ctx<B>,
    all: B::Tensor,
    at: &EtRows,
    h: usize,
    cat: Category,
) -> Result<B::Tensor, ExecError> {
    if ctx.rd.et == 1 {
        return Ok(all);
    }
    let mut own = ctx.zeros(cat, &[at.rows, h])?;
    let mine = at.lo * h..(at.lo + at.rows) * h;
    ctx.comm
        .reduce_scatter_range(&ctx.etp, 0, View::all(&all), mine, ViewMut::all(&mut own))?;
    Ok(own)
}
