//! Op-class timing (`RunOptions::profile_ops`): each op of a timed step is bracketed by two of
//! the backend's events (the host clock on the CPU, CUDA events on the compute stream), kept
//! until the step ends and only then read, so the GPU is never synchronised inside a step.
//! The ops of each action are summed by [`OpKey`]; what of the action's time no op covers is
//! its host gap (launches, bookkeeping, allocation, waits outside a timed call), counted in
//! calls as the ops it falls between.

use crate::error::{ExecError, StateError};
use parsim_plan::op_timing::{OpKey, OpTiming};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ops::Range;

/// How far the ops' summed time may pass their action's time before the step is refused:
/// the host clock's resolution (and a CUDA event's, 0.5 us) summed over an action's ops.
pub const RESOLUTION_S: f64 = 1e-6;

/// A recorded op: key, start and end events, seconds waited, a collective's group.
type Pending<E> = (OpKey, E, E, f64, Vec<u32>);

/// A timed op's span, in seconds from the step's first event (`execute --trace` draws it).
#[derive(Debug, Clone, PartialEq)]
pub struct OpSpan {
    pub key: OpKey,
    pub start_s: f64,
    pub end_s: f64,
    /// Seconds of the span spent waiting for other ranks (at most the span).
    pub wait_s: f64,
    /// A collective's group (global ranks); empty for other ops.
    pub group: Vec<u32>,
}

/// One rank's op timings: the current step's bracketed ops and the totals of the timed steps.
pub struct OpProfile<E> {
    /// Recording (a timed step is running).
    active: Cell<bool>,
    /// Each op's key, events, the seconds of it spent waiting for other ranks, and a
    /// collective's group (global ranks; empty for other ops).
    pending: RefCell<Vec<Pending<E>>>,
    totals: RefCell<BTreeMap<OpKey, (u64, f64)>>,
}

impl<E> Default for OpProfile<E> {
    fn default() -> Self {
        OpProfile {
            active: Cell::new(false),
            pending: RefCell::new(Vec::new()),
            totals: RefCell::new(BTreeMap::new()),
        }
    }
}

impl<E> OpProfile<E> {
    /// Whether ops are being recorded now.
    pub fn active(&self) -> bool {
        self.active.get()
    }

    /// Starts (`timed`) or pauses recording for the step about to run.
    pub fn start_step(&self, timed: bool) {
        self.active.set(timed);
        self.pending.borrow_mut().clear();
    }

    /// Where the next recorded op goes: an action's ops are those between its two marks.
    pub fn mark(&self) -> usize {
        self.pending.borrow().len()
    }

    /// Records an op of key `key` between events `start` and `end`.
    pub fn push(&self, key: OpKey, start: E, end: E) {
        self.push_waited(key, start, end, 0.0);
    }

    /// Records an op of which `wait_s` seconds were spent waiting for other ranks: that part
    /// goes to [`OpKey::Wait`], the rest to `key`.
    pub fn push_waited(&self, key: OpKey, start: E, end: E, wait_s: f64) {
        self.push_collective(key, start, end, wait_s, Vec::new());
    }

    /// [`Self::push_waited`] for a collective over `group` (global ranks).
    pub fn push_collective(&self, key: OpKey, start: E, end: E, wait_s: f64, group: Vec<u32>) {
        self.pending
            .borrow_mut()
            .push((key, start, end, wait_s, group));
    }

    /// Ends a timed step: reads every op's events with `elapsed_s` and adds them to the
    /// totals, with each action's host gap (its time `action_s` less its ops', ops `range`).
    /// An action whose ops take longer than itself beyond [`RESOLUTION_S`] is an error (its
    /// timed ops would overlap); within it the gap is zero. With `origin` (the step's first
    /// event), every op's span in seconds from it is returned, for the trace.
    pub fn finish_step(
        &self,
        elapsed_s: impl Fn(&E, &E) -> Result<f64, ExecError>,
        actions: &[(Range<usize>, f64)],
        origin: Option<&E>,
    ) -> Result<Vec<OpSpan>, ExecError> {
        self.active.set(false);
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        let mut totals = self.totals.borrow_mut();
        let mut add = |key: OpKey, calls: u64, s: f64| {
            let e = totals.entry(key).or_insert((0, 0.0));
            e.0 += calls;
            e.1 += s;
        };
        let mut spans = Vec::new();
        for (range, action_s) in actions {
            let mut ops_s = 0.0;
            for (key, start, end, wait_s, group) in &pending[range.clone()] {
                let s = elapsed_s(start, end)?;
                ops_s += s;
                // The host clock times the wait inside the op's own span: at most all of it.
                let wait_s = wait_s.clamp(0.0, s);
                if let Some(o) = origin {
                    let start_s = elapsed_s(o, start)?;
                    spans.push(OpSpan {
                        key: key.clone(),
                        start_s,
                        end_s: start_s + s,
                        wait_s,
                        group: group.clone(),
                    });
                }
                add(key.clone(), 1, s - wait_s);
                if wait_s > 0.0 {
                    add(OpKey::Wait, 1, wait_s);
                }
            }
            let gap_s = action_s - ops_s;
            if gap_s < -RESOLUTION_S {
                return Err(StateError::OverlappingOpTimes {
                    ops_s,
                    action_s: *action_s,
                }
                .into());
            }
            // The gap is shared out over the action's ops (an action with none counts one), so
            // a host gap record's mean is seconds per op, the unit the time model adds it in.
            add(OpKey::HostGap, range.len().max(1) as u64, gap_s.max(0.0));
        }
        Ok(spans)
    }

    /// The totals of the timed steps, one record per key, in key order.
    pub fn timings(&self) -> Vec<OpTiming> {
        self.totals
            .borrow()
            .iter()
            .map(|(key, &(calls, total_s))| OpTiming {
                key: key.clone(),
                calls,
                total_s,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_host_gaps_sum_to_the_actions_and_overlap_is_refused() {
        // Events as plain seconds: elapsed is their difference.
        let elapsed = |a: &f64, b: &f64| Ok::<f64, ExecError>(b - a);
        let p = OpProfile::<f64>::default();
        let mem = OpKey::Memory { bytes: 64 };
        p.start_step(true);
        p.push(mem.clone(), 0.0, 0.25);
        p.push(mem.clone(), 0.5, 0.75);
        p.push(mem.clone(), 2.0, 2.5);
        // Three actions: 1 s holding two ops (0.5 s), 1 s holding one (0.5 s), 0.5 s holding
        // none. The gaps count one call per op they fall between, one for the empty action.
        let spans = p
            .finish_step(
                elapsed,
                &[(0..2, 1.0), (2..3, 1.0), (3..3, 0.5)],
                Some(&0.0),
            )
            .unwrap();
        // The spans are the ops' own, from the origin.
        let ends: Vec<(f64, f64)> = spans.iter().map(|s| (s.start_s, s.end_s)).collect();
        assert_eq!(ends, [(0.0, 0.25), (0.5, 0.75), (2.0, 2.5)]);
        let t = p.timings();
        let total: f64 = t.iter().map(|r| r.total_s).sum();
        assert!((total - 2.5).abs() < 1e-12);
        let gap = t.iter().find(|r| r.key == OpKey::HostGap).unwrap();
        assert_eq!((gap.calls, gap.total_s), (2 + 1 + 1, 1.5));
        // Not recording: nothing is kept.
        p.start_step(false);
        assert!(!p.active());
        p.start_step(true);
        p.push(mem, 0.0, 2.0);
        assert!(p.finish_step(elapsed, &[(0..1, 1.0)], None).is_err());
    }
}
