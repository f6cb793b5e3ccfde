//! Measured against predicted, action by action: per rank and kind of action the mean
//! measured seconds per timed step beside the engine's simulated seconds, and the actions
//! whose miss (measured minus predicted duration) costs the most step time. Calibration can
//! read the per-action figures from the JSON.

use super::measured_trace::{event_kind, event_name, schedule_action};
use crate::schedule::{ActionKind, Program, Simulation};
use parsim_plan::plan::Plan;
use parsim_plan::trace::{EventKind, RankTrace};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Misses listed by [`compare_timeline`].
pub const LARGEST_MISSES: usize = 5;

/// One rank's time in one kind of action, per timed step (mean over the timed steps).
#[derive(Debug, Clone, Serialize)]
pub struct KindTimes {
    pub rank: u32,
    pub kind: String,
    /// Events of this kind in one step.
    pub count: usize,
    pub measured_s: f64,
    /// The schedule's simulated seconds (F, B, I, W only: the schedule lists no others).
    pub predicted_s: Option<f64>,
}

/// One action of the Plan, measured (mean over the timed steps) and predicted.
#[derive(Debug, Clone, Serialize)]
pub struct ActionMiss {
    pub rank: u32,
    pub name: String,
    pub kind: String,
    pub stage: u32,
    pub microbatch: u32,
    pub measured_s: f64,
    pub predicted_s: f64,
    /// measured - predicted.
    pub error_s: f64,
}

/// The whole comparison (`parsim execute --compare-timeline`).
#[derive(Debug, Clone, Serialize)]
pub struct TimelineComparison {
    pub per_kind: Vec<KindTimes>,
    /// The [`LARGEST_MISSES`] actions with the largest |error_s|.
    pub largest_misses: Vec<ActionMiss>,
    /// Every compute action with a prediction (for calibration).
    pub actions: Vec<ActionMiss>,
}

/// Simulated duration of each (pipeline rank, kind, stage, microbatch).
fn predicted_durations(
    program: &Program,
    sim: &Simulation,
) -> HashMap<(u32, ActionKind, u32, u32), f64> {
    let mut m = HashMap::new();
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        for (a, s) in acts.iter().zip(spans) {
            m.insert((r as u32, a.kind, a.stage, a.microbatch), s.end - s.start);
        }
    }
    m
}

/// Compares the recorded `traces` of a run of `plan` with the simulation of `program`.
pub fn compare_timeline(
    plan: &Plan,
    traces: &[RankTrace],
    program: &Program,
    sim: &Simulation,
) -> TimelineComparison {
    let predicted = predicted_durations(program, sim);
    let mut per_kind = Vec::new();
    let mut actions = Vec::new();
    for (rp, t) in plan.ranks.iter().zip(traces) {
        let steps = t.steps.len().max(1) as f64;
        let pp = rp.coords.pp;
        // kind -> (events, measured seconds, predicted seconds of those with a prediction)
        let mut kinds: BTreeMap<&str, (usize, f64, Option<f64>)> = BTreeMap::new();
        // action index -> the action, its measured seconds summed over the events so far
        let mut per_action: BTreeMap<usize, ActionMiss> = BTreeMap::new();
        for e in &t.events {
            let k = kinds.entry(event_kind(e)).or_insert((0, 0.0, None));
            if e.step == 0 {
                k.0 += 1;
            }
            k.1 += e.duration_s() / steps;
            let EventKind::Action { action, index } = &e.kind else {
                continue;
            };
            let Some(key) = schedule_action(action) else {
                continue;
            };
            let Some(&p) = predicted.get(&(pp, key.0, key.1, key.2)) else {
                continue;
            };
            if e.step == 0 {
                *k.2.get_or_insert(0.0) += p;
            }
            per_action
                .entry(*index)
                .or_insert_with(|| ActionMiss {
                    rank: rp.rank,
                    name: event_name(e, program),
                    kind: key.0.letter().to_string(),
                    stage: key.1,
                    microbatch: key.2,
                    measured_s: 0.0,
                    predicted_s: p,
                    error_s: 0.0,
                })
                .measured_s += e.duration_s() / steps;
        }
        for (kind, (count, measured_s, predicted_s)) in kinds {
            per_kind.push(KindTimes {
                rank: rp.rank,
                kind: kind.to_string(),
                count,
                measured_s,
                predicted_s,
            });
        }
        actions.extend(per_action.into_values().map(|a| ActionMiss {
            error_s: a.measured_s - a.predicted_s,
            ..a
        }));
    }
    let mut largest_misses = actions.clone();
    largest_misses.sort_by(|a, b| b.error_s.abs().total_cmp(&a.error_s.abs()));
    largest_misses.truncate(LARGEST_MISSES);
    TimelineComparison {
        per_kind,
        largest_misses,
        actions,
    }
}
