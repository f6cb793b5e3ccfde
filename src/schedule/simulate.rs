//! Event simulator: plays a [`Program`] with [`Costs`] and returns when every action ran.
//!
//! Each rank executes its actions in order, one at a time; an action starts when the rank is
//! free and all its inputs exist (plus one point-to-point hop when an input comes from another
//! rank). That is a pure dataflow model, so the result does not depend on the order in which
//! ranks are visited. The simulator visits a rank until it blocks, then parks it until the
//! neighbour that produces its missing input completes something: O(actions) time and memory.
//! When no rank can move but actions are left, it returns [`ScheduleError::Deadlock`] instead of
//! looping.
//!
//! Live activations: a forward's activations are live from its F until the last backward part
//! that needs them finishes (B, or W where the backward is split). Because a rank runs its
//! actions one after another, the peak is read off the program order; the two halves of an
//! overlapped DualPipe-V slot count together (the forward's activations are created while the
//! backward's are still held).

use super::action::{rank_of_stage, ActionKind, Overlap, Program};
use super::costs::Costs;
use super::error::ScheduleError;

/// Start and end time of one action.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// When the action starts.
    pub start: f64,
    /// When it ends. The two halves of an overlapped slot both end when the slot ends.
    pub end: f64,
}

/// The outcome of playing a program.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// `timeline[r][k]` is the span of `program.ranks[r][k]`.
    pub timeline: Vec<Vec<Span>>,
    /// End of the last action on any rank (the first starts at 0).
    pub makespan: f64,
    /// Compute time per rank (an overlapped slot counted once).
    pub busy: Vec<f64>,
    /// Idle time per rank, `makespan - busy`.
    pub idle: Vec<f64>,
    /// Bubble over ideal compute time, `(makespan - max busy) / max busy`: Megatron's
    /// convention (Narayanan et al. 2021), which is (p-1)/m for 1F1B with F = B and no
    /// communication, (p-1)/(v m) for interleaved 1F1B.
    pub bubble_fraction: f64,
    /// Total idle time over total rank time, `sum idle / (pp * makespan)`.
    pub idle_over_makespan: f64,
    /// Peak number of live activation sets (chunk-microbatch forwards whose last backward
    /// part has not finished) per rank.
    pub peak_inflight: Vec<u32>,
}

const NOT_DONE: f64 = f64::NAN;

/// Plays `program` with `costs`. Errors: costs for the wrong number of stages, an invalid
/// program (missing, duplicated or misplaced actions), or a deadlock.
pub fn simulate(program: &Program, costs: &Costs) -> Result<Simulation, ScheduleError> {
    check_inputs(program, costs)?;
    let stages = program.num_stages();
    let m = program.microbatches;
    let cells = stages as u64 * m as u64;

    let pp = program.pp as usize;
    let placement = program.placement;
    let pp32 = program.pp;
    let idx = |s: u32, mb: u32| s as usize * m as usize + mb as usize;
    let mut f_end = vec![NOT_DONE; cells as usize];
    let mut g_end = vec![NOT_DONE; cells as usize];

    let mut timeline: Vec<Vec<Span>> = program
        .ranks
        .iter()
        .map(|acts| Vec::with_capacity(acts.len()))
        .collect();
    let mut pc = vec![0usize; pp];
    let mut free = vec![0.0f64; pp];
    let mut busy = vec![0.0f64; pp];
    let mut parked = vec![false; pp];
    let mut stack: Vec<usize> = (0..pp).rev().collect();

    // Time at which the inputs of action `a` on rank `r` exist, or None if one is missing.
    let ready = |a: &super::action::Action, r: u32, f_end: &[f64], g_end: &[f64]| -> Option<f64> {
        let s = a.stage;
        let mb = a.microbatch;
        match a.kind {
            ActionKind::F => {
                if s == 0 {
                    return Some(0.0);
                }
                let t = f_end[idx(s - 1, mb)];
                if t.is_nan() {
                    return None;
                }
                let hop = if rank_of_stage(placement, pp32, s - 1) != r {
                    costs.hop(s - 1)
                } else {
                    0.0
                };
                Some(t + hop)
            }
            ActionKind::B | ActionKind::I => {
                let own = f_end[idx(s, mb)];
                if own.is_nan() {
                    return None;
                }
                if s + 1 == stages {
                    return Some(own);
                }
                let t = g_end[idx(s + 1, mb)];
                if t.is_nan() {
                    return None;
                }
                let hop = if rank_of_stage(placement, pp32, s + 1) != r {
                    costs.hop(s)
                } else {
                    0.0
                };
                Some(own.max(t + hop))
            }
            ActionKind::W => {
                let t = g_end[idx(s, mb)];
                if t.is_nan() {
                    None
                } else {
                    Some(t)
                }
            }
        }
    };
    let duration = |a: &super::action::Action| -> f64 {
        let s = a.stage as usize;
        match a.kind {
            ActionKind::F => costs.forward[s],
            ActionKind::B => costs.backward[s],
            ActionKind::I => costs.input_grad[s],
            ActionKind::W => costs.weight_grad[s],
        }
    };

    while let Some(r) = stack.pop() {
        let acts = &program.ranks[r];
        let r32 = r as u32;
        loop {
            let k = pc[r];
            if k >= acts.len() {
                break;
            }
            let a = &acts[k];
            let n = if a.overlap == Overlap::First { 2 } else { 1 };
            let mut t0 = free[r];
            let mut blocked = false;
            for b in &acts[k..k + n] {
                match ready(b, r32, &f_end, &g_end) {
                    Some(t) => t0 = t0.max(t),
                    None => blocked = true,
                }
            }
            if blocked {
                parked[r] = true;
                break;
            }
            let dur = if n == 2 {
                costs.overlap_factor * (duration(a) + duration(&acts[k + 1]))
            } else {
                duration(a)
            };
            let t1 = t0 + dur;
            free[r] = t1;
            busy[r] += dur;
            for b in &acts[k..k + n] {
                timeline[r].push(Span { start: t0, end: t1 });
                let s = b.stage;
                let cell = idx(s, b.microbatch);
                let wake = match b.kind {
                    ActionKind::F => {
                        f_end[cell] = t1;
                        (s + 1 < stages).then(|| rank_of_stage(placement, pp32, s + 1))
                    }
                    ActionKind::B | ActionKind::I => {
                        g_end[cell] = t1;
                        (s > 0).then(|| rank_of_stage(placement, pp32, s - 1))
                    }
                    ActionKind::W => None,
                };
                if let Some(q) = wake {
                    let q = q as usize;
                    if q != r && parked[q] {
                        parked[q] = false;
                        stack.push(q);
                    }
                }
            }
            pc[r] += n;
        }
    }

    if let Some(err) = deadlock(program, &pc) {
        return Err(err);
    }

    let sim = summarise(program, timeline, &free, busy);
    if !(sim.makespan.is_finite() && sim.busy.iter().all(|b| b.is_finite())) {
        return Err(ScheduleError::NonFinite {
            makespan: sim.makespan,
        });
    }
    Ok(sim)
}

/// The program and costs describe the same stages, and the cells fit the simulator's indices.
fn check_inputs(program: &Program, costs: &Costs) -> Result<(), ScheduleError> {
    costs.validate()?;
    let stages = program.num_stages();
    let m = program.microbatches;
    if costs.num_stages() != stages as usize {
        return Err(ScheduleError::BadCosts(format!(
            "costs describe {} stages but the program has pp * vpp = {stages}",
            costs.num_stages()
        )));
    }
    if program.ranks.len() != program.pp as usize {
        return Err(ScheduleError::InvalidProgram(format!(
            "{} rank lists for parallel.pp = {}",
            program.ranks.len(),
            program.pp
        )));
    }
    let cells = stages as u64 * m as u64;
    if cells > super::MAX_CELLS {
        return Err(ScheduleError::TooLarge {
            stages: stages as u64,
            microbatches: m,
        });
    }
    check_program(program)?;
    Ok(())
}

/// The deadlock error when some rank could not finish its action list.
fn deadlock(program: &Program, pc: &[usize]) -> Option<ScheduleError> {
    let pp = program.pp as usize;
    let stuck: Vec<usize> = (0..pp)
        .filter(|&r| pc[r] < program.ranks[r].len())
        .collect();
    if !stuck.is_empty() {
        let detail: Vec<String> = stuck
            .iter()
            .take(4)
            .map(|&r| {
                format!(
                    "rank {r} waits at action {} ({})",
                    pc[r], program.ranks[r][pc[r]]
                )
            })
            .collect();
        return Some(ScheduleError::Deadlock(format!(
            "{} of {} ranks cannot proceed: {}",
            stuck.len(),
            pp,
            detail.join("; ")
        )));
    }
    None
}

/// Makespan, idle times, bubble fraction and peak in-flight sets of a finished simulation.
fn summarise(
    program: &Program,
    timeline: Vec<Vec<Span>>,
    free: &[f64],
    busy: Vec<f64>,
) -> Simulation {
    let pp = program.pp as usize;
    let makespan = free.iter().cloned().fold(0.0, f64::max);
    let idle: Vec<f64> = busy.iter().map(|b| makespan - b).collect();
    let max_busy = busy.iter().cloned().fold(0.0, f64::max);
    let bubble_fraction = if max_busy > 0.0 {
        (makespan - max_busy) / max_busy
    } else {
        0.0
    };
    let idle_over_makespan = if makespan > 0.0 {
        idle.iter().sum::<f64>() / (pp as f64 * makespan)
    } else {
        0.0
    };
    let peak_inflight = program.ranks.iter().map(|a| peak_live(a)).collect();
    Simulation {
        timeline,
        makespan,
        busy,
        idle,
        bubble_fraction,
        idle_over_makespan,
        peak_inflight,
    }
}

/// Peak live activation sets of one rank's action list: +1 at each F, -1 after the action
/// that frees them (B, or W for a split backward).
pub fn peak_live(actions: &[super::action::Action]) -> u32 {
    let mut live: i64 = 0;
    let mut peak: i64 = 0;
    for a in actions {
        match a.kind {
            ActionKind::F => {
                live += 1;
                peak = peak.max(live);
            }
            ActionKind::B | ActionKind::W => live -= 1,
            ActionKind::I => {}
        }
    }
    peak.max(0) as u32
}

/// Checks that every (stage, microbatch) has exactly one F and either one B or one I and one
/// W, each on the rank that owns the stage, and that overlapped halves come in pairs.
pub fn check_program(program: &Program) -> Result<(), ScheduleError> {
    let stages = program.num_stages();
    let m = program.microbatches;
    let cells = stages as usize * m as usize;
    // bit 0: F, 1: B, 2: I, 3: W
    let mut seen = vec![0u8; cells];
    for (r, acts) in program.ranks.iter().enumerate() {
        let mut k = 0;
        while k < acts.len() {
            let a = &acts[k];
            if a.stage >= stages || a.microbatch >= m {
                return Err(ScheduleError::InvalidProgram(format!(
                    "rank {r} action {k} {a} is out of range ({stages} stages, {m} microbatches)"
                )));
            }
            let owner = program.rank_of_stage(a.stage);
            if owner as usize != r {
                return Err(ScheduleError::InvalidProgram(format!(
                    "rank {r} action {k} {a} belongs to rank {owner}"
                )));
            }
            match a.overlap {
                Overlap::None => {}
                Overlap::First => {
                    let ok = acts
                        .get(k + 1)
                        .is_some_and(|b| b.overlap == Overlap::Second);
                    if !ok {
                        return Err(ScheduleError::InvalidProgram(format!(
                            "rank {r} action {k} opens an overlapped slot with no second half"
                        )));
                    }
                }
                Overlap::Second => {
                    let ok = k > 0 && acts[k - 1].overlap == Overlap::First;
                    if !ok {
                        return Err(ScheduleError::InvalidProgram(format!(
                            "rank {r} action {k} closes an overlapped slot that was not opened"
                        )));
                    }
                }
            }
            let bit = match a.kind {
                ActionKind::F => 1u8,
                ActionKind::B => 2,
                ActionKind::I => 4,
                ActionKind::W => 8,
            };
            let cell = &mut seen[a.stage as usize * m as usize + a.microbatch as usize];
            if *cell & bit != 0 {
                return Err(ScheduleError::InvalidProgram(format!(
                    "rank {r} action {k} {a} appears twice"
                )));
            }
            *cell |= bit;
            k += 1;
        }
    }
    for (c, &bits) in seen.iter().enumerate() {
        if bits != 0b0011 && bits != 0b1101 {
            let s = c / m as usize;
            let mb = c % m as usize;
            return Err(ScheduleError::InvalidProgram(format!(
                "stage {s} microbatch {mb} needs one F and one B, or one F, one I and one W \
                 (found mask {bits:04b})"
            )));
        }
    }
    Ok(())
}
