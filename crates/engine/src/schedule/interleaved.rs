//! Interleaved 1F1B (Narayanan et al. 2021, §2.2.2), as Megatron-LM's
//! `forward_backward_pipelining_with_interleaving` runs it today.
//!
//! Each rank holds `v` model chunks; global stage `s` lives on rank `s mod p` (chunk `s / p`).
//! Microbatches are taken in groups of N = `microbatch_group_size_per_vp_stage` (default p):
//! within a group every chunk runs the group's microbatches before the next chunk
//! (`get_schedule_table`). Rank r runs `(p - r - 1) * 2 + (v - 1) * N` warm-up forwards
//! (capped at m v, `get_pp_rank_microbatches`), then one forward and one backward per step,
//! then the remaining backwards; backward k uses the same table entry as forward k with the
//! chunk order reversed. Megatron requires `p <= N <= m` and a last group of 0 or at least p
//! microbatches; with the default N = p that means m must be a multiple of p. Peak live
//! activation sets on rank r: warm-up + 1, capped at m v.

use super::action::{ActionKind, ComputeAction};

/// The (microbatch, chunk) order of forwards, Megatron's `get_schedule_table`.
pub(super) fn schedule_table(m: u32, v: u32, group: u32) -> Vec<(u32, u32)> {
    let mut table = Vec::with_capacity(m as usize * v as usize);
    let mut first = 0;
    while first < m {
        let last = if first + group >= m { m } else { first + group };
        for chunk in 0..v {
            for mb in first..last {
                table.push((mb, chunk));
            }
        }
        first += group;
    }
    table
}

/// Megatron's warm-up forward count on rank `r`.
pub(super) fn warmup(pp: u32, v: u32, m: u32, group: u32, r: u32) -> u32 {
    let w = (pp - r - 1) as u64 * 2 + (v as u64 - 1) * group as u64;
    w.min(m as u64 * v as u64) as u32
}

/// Rank programs; the arguments were checked by the caller (`v >= 2`, group rules).
pub(super) fn ranks(pp: u32, v: u32, m: u32, group: u32) -> Vec<Vec<ComputeAction>> {
    let table = schedule_table(m, v, group);
    let total = table.len();
    (0..pp)
        .map(|r| {
            let w = warmup(pp, v, m, group, r) as usize;
            let fwd = |k: usize| {
                let (mb, c) = table[k];
                ComputeAction::new(ActionKind::F, c * pp + r, mb)
            };
            let bwd = |k: usize| {
                let (mb, c) = table[k];
                ComputeAction::new(ActionKind::B, (v - 1 - c) * pp + r, mb)
            };
            let mut out = Vec::with_capacity(2 * total);
            out.extend((0..w).map(fwd));
            for k in 0..total - w {
                out.push(fwd(w + k));
                out.push(bwd(k));
            }
            out.extend((total - w..total).map(bwd));
            out
        })
        .collect()
}
