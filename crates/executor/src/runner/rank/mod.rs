//! One rank's step loop: its action list played for a number of steps, with gradient
//! accumulation over microbatches, activation recomputation, split backward (I then W), the
//! pipeline mailbox (chunk outputs and input gradients waiting to be sent or consumed), and
//! the rank's measurements. [`Rank`](state::Rank) holds the state; each concern's methods
//! are in a file of their own.

mod backward;
mod buckets;
mod export;
mod forward;
pub(super) mod output;
mod pipeline;
mod setup;
mod shards;
mod state;
mod step;
mod views;

pub(super) use output::RankOutput;

use super::options::RunOptions;
use crate::backend::{Backend, DeviceCollectives};
use crate::error::ExecError;
use crate::layers::Ctx;
use crate::traced_comm::TracedComm;
use crate::traced_ops::TracedOps;
use parsim_plan::plan::{Plan, RankPlan};
use parsim_plan::GroupKind;
use state::Rank;
use step::Measured;

/// Plays rank `rp` of `plan` for `opts.steps` steps on device `ops` and collectives `comm`.
pub(super) fn run_rank<B: Backend>(
    plan: &Plan,
    rp: &RankPlan,
    ops: B::Device,
    comm: &B::Comm,
    opts: &RunOptions,
) -> Result<RankOutput, ExecError> {
    let tp = comm.group(rp.groups.get(GroupKind::Tp))?;
    let dp_cp = comm.group(rp.groups.get(GroupKind::DpCp))?;
    let cp = comm.group(rp.groups.get(GroupKind::Cp))?;
    let act_dtype = opts.precision.compute_dtype();
    let ops = &TracedOps::<B>::new(ops, opts.profile_ops, opts.ranks_per_node);
    let comm = &TracedComm::<B>::new(comm, rp.rank, opts.trace, ops);
    let ctx = Ctx::<B>::new(plan, ops, comm, tp, rp, cp, act_dtype)?;
    let mut rank = Rank::new(plan, rp, ctx, dp_cp, opts)?;
    let mut measured = Measured::new(opts);
    for step in 0..opts.steps {
        rank.play_step(step, opts, &mut measured)?;
    }
    rank.output(opts, measured)
}
