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

use super::action::{ActionKind, ComputeAction, Overlap, Program};
use super::costs::Costs;
use super::error::ScheduleError;
pub use super::lanes::Span;
use super::lanes::{
    kind_slot, max, played, plus, spans, stage_lanes, Played, StageLanes, FROM_AFTER, FROM_BEFORE,
};
use super::play_order::PlayOrder;

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

/// End times of every (stage, microbatch) cell's forward and input-gradient backward, per
/// lane; lane 0's NaN marks an action not yet run (all lanes run together).
struct Ends<const N: usize> {
    microbatches: usize,
    f: Vec<[f64; N]>,
    g: Vec<[f64; N]>,
}

impl<const N: usize> Ends<N> {
    fn new(stages: u32, microbatches: u32) -> Self {
        let cells = stages as usize * microbatches as usize;
        Ends {
            microbatches: microbatches as usize,
            f: vec![[NOT_DONE; N]; cells],
            g: vec![[NOT_DONE; N]; cells],
        }
    }

    fn cell(&self, stage: u32, microbatch: u32) -> usize {
        stage as usize * self.microbatches + microbatch as usize
    }

    /// The time at which the inputs of `a` exist, or the first one missing.
    fn ready(&self, a: &ComputeAction, lanes: &[StageLanes<N>]) -> Result<[f64; N], Input> {
        let exists = |t: &[f64; N]| N == 0 || !t[0].is_nan();
        let s = a.stage;
        match a.kind {
            ActionKind::F => {
                if s == 0 {
                    return Ok([0.0; N]);
                }
                let cell = self.cell(s - 1, a.microbatch);
                let t = self.f[cell];
                if !exists(&t) {
                    return Err(Input::Forward(cell));
                }
                Ok(plus(t, lanes[s as usize].hop[FROM_BEFORE]))
            }
            ActionKind::B | ActionKind::I => {
                let cell = self.cell(s, a.microbatch);
                let own = self.f[cell];
                if !exists(&own) {
                    return Err(Input::Forward(cell));
                }
                if s as usize + 1 == lanes.len() {
                    return Ok(own);
                }
                let above = self.cell(s + 1, a.microbatch);
                let t = self.g[above];
                if !exists(&t) {
                    return Err(Input::Gradient(above));
                }
                Ok(max(own, plus(t, lanes[s as usize].hop[FROM_AFTER])))
            }
            ActionKind::W => {
                let cell = self.cell(s, a.microbatch);
                let t = self.g[cell];
                if !exists(&t) {
                    return Err(Input::Gradient(cell));
                }
                Ok(t)
            }
        }
    }
}

impl<const N: usize> Ends<N> {
    /// Records that `a` ended at `t1`; returns the input that end is to the next action that
    /// needs it (on stage s + 1 for a forward, s - 1 for a gradient; none for a W or past
    /// the ends of the pipeline).
    fn store(&mut self, a: &ComputeAction, t1: [f64; N], stages: u32) -> Option<Input> {
        let s = a.stage;
        let cell = self.cell(s, a.microbatch);
        match a.kind {
            ActionKind::F => {
                self.f[cell] = t1;
                (s + 1 < stages).then_some(Input::Forward(cell))
            }
            ActionKind::B | ActionKind::I => {
                self.g[cell] = t1;
                (s > 0).then_some(Input::Gradient(cell))
            }
            ActionKind::W => None,
        }
    }
}

/// An input an action waits for: the end of the forward (F) or of the input-gradient
/// backward (B or I) of a cell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Input {
    Forward(usize),
    Gradient(usize),
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
    if let Some(order) = checked.1 {
        return Ok(order.play(program, costs, record));
    }
    let stages = program.num_stages();
    let pp = program.pp as usize;
    let lanes = stage_lanes(program, costs);
    let overlap_factor: [f64; N] = costs.map(|c| c.overlap_factor);
    let mut ends = Ends::<N>::new(stages, program.microbatches);
    let mut pc = vec![0usize; pp];
    let mut free = vec![[0.0f64; N]; pp];
    let mut busy = vec![[0.0f64; N]; pp];
    // Per rank: the input it is parked on, if any. A rank is woken only by the end of that
    // input (on another rank), so it is not retried for actions that cannot help it.
    let mut parked: Vec<Option<Input>> = vec![None; pp];
    let mut stack: Vec<usize> = (0..pp).rev().collect();

    while let Some(r) = stack.pop() {
        let acts = &program.ranks[r];
        let mut k = pc[r];
        let (mut rank_free, mut rank_busy) = (free[r], busy[r]);
        while k < acts.len() {
            let a = &acts[k];
            let n = if a.overlap == Overlap::First { 2 } else { 1 };
            let slot = &acts[k..k + n];
            // The slot starts when the rank is free and every input of its actions exists;
            // the first input missing parks the rank.
            let mut t0 = rank_free;
            let mut blocked = None;
            for b in slot {
                match ends.ready(b, &lanes) {
                    Ok(t) => t0 = max(t0, t),
                    Err(input) => {
                        blocked = Some(input);
                        break;
                    }
                }
            }
            if blocked.is_some() {
                parked[r] = blocked;
                break;
            }
            let dur = slot_duration(slot, &lanes, overlap_factor);
            let t1 = plus(t0, dur);
            rank_free = t1;
            rank_busy = plus(rank_busy, dur);
            for b in slot {
                record(r, spans(t0, t1));
                // The end just produced, and the rank that consumes it.
                let wake = ends.store(b, t1, stages).map(|input| {
                    let consumer = match input {
                        Input::Forward(_) => b.stage as usize + 1,
                        Input::Gradient(_) => b.stage as usize - 1,
                    };
                    (lanes[consumer].owner, input)
                });
                if let Some((q, input)) = wake {
                    let q = q as usize;
                    if q != r && parked[q] == Some(input) {
                        parked[q] = None;
                        stack.push(q);
                    }
                }
            }
            k += n;
        }
        pc[r] = k;
        free[r] = rank_free;
        busy[r] = rank_busy;
    }

    if let Some(err) = deadlock(program, &pc) {
        return Err(err);
    }
    Ok(played(&free, &busy))
}

/// How long a slot (one action, or the two halves of an overlapped DualPipe-V slot at the
/// overlap factor) takes, per lane.
fn slot_duration<const N: usize>(
    slot: &[ComputeAction],
    lanes: &[StageLanes<N>],
    overlap_factor: [f64; N],
) -> [f64; N] {
    let duration = |b: &ComputeAction| lanes[b.stage as usize].duration[kind_slot(b.kind)];
    match slot {
        [a, b] => {
            let both = plus(duration(a), duration(b));
            std::array::from_fn(|i| overlap_factor[i] * both[i])
        }
        _ => duration(&slot[0]),
    }
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
pub struct CheckedProgram<'a>(pub(super) &'a Program, pub(super) Option<&'a PlayOrder>);

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
        Ok(CheckedProgram(program, None))
    }

    /// A program that passed [`CheckedProgram::new`] before (kept by
    /// [`super::GeneratedProgram`]).
    pub(super) fn already_checked(program: &'a Program, order: Option<&'a PlayOrder>) -> Self {
        CheckedProgram(program, order)
    }

    /// The program itself.
    pub fn program(&self) -> &'a Program {
        self.0
    }
}

impl PlayOrder {
    /// The order of `checked`'s slots as the parking walk of [`play`] meets them, compiled
    /// ([`PlayOrder::compile`]). Errors: a deadlock.
    pub fn of(checked: CheckedProgram) -> Result<PlayOrder, ScheduleError> {
        let program = checked.program();
        let stages = program.num_stages();
        let zeros = vec![0.0; stages as usize];
        let free = Costs::from_split(
            zeros.clone(),
            zeros.clone(),
            zeros,
            0.0,
            vec![0.0; stages.saturating_sub(1) as usize],
        )?;
        let mut walked = Vec::with_capacity(program.num_actions());
        let mut next = vec![0u32; program.ranks.len()];
        play(CheckedProgram(program, None), [&free], |r, _| {
            walked.push((r as u32, next[r]));
            next[r] += 1;
        })?;
        Ok(PlayOrder::compile(
            program,
            &walked,
            program.ranks.iter().map(|a| peak_live(a)).collect(),
            program.ranks.iter().map(|a| whole_passes_sets(a)).collect(),
        ))
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

/// The most activation sets live at once on a rank whose actions are only whole forwards
/// and backwards of one stage, each forward's set freed by a later backward (GPipe's and
/// 1F1B's ranks); `None` for any other list.
pub fn whole_passes_sets(actions: &[ComputeAction]) -> Option<u32> {
    let stage = actions.first().map_or(0, |a| a.stage);
    let (mut live, mut most) = (0u32, 0u32);
    for a in actions {
        if a.stage != stage {
            return None;
        }
        match a.kind {
            ActionKind::F => {
                live += 1;
                most = most.max(live);
            }
            ActionKind::B if live > 0 => live -= 1,
            _ => return None,
        }
    }
    (live == 0).then_some(most)
}

/// Peak live activation sets of one rank's action list: +1 at each F, -1 after the action
/// that frees them (B, or W for a split backward).
pub fn peak_live(actions: &[super::action::ComputeAction]) -> u32 {
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
    let owners: Vec<u32> = (0..stages).map(|s| program.rank_of_stage(s)).collect();
    for (r, acts) in program.ranks.iter().enumerate() {
        for (k, a) in acts.iter().enumerate() {
            if a.stage >= stages || a.microbatch >= m {
                return Err(ScheduleError::InvalidProgram(format!(
                    "rank {r} action {k} {a} is out of range ({stages} stages, {m} microbatches)"
                )));
            }
            let owner = owners[a.stage as usize];
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
            let bit = 1u8 << kind_slot(a.kind);
            let cell = &mut seen[a.stage as usize * m as usize + a.microbatch as usize];
            if *cell & bit != 0 {
                return Err(ScheduleError::InvalidProgram(format!(
                    "rank {r} action {k} {a} appears twice"
                )));
            }
            *cell |= bit;
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
