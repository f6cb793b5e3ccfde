//! A rank's context-parallel state: its CP group and coordinate, every CP rank's positions
//! and the timing of the exchanges.

use crate::backend::{Backend, ProcessGroup};
use parsim_plan::plan::CpComm;
use parsim_plan::run_report::{CpStats, StepTime};

/// A rank's context-parallel state.
pub struct CpCtx<B: Backend> {
    pub group: B::Group,
    /// This rank's index in the CP group (its CP coordinate).
    pub rank: usize,
    pub size: usize,
    pub comm: CpComm,
    /// Positions (within a sequence) of every CP rank's rows.
    pub positions: Vec<Vec<u32>>,
    pub stats: CpStats,
    /// Whether times are being recorded (the timed steps).
    pub timing: bool,
    /// The attention sinks of the layer being run (this TP rank's heads) and, in backward,
    /// their gradient over this rank's rows.
    pub sinks: Option<B::Tensor>,
    pub dsinks: Option<B::Tensor>,
}

impl<B: Backend> CpCtx<B> {
    pub fn new(group: B::Group, comm: CpComm, seq: usize) -> CpCtx<B> {
        let size = group.size();
        CpCtx {
            rank: group.index(),
            positions: (0..size).map(|r| comm.positions(seq, size, r)).collect(),
            group,
            size,
            comm,
            stats: CpStats::default(),
            timing: false,
            sinks: None,
            dsinks: None,
        }
    }

    pub(super) fn next(&self) -> u32 {
        self.group.members()[(self.rank + 1) % self.size]
    }

    /// The member `hops` places ahead of this rank around the ring.
    pub(super) fn ahead(&self, hops: usize) -> u32 {
        self.group.members()[(self.rank + hops) % self.size]
    }

    pub(super) fn prev(&self) -> u32 {
        self.group.members()[(self.rank + self.size - 1) % self.size]
    }

    pub(super) fn record(&mut self, backward: bool, step: usize, compute_s: f64, comm_s: f64) {
        if !self.timing {
            return;
        }
        let v = if backward {
            &mut self.stats.backward
        } else {
            &mut self.stats.forward
        };
        if v.len() <= step {
            v.resize(step + 1, StepTime::default());
        }
        v[step].compute_s += compute_s;
        v[step].comm_s += comm_s;
    }
}
