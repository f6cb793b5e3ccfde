//! The `parsim schedule --json` document.
//!
//! Shape (stable): `{"schedule", "pp", "vpp", "microbatches", "makespan", "bubble_fraction",
//! "ranks": [{"rank", "peak_inflight", "actions": [{"kind": "F"|"B"|"I"|"W", "stage",
//! "microbatch", "start", "end"}]}]}`, actions in execution order, microbatches 0-based. The
//! two halves of an overlapped DualPipe-V slot share one start (and one end).

use crate::schedule::{Program, Simulation};
use serde::Serialize;

/// One schedule's simulated timeline.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleJson {
    pub schedule: String,
    pub pp: u32,
    pub vpp: u32,
    pub microbatches: u32,
    pub makespan: f64,
    pub bubble_fraction: f64,
    pub ranks: Vec<RankJson>,
}

/// One pipeline rank.
#[derive(Debug, Clone, Serialize)]
pub struct RankJson {
    pub rank: u32,
    pub peak_inflight: u32,
    pub actions: Vec<ActionJson>,
}

/// One action with its simulated times.
#[derive(Debug, Clone, Serialize)]
pub struct ActionJson {
    pub kind: &'static str,
    pub stage: u32,
    pub microbatch: u32,
    pub start: f64,
    pub end: f64,
}

/// Builds the document from a program and its simulation.
pub fn schedule_json(program: &Program, sim: &Simulation) -> ScheduleJson {
    let ranks = program
        .ranks
        .iter()
        .zip(&sim.timeline)
        .enumerate()
        .map(|(r, (acts, spans))| RankJson {
            rank: r as u32,
            peak_inflight: sim.peak_inflight[r],
            actions: acts
                .iter()
                .zip(spans)
                .map(|(a, s)| ActionJson {
                    kind: a.kind.letter(),
                    stage: a.stage,
                    microbatch: a.microbatch,
                    start: s.start,
                    end: s.end,
                })
                .collect(),
        })
        .collect();
    ScheduleJson {
        schedule: program.kind.as_str().to_string(),
        pp: program.pp,
        vpp: program.vpp,
        microbatches: program.microbatches,
        makespan: sim.makespan,
        bubble_fraction: sim.bubble_fraction,
        ranks,
    }
}
