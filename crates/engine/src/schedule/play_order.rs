//! A checked program's play order, compiled once: whether an action can start depends on
//! which of its inputs exist, never on when, so the order in which the simulator's parking
//! walk meets the slots holds for every cost set. Each action of that order is kept with where
//! its duration, its inputs' ends and their hops are found and where its own end goes; a
//! program played many times (the estimate's, a search's) then plays straight down the list,
//! with no parking, waking or input lookups.

use super::action::{ActionKind, Overlap, Program};
use super::costs::Costs;
use super::lanes::{max, played, plus, spans, stage_lanes, Played, Span, FROM_AFTER, FROM_BEFORE};

/// The end that is always 0 (the input a first-stage forward does not have).
const ZERO: u32 = 0;
/// The hop of an input that pays none: the first stage's forward input hop, always 0
/// ([`super::lanes::StageLanes::hop`], stage 0).
const NO_HOP: u32 = FROM_BEFORE as u32;
/// The end nobody reads (a W's).
const SINK: u32 = 1;
/// Ends before the cells': [`ZERO`] and [`SINK`].
const RESERVED: u32 = 2;

/// One action as the compiled play runs it. Ends are numbered [`RESERVED`] + cell for
/// forwards and [`RESERVED`] + cells + cell for input gradients (B or I); durations
/// stage x 4 + kind slot and hops stage x 2 + [`super::lanes::StageLanes::hop`]'s slot, of the play's
/// [`stage_lanes`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    rank: u32,
    /// The first half of an overlapped slot: the next step is its second half.
    pair: bool,
    duration: u32,
    out: u32,
    input: [u32; 2],
    hop: [u32; 2],
}

/// The order in which a checked program's slots can be played, compiled ([`Step`]): every
/// input of a slot is produced by a slot before it. Kept with it, each rank's peak of live
/// activation sets ([`super::peak_live`]) and, for a rank of whole passes,
/// [`super::whole_passes_sets`]' answer: plays and memory walks of the program read them here.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayOrder {
    steps: Vec<Step>,
    pub(super) peak_live: Vec<u32>,
    pub(super) whole_sets: Vec<Option<u32>>,
}

impl PlayOrder {
    /// The order a parking walk met the slots of `program` in (each entry a rank and the
    /// index of an action, every action once), compiled, with each rank's peak of live sets
    /// and, for a rank of whole passes, its most live sets.
    pub(super) fn compile(
        program: &Program,
        walked: &[(u32, u32)],
        peak_live: Vec<u32>,
        whole_sets: Vec<Option<u32>>,
    ) -> PlayOrder {
        let steps = walked
            .iter()
            .map(|&(r, k)| {
                let a = &program.ranks[r as usize][k as usize];
                step(program, r, a.kind, a.stage, a.microbatch, a.overlap)
            })
            .collect();
        PlayOrder {
            steps,
            peak_live,
            whole_sets,
        }
    }

    /// Plays the program this order was compiled from (`program`) with each cost set in its
    /// lane, handing each action's spans to `record` as the simulator's walk does, to the bit.
    pub(super) fn play<const N: usize>(
        &self,
        program: &Program,
        costs: [&Costs; N],
        mut record: impl FnMut(usize, [Span; N]),
    ) -> [Played; N] {
        let stages = program.num_stages();
        let pp = program.pp as usize;
        // Flat tables, indexed as the steps are compiled (stage x 4 + kind slot, stage x 2 +
        // hop slot).
        let lanes = stage_lanes(program, costs);
        let durations: Vec<[f64; N]> = lanes.iter().flat_map(|l| l.duration).collect();
        let hops: Vec<[f64; N]> = lanes.iter().flat_map(|l| l.hop).collect();
        let overlap_factor: [f64; N] = costs.map(|c| c.overlap_factor);
        let cells = stages as usize * program.microbatches as usize;
        let mut ends = vec![[0.0f64; N]; RESERVED as usize + 2 * cells];
        let mut free = vec![[0.0f64; N]; pp];
        let mut busy = vec![[0.0f64; N]; pp];
        let ready = |ends: &[[f64; N]], a: &Step, t0: [f64; N]| {
            let t0 = max(t0, plus(ends[a.input[0] as usize], hops[a.hop[0] as usize]));
            max(t0, plus(ends[a.input[1] as usize], hops[a.hop[1] as usize]))
        };
        let steps = &self.steps;
        let mut i = 0;
        while i < steps.len() {
            let a = &steps[i];
            let r = a.rank as usize;
            let t0 = ready(&ends, a, free[r]);
            if a.pair {
                let b = &steps[i + 1];
                let t0 = ready(&ends, b, t0);
                let both = plus(
                    durations[a.duration as usize],
                    durations[b.duration as usize],
                );
                let dur: [f64; N] = std::array::from_fn(|l| overlap_factor[l] * both[l]);
                let t1 = plus(t0, dur);
                free[r] = t1;
                busy[r] = plus(busy[r], dur);
                for s in [a, b] {
                    record(r, spans(t0, t1));
                    ends[s.out as usize] = t1;
                }
                i += 2;
            } else {
                let dur = durations[a.duration as usize];
                let t1 = plus(t0, dur);
                free[r] = t1;
                busy[r] = plus(busy[r], dur);
                record(r, spans(t0, t1));
                ends[a.out as usize] = t1;
                i += 1;
            }
        }
        played(&free, &busy)
    }
}

/// The compiled [`Step`] of an action of `program` on `rank`.
fn step(
    program: &Program,
    rank: u32,
    kind: ActionKind,
    stage: u32,
    microbatch: u32,
    overlap: Overlap,
) -> Step {
    let stages = program.num_stages();
    let cells = stages * program.microbatches;
    let cell = |s: u32| s * program.microbatches + microbatch;
    let f_end = |s: u32| RESERVED + cell(s);
    let g_end = |s: u32| RESERVED + cells + cell(s);
    let (slot, out, input, hop) = match kind {
        ActionKind::F if stage == 0 => (0, f_end(stage), [ZERO; 2], [NO_HOP; 2]),
        ActionKind::F => {
            let from_before = 2 * stage + FROM_BEFORE as u32;
            (
                0,
                f_end(stage),
                [f_end(stage - 1), ZERO],
                [from_before, NO_HOP],
            )
        }
        ActionKind::B | ActionKind::I => {
            let slot = if kind == ActionKind::B { 1 } else { 2 };
            let above = if stage + 1 == stages {
                (ZERO, NO_HOP)
            } else {
                (g_end(stage + 1), 2 * stage + FROM_AFTER as u32)
            };
            (
                slot,
                g_end(stage),
                [f_end(stage), above.0],
                [NO_HOP, above.1],
            )
        }
        ActionKind::W => (3, SINK, [g_end(stage), ZERO], [NO_HOP; 2]),
    };
    Step {
        rank,
        pair: overlap == Overlap::First,
        duration: stage * 4 + slot,
        out,
        input,
        hop,
    }
}
