//! The step loop's pieces: one action played, its trace events, and the timed step retimed
//! on the backend's events.

use super::state::Rank;
use crate::backend::{Backend, Device};
use crate::error::ExecError;
use crate::plan::Action;
use crate::trace::{stream_of, EventKind, RankTrace, Stream, TraceEvent};

impl<'a, B: Backend> Rank<'a, B> {
    /// Adds action `index` (`a`, played from `start_s` to `end_s` in timed step `step`) to
    /// the trace: a receive as its wait then its copy, with the collectives it called.
    pub(super) fn record(
        &mut self,
        t: &mut RankTrace,
        step: u32,
        index: usize,
        a: &Action,
        start_s: f64,
        end_s: f64,
    ) -> usize {
        let begin_s = match self.recv_arrived_s.take() {
            Some(arrived_s) => {
                t.events.push(TraceEvent {
                    step,
                    stream: Stream::Pipeline,
                    kind: EventKind::Wait { index },
                    start_s,
                    end_s: arrived_s,
                });
                arrived_s
            }
            None => start_s,
        };
        let at = t.events.len();
        t.events.push(TraceEvent {
            step,
            stream: stream_of(a),
            kind: EventKind::Action { action: *a, index },
            start_s: begin_s,
            end_s,
        });
        for c in self.ctx.comm.take() {
            let kind = match c.stream {
                Stream::Kernels => EventKind::Kernel { name: c.op.into() },
                _ => EventKind::Collective {
                    op: c.op.into(),
                    group: c.group,
                    bytes: c.bytes,
                },
            };
            t.events.push(TraceEvent {
                step,
                stream: c.stream,
                kind,
                start_s: c.start_s,
                end_s: c.end_s,
            });
        }
        at
    }

    pub(super) fn act(&mut self, a: Action) -> Result<(), ExecError> {
        match a {
            Action::Forward { stage, mb } => self.forward(stage, mb),
            Action::Backward { stage, mb } => {
                self.backward_input(stage, mb, true)?;
                self.stage_final(stage)
            }
            Action::BackwardInput { stage, mb } => self.backward_input(stage, mb, false),
            Action::BackwardWeight { stage, mb } => {
                let tasks =
                    self.wtasks
                        .remove(&(stage, mb))
                        .ok_or(ExecError::WeightBeforeInput {
                            rank: self.rp.rank,
                            stage,
                            mb,
                        })?;
                // A block's gradients are complete after its last task list (an MTP module
                // routes some to the output layer's block ahead of the block's own).
                let blocks: Vec<usize> = tasks.iter().map(|t| t.0).collect();
                for (k, (bi, ts)) in tasks.into_iter().enumerate() {
                    self.run_tasks(bi, ts)?;
                    if !blocks[k + 1..].contains(&bi) {
                        self.block_final(stage, bi)?;
                    }
                }
                self.stage_final(stage)
            }
            Action::SendActivation { to, stage, mb } => self.send(to, stage, mb, false),
            Action::SendGrad { to, stage, mb } => self.send(to, stage, mb, true),
            Action::RecvActivation { from, stage, mb } => self.recv(from, stage, mb, false),
            Action::RecvGrad { from, stage, mb } => self.recv(from, stage, mb, true),
            Action::OptimizerStep => self.optimizer_step(),
        }
    }
}

/// One timed action: the action, its start and end events, and where its span sits in the
/// rank's trace (when tracing).
pub(super) type Mark<B> = (
    Action,
    <B as Backend>::Event,
    <B as Backend>::Event,
    Option<usize>,
);

/// Puts a timed step's actions on the backend's clock: each action ends where its end event
/// says (CUDA events on the GPU, the host clock on the CPU), measured from the step's first
/// event and placed on the trace's axis at the step's start `s0`; an action starts at its
/// start event or, after a wait for a message, where the wait ended. The step's span comes
/// from the same events, so the trace and the reported step time agree.
pub(super) fn retime_on_events<B: Backend>(
    ops: &B::Device,
    t: &mut RankTrace,
    t0: &B::Event,
    t1: &B::Event,
    s0: f64,
    marks: &[Mark<B>],
) -> Result<(), ExecError> {
    for (_, ta, tb, at) in marks {
        let Some(e) = at.and_then(|i| t.events.get_mut(i)) else {
            continue;
        };
        let start_s = s0 + ops.elapsed_s(t0, ta)?;
        let end_s = s0 + ops.elapsed_s(t0, tb)?;
        e.end_s = end_s;
        e.start_s = e.start_s.max(start_s).min(end_s);
    }
    t.steps.push((s0, s0 + ops.elapsed_s(t0, t1)?));
    Ok(())
}
