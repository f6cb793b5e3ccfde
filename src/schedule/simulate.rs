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
    let checked = CheckedProgram::new(program)?;
    let mut timeline: Vec<Vec<Span>> = program
        .ranks
        .iter()
        .map(|acts| Vec::with_capacity(acts.len()))
        .collect();
    let [played] = play(checked, [costs], |r, [span]| timeline[r].push(span))?;
    let sim = summarise(program, timeline, &played.finish, played.busy);
    if !(sim.makespan.is_finite() && sim.busy.iter().all(|b| b.is_finite())) {
        return Err(ScheduleError::NonFinite {
            makespan: sim.makespan,
        });
    }
    Ok(sim)
}

/// What one play of a program leaves per rank: when its last action ends and its compute time.
pub(super) struct Played {
    pub finish: Vec<f64>,
    pub busy: Vec<f64>,
}

/// Plays `program` once per cost set, handing each action's spans to `record` (rank, one span
/// per cost set): the simulator itself, shared by [`simulate`] (which keeps the timeline) and
/// the summary-only runs of the estimate (which do not). Whether an action can start depends
/// only on which of its inputs exist, never on when, so the walk is the same for every cost
/// set: N sets are played in one walk, each in its own lane. Errors as [`simulate`], but for
/// non-finite times.
pub(super) fn play<const N: usize>(
    checked: CheckedProgram,
    costs: [&Costs; N],
    mut record: impl FnMut(usize, [Span; N]),
) -> Result<[Played; N], ScheduleError> {
    let program = checked.program();
    for c in costs {
        check_costs(program, c)?;
    }
    let stages = program.num_stages();
    let m = program.microbatches;
    let cells = stages as usize * m as usize;
    let pp = program.pp as usize;
    let idx = |s: u32, mb: u32| s as usize * m as usize + mb as usize;
    let lanes = |f: &dyn Fn(&Costs) -> f64| -> [f64; N] { std::array::from_fn(|i| f(costs[i])) };
    // End times per lane; lane 0's NaN marks an action not yet run (all lanes run together).
    let mut f_end = vec![[NOT_DONE; N]; cells];
    let mut g_end = vec![[NOT_DONE; N]; cells];

    let mut pc = vec![0usize; pp];
    let mut free = vec![[0.0f64; N]; pp];
    let mut busy = vec![[0.0f64; N]; pp];
    let mut parked = vec![false; pp];
    let mut stack: Vec<usize> = (0..pp).rev().collect();

    // Per stage: its rank, and the hop its forward input (from s - 1) and its backward input
    // (from s + 1) pay when that neighbour is on another rank. A checked program runs every
    // action on its stage's rank, so these do not depend on who asks.
    let owner: Vec<u32> = (0..stages)
        .map(|s| rank_of_stage(program.placement, program.pp, s))
        .collect();
    let crossing = |a: u32, b: u32, lower: u32| -> [f64; N] {
        if owner[a as usize] != owner[b as usize] {
            lanes(&|c| c.hop(lower))
        } else {
            [0.0; N]
        }
    };
    let f_hop: Vec<[f64; N]> = (0..stages)
        .map(|s| {
            if s == 0 {
                [0.0; N]
            } else {
                crossing(s - 1, s, s - 1)
            }
        })
        .collect();
    let b_hop: Vec<[f64; N]> = (0..stages)
        .map(|s| {
            if s + 1 == stages {
                [0.0; N]
            } else {
                crossing(s + 1, s, s)
            }
        })
        .collect();
    let plus = |a: [f64; N], b: [f64; N]| -> [f64; N] { std::array::from_fn(|i| a[i] + b[i]) };
    let max = |a: [f64; N], b: [f64; N]| -> [f64; N] { std::array::from_fn(|i| a[i].max(b[i])) };

    // Time at which the inputs of action `a` exist, or None if one is missing.
    let ready =
        |a: &super::action::Action, f_end: &[[f64; N]], g_end: &[[f64; N]]| -> Option<[f64; N]> {
            let s = a.stage;
            let mb = a.microbatch;
            let exists = |t: &[f64; N]| N == 0 || !t[0].is_nan();
            match a.kind {
                ActionKind::F => {
                    if s == 0 {
                        return Some([0.0; N]);
                    }
                    let t = f_end[idx(s - 1, mb)];
                    exists(&t).then(|| plus(t, f_hop[s as usize]))
                }
                ActionKind::B | ActionKind::I => {
                    let own = f_end[idx(s, mb)];
                    if !exists(&own) {
                        return None;
                    }
                    if s + 1 == stages {
                        return Some(own);
                    }
                    let t = g_end[idx(s + 1, mb)];
                    exists(&t).then(|| max(own, plus(t, b_hop[s as usize])))
                }
                ActionKind::W => {
                    let t = g_end[idx(s, mb)];
                    exists(&t).then_some(t)
                }
            }
        };
    let duration = |a: &super::action::Action| -> [f64; N] {
        let s = a.stage as usize;
        match a.kind {
            ActionKind::F => lanes(&|c| c.forward[s]),
            ActionKind::B => lanes(&|c| c.backward[s]),
            ActionKind::I => lanes(&|c| c.input_grad[s]),
            ActionKind::W => lanes(&|c| c.weight_grad[s]),
        }
    };

    while let Some(r) = stack.pop() {
        let acts = &program.ranks[r];
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
                match ready(b, &f_end, &g_end) {
                    Some(t) => t0 = max(t0, t),
                    None => blocked = true,
                }
            }
            if blocked {
                parked[r] = true;
                break;
            }
            let dur = if n == 2 {
                let both = plus(duration(a), duration(&acts[k + 1]));
                std::array::from_fn(|i| costs[i].overlap_factor * both[i])
            } else {
                duration(a)
            };
            let t1 = plus(t0, dur);
            free[r] = t1;
            busy[r] = plus(busy[r], dur);
            for b in &acts[k..k + n] {
                record(
                    r,
                    std::array::from_fn(|i| Span {
                        start: t0[i],
                        end: t1[i],
                    }),
                );
                let s = b.stage;
                let cell = idx(s, b.microbatch);
                let wake = match b.kind {
                    ActionKind::F => {
                        f_end[cell] = t1;
                        (s + 1 < stages).then(|| owner[s as usize + 1])
                    }
                    ActionKind::B | ActionKind::I => {
                        g_end[cell] = t1;
                        (s > 0).then(|| owner[s as usize - 1])
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
    Ok(std::array::from_fn(|i| Played {
        finish: free.iter().map(|t| t[i]).collect(),
        busy: busy.iter().map(|t| t[i]).collect(),
    }))
}

/// The program and costs describe the same stages, and the cells fit the simulator's indices.
fn check_costs(program: &Program, costs: &Costs) -> Result<(), ScheduleError> {
    costs.validate()?;
    let stages = program.num_stages();
    if costs.num_stages() != stages as usize {
        return Err(ScheduleError::BadCosts(format!(
            "costs describe {} stages but the program has pp * vpp = {stages}",
            costs.num_stages()
        )));
    }
    Ok(())
}

/// A program that passed every check the simulator needs (one list per rank, cells within
/// [`super::MAX_CELLS`], [`check_program`]): plays of it skip them, so the estimate, which
/// plays one program with several cost sets, checks it once.
#[derive(Debug, Clone, Copy)]
pub struct CheckedProgram<'a>(&'a Program);

impl<'a> CheckedProgram<'a> {
    /// Checks `program`. Errors: a rank count other than pp, too many cells, or an invalid
    /// program (missing, duplicated or misplaced actions).
    pub fn new(program: &'a Program) -> Result<Self, ScheduleError> {
        if program.ranks.len() != program.pp as usize {
            return Err(ScheduleError::InvalidProgram(format!(
                "{} rank lists for parallel.pp = {}",
                program.ranks.len(),
                program.pp
            )));
        }
        let stages = program.num_stages();
        let m = program.microbatches;
        if stages as u64 * m as u64 > super::MAX_CELLS {
            return Err(ScheduleError::TooLarge {
                stages: stages as u64,
                microbatches: m,
            });
        }
        check_program(program)?;
        Ok(CheckedProgram(program))
    }

    /// The program itself.
    pub fn program(&self) -> &'a Program {
        self.0
    }
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
    let bubble_fraction = bubble_fraction(makespan, &busy);
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

/// `(makespan - max busy) / max busy`, Megatron's bubble convention (Narayanan et al. 2021);
/// 0 when no rank computes.
pub(super) fn bubble_fraction(makespan: f64, busy: &[f64]) -> f64 {
    let max_busy = busy.iter().copied().fold(0.0, f64::max);
    if max_busy > 0.0 {
        (makespan - max_busy) / max_busy
    } else {
        0.0
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
