//! The step loop's pieces: one action played, its trace events, and the timed step retimed
//! on the backend's events.

use super::output::RankOutput;
use super::state::Rank;
use crate::backend::{Backend, Device};
use crate::error::ExecError;
use crate::runner::options::RunOptions;
use crate::traced_ops::TracedOps;
use parsim_plan::plan::Action;
use parsim_plan::run_report::{PhaseTimes, RankReport};
use parsim_plan::trace::{stream_of, EventKind, RankTrace, Stream, TraceEvent};

/// What the timed steps measured: step times, phase times, per-step loss and load-balancing
/// loss sums, and the trace when tracing.
pub(super) struct Measured {
    trace: Option<RankTrace>,
    step_s: Vec<f64>,
    loss_sums: Vec<f64>,
    aux_sums: Vec<f64>,
    phases: PhaseTimes,
}

impl Measured {
    pub(super) fn new(opts: &RunOptions) -> Measured {
        Measured {
            trace: opts.trace.map(|_| RankTrace::default()),
            step_s: Vec::new(),
            loss_sums: Vec::new(),
            aux_sums: Vec::new(),
            phases: PhaseTimes::default(),
        }
    }
}

/// The phase an action's time counts in.
fn phase_of(phases: &mut PhaseTimes, a: Action) -> &mut f64 {
    match a {
        Action::Forward { .. } => &mut phases.forward_s,
        Action::Backward { .. } | Action::BackwardInput { .. } => &mut phases.backward_s,
        Action::BackwardWeight { .. } => &mut phases.backward_weight_s,
        Action::OptimizerStep => &mut phases.optimizer_s,
        _ => &mut phases.p2p_s,
    }
}

impl<'a, B: Backend> Rank<'a, B> {
    /// Plays the action list once (step `step`; timed past the warm-up), with its losses.
    pub(super) fn play_step(
        &mut self,
        step: u32,
        opts: &RunOptions,
        out: &mut Measured,
    ) -> Result<(), ExecError> {
        let timed = step >= opts.warmup;
        if let Some(cp) = self.ctx.cp.as_mut() {
            cp.timing = timed;
        }
        // Events around the step and each action, read after the step (one wait per step).
        // The trace's clock is read before the step's first event: events placed from `t0` then
        // land no later than the host readings of the same moments, so an action's retimed
        // start never passes the host-timed collectives it calls first (the other order made
        // the span start after them whenever the two readings were far enough apart).
        let step_start_s = opts.trace.map(|c| c.now_s());
        let prof = self.ctx.ops.profile();
        if let Some(p) = prof {
            p.start_step(timed);
        }
        let mut op_ranges = Vec::new();
        let t0 = self.ctx.ops.record()?;
        self.loss_sum = 0.0;
        self.ctx.moe_aux_loss = 0.0;
        let mut marks = Vec::with_capacity(self.rp.actions.len());
        for (index, a) in self.rp.actions.iter().enumerate() {
            let ta = self.ctx.ops.record()?;
            let start_s = opts.trace.map(|c| c.now_s());
            self.recv_arrived_s = None;
            self.action_index = index;
            self.ctx.comm.take();
            if opts.export_grads && *a == Action::OptimizerStep {
                self.reduce_for_export()?;
                continue;
            }
            let op0 = prof.map_or(0, |p| p.mark());
            self.act(*a)?;
            let mut traced_at = None;
            if let (Some(t), Some(c), Some(start_s)) = (out.trace.as_mut(), opts.trace, start_s) {
                if timed {
                    traced_at =
                        Some(self.record(t, step - opts.warmup, index, a, start_s, c.now_s()));
                }
            }
            if timed {
                marks.push((*a, ta, self.ctx.ops.record()?, traced_at));
                op_ranges.push(op0..prof.map_or(0, |p| p.mark()));
            }
        }
        let t1 = self.ctx.ops.record()?;
        if timed {
            let ops = self.ctx.ops;
            let mut actions = Vec::with_capacity(marks.len());
            for ((a, ta, tb, _), range) in marks.iter().zip(op_ranges) {
                let action_s = ops.elapsed_s(ta, tb)?;
                *phase_of(&mut out.phases, *a) += action_s;
                actions.push((range, action_s));
            }
            if let Some(p) = prof {
                // Tracing, every timed op's span goes into the trace too, on the step's axis.
                let origin = out.trace.is_some().then_some(&t0);
                let spans = p.finish_step(|a, b| ops.elapsed_s(a, b), &actions, origin)?;
                if let (Some(t), Some(s0)) = (out.trace.as_mut(), step_start_s) {
                    t.events.extend(spans.into_iter().map(|o| TraceEvent {
                        step: step - opts.warmup,
                        stream: Stream::Ops,
                        kind: EventKind::Op {
                            key: o.key,
                            wait_s: o.wait_s,
                            group: o.group,
                        },
                        start_s: s0 + o.start_s,
                        end_s: s0 + o.end_s,
                    }));
                }
            }
            out.step_s.push(self.ctx.ops.elapsed_s(&t0, &t1)?);
            if let (Some(t), Some(s0)) = (out.trace.as_mut(), step_start_s) {
                retime_on_events::<B>(self.ctx.ops, t, &t0, &t1, s0, &marks)?;
            }
        }
        // The load-balancing loss of each microbatch, weighted by its tokens so that the
        // division by the step's tokens averages it over the microbatches.
        let aux = self.ctx.moe_aux_loss * self.ctx.n as f64;
        let aux = if self.rp.coords.tp == 0 { aux } else { 0.0 };
        out.loss_sums.push(self.loss_sum + aux);
        out.aux_sums.push(aux);
        Ok(())
    }

    /// The rank's report after the last step: phase times per timed step, memory, GEMM
    /// rates, and the exported parameters or gradients.
    pub(super) fn output(
        mut self,
        opts: &RunOptions,
        measured: Measured,
    ) -> Result<RankOutput, ExecError> {
        let Measured {
            trace,
            step_s,
            loss_sums,
            aux_sums,
            mut phases,
        } = measured;
        let timed = (opts.steps - opts.warmup) as f64;
        for x in [
            &mut phases.forward_s,
            &mut phases.backward_s,
            &mut phases.backward_weight_s,
            &mut phases.p2p_s,
            &mut phases.optimizer_s,
        ] {
            *x /= timed;
        }
        let tracker = self.ctx.ops.memory();
        let (peak, category_max, peak_site) =
            (tracker.peak(), tracker.category_max(), tracker.peak_site());
        let reserved_peak = tracker.reserved_peak();
        let (gemm_flops, gemm_seconds) = self.ctx.ops.gemm_stats();
        let params = if opts.export_params {
            self.export()?
        } else {
            Vec::new()
        };
        let grads = if opts.export_grads {
            self.export_grads()?
        } else {
            Vec::new()
        };
        let rp = self.rp;
        Ok(RankOutput {
            report: RankReport {
                rank: rp.rank,
                coords: rp.coords,
                step_s,
                phases,
                peak,
                category_max,
                reserved_peak,
                peak_site,
                gemm_flops,
                gemm_seconds,
                cp: self.ctx.cp.as_ref().map(|c| c.stats.clone()),
                moe_dropped: self.ctx.moe_dropped,
                moe_load: self.ctx.moe_load.clone(),
                device: None,
                ops: self
                    .ctx
                    .ops
                    .profile()
                    .map(|p| p.timings())
                    .unwrap_or_default(),
            },
            loss_sums,
            aux_sums,
            params,
            grads,
            trace,
        })
    }

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
type Mark<B> = (
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
fn retime_on_events<B: Backend>(
    ops: &TracedOps<B>,
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
