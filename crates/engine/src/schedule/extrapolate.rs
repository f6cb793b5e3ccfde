//! Long pipelines without long simulations. Once a schedule reaches its steady state, the
//! bottleneck rank never idles again: each further group of pp microbatches adds exactly that
//! rank's busy time per group to the makespan (and to every rank's finish), so the makespan is
//! linear in m. With uneven stages the bottleneck first spends the slack it had in the warm-up,
//! which can take many groups. [`simulate_extrapolated`] therefore simulates m0 and m0 + pp
//! microbatches, and only when the makespan's slope equals the bottleneck's busy rate does it
//! extend the line to m; otherwise it doubles m0 and tries again (falling back to simulating
//! m itself). Peaks of live activation sets saturate before that (GPipe's, which is m, is read
//! off its definition). Tests compare it with full simulations.

use super::simulate::{bubble_fraction, peak_live, play, CheckedProgram};
use super::{Costs, GeneratedProgram, ScheduleError, ScheduleKind};

/// The parts of a simulation the estimate needs, for the full microbatch count.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSummary {
    pub makespan: f64,
    /// When each rank ends its last action.
    pub finish: Vec<f64>,
    /// Compute time per rank.
    pub busy: Vec<f64>,
    pub peak_inflight: Vec<u32>,
    /// (makespan - max busy) / max busy (Megatron's convention).
    pub bubble_fraction: f64,
    /// True when the figures were extended from two shorter simulations.
    pub extrapolated: bool,
}

impl PipelineSummary {
    /// The summary of a full simulation.
    pub fn of(sim: &super::Simulation) -> PipelineSummary {
        summary(sim)
    }
}

/// The summary of `program` played with `costs`: the figures of [`PipelineSummary::of`] over
/// [`super::simulate`], without building the timeline (what the estimate's runs need).
pub fn simulate_summary(
    program: CheckedProgram,
    costs: &Costs,
) -> Result<PipelineSummary, ScheduleError> {
    let [summary] = simulate_summaries(program, [costs])?;
    Ok(summary)
}

/// [`simulate_summary`] for several cost sets, played in one walk of the program (the
/// estimate's run and its bubble split's run with free hops).
pub fn simulate_summaries<const N: usize>(
    program: CheckedProgram,
    costs: [&Costs; N],
) -> Result<[PipelineSummary; N], ScheduleError> {
    let played = play(program, costs, |_, _| {})?;
    let peak_inflight: Vec<u32> = match program.1 {
        Some(order) => order.peak_live.clone(),
        None => program
            .program()
            .ranks
            .iter()
            .map(|a| peak_live(a))
            .collect(),
    };
    let makespan = |p: &super::lanes::Played| p.finish.iter().copied().fold(0.0, f64::max);
    for p in &played {
        let makespan = makespan(p);
        if !(makespan.is_finite() && p.busy.iter().all(|b| b.is_finite())) {
            return Err(ScheduleError::NonFinite { makespan });
        }
    }
    Ok(played.map(|p| PipelineSummary {
        makespan: makespan(&p),
        bubble_fraction: bubble_fraction(makespan(&p), &p.busy),
        finish: p.finish,
        busy: p.busy,
        peak_inflight: peak_inflight.clone(),
        extrapolated: false,
    }))
}

/// [`simulate_summary`] of the program of `kind` for `pp` ranks, `vpp` chunks and `m`
/// microbatches (generated and checked once per thread, [`GeneratedProgram::of`]).
fn summary_of(
    (kind, pp, vpp, m): (ScheduleKind, u32, u32, u32),
    costs: &Costs,
) -> Result<PipelineSummary, ScheduleError> {
    simulate_summary(GeneratedProgram::of(kind, pp, vpp, m)?.checked(), costs)
}

/// True when [`simulate_extrapolated`] would simulate all `m` microbatches itself (so a
/// caller holding the program can simulate it directly).
pub fn simulates_in_full(kind: ScheduleKind, pp: u32, m: u32) -> bool {
    u64::from(m) <= u64::from(base_microbatches(kind, pp, m)) + u64::from(pp)
}

fn summary(sim: &super::Simulation) -> PipelineSummary {
    PipelineSummary {
        makespan: sim.makespan,
        finish: sim
            .timeline
            .iter()
            .map(|t| t.last().map_or(0.0, |s| s.end))
            .collect(),
        busy: sim.busy.clone(),
        peak_inflight: sim.peak_inflight.clone(),
        bubble_fraction: sim.bubble_fraction,
        extrapolated: false,
    }
}

/// The shortest run that is already in steady state, with the same remainder mod pp (so the
/// interleaved schedule's microbatch groups keep their shape).
/// (At most 7 pp, a u32 for any pp a program can hold: [`super::MAX_CELLS`]; it saturates
/// only past that, where generating any program is refused.)
pub fn base_microbatches(kind: ScheduleKind, pp: u32, m: u32) -> u32 {
    let floor = match kind {
        ScheduleKind::ZbV | ScheduleKind::DualPipeV => 6,
        _ => 4,
    };
    pp.saturating_mul(floor)
        .saturating_add(m.checked_rem(pp).unwrap_or(0))
}

/// Simulates `kind` over `m` microbatches with `costs`, extrapolating long runs.
pub fn simulate_extrapolated(
    kind: ScheduleKind,
    pp: u32,
    vpp: u32,
    m: u32,
    costs: &Costs,
) -> Result<PipelineSummary, ScheduleError> {
    let cells = |m: u32| u64::from(pp) * u64::from(vpp) * u64::from(m);
    if cells(1) > super::MAX_CELLS {
        return Err(ScheduleError::TooLarge {
            stages: cells(1),
            microbatches: m,
        });
    }
    // From here pp x vpp <= 2^22: every count below (7 pp, 2 m0 + pp with m0 held under
    // MAX_CELLS) fits a u32.
    let m0 = base_microbatches(kind, pp, m);
    if simulates_in_full(kind, pp, m) {
        return summary_of((kind, pp, vpp, m), costs);
    }
    let mut m0 = m0;
    let mut last_slope: Option<f64> = None;
    let (a, b) = loop {
        if m0 + pp >= m {
            return summary_of((kind, pp, vpp, m), costs);
        }
        let a = summary_of((kind, pp, vpp, m0), costs)?;
        let b = summary_of((kind, pp, vpp, m0 + pp), costs)?;
        let next = 2 * m0 - m0 % pp + m % pp;
        // Bounded memory: when the next try would exceed the program limit, the line through
        // the two longest runs that fit is the estimate (the slack left is at most the
        // warm-up's, already spent over m0 microbatches).
        if cells(next + pp) > super::MAX_CELLS && next + pp < m {
            break (a, b);
        }
        let slope = b.makespan - a.makespan;
        let bottleneck = a
            .busy
            .iter()
            .zip(&b.busy)
            .map(|(x, y)| y - x)
            .fold(0.0, f64::max);
        if (slope - bottleneck).abs() <= 1e-9 * bottleneck.max(f64::MIN_POSITIVE) {
            break (a, b);
        }
        // GPipe runs every forward, then every backward: past the fill each phase is linear in
        // m, so the same slope at two run lengths a doubling apart is the steady state,
        // although no single rank is busy all the time when the slowest forward and the
        // slowest backward are on different ranks (it pays both maxima per microbatch).
        // Other schedules interleave F and B, and their slope can repeat before they settle.
        let same =
            last_slope.is_some_and(|s| (slope - s).abs() <= 1e-9 * slope.max(f64::MIN_POSITIVE));
        if kind == ScheduleKind::Gpipe && same {
            break (a, b);
        }
        last_slope = Some(slope);
        m0 = next;
    };
    let groups = (m - m0) as f64 / pp as f64;
    let extend = |x: f64, y: f64| x + (y - x) * groups;
    let finish: Vec<f64> = a
        .finish
        .iter()
        .zip(&b.finish)
        .map(|(x, y)| extend(*x, *y))
        .collect();
    let busy: Vec<f64> = a
        .busy
        .iter()
        .zip(&b.busy)
        .map(|(x, y)| extend(*x, *y))
        .collect();
    let makespan = extend(a.makespan, b.makespan);
    let peak_inflight = match kind {
        ScheduleKind::Gpipe => vec![m.saturating_mul(vpp); pp as usize],
        _ => b.peak_inflight,
    };
    Ok(PipelineSummary {
        makespan,
        bubble_fraction: bubble_fraction(makespan, &busy),
        finish,
        busy,
        peak_inflight,
        extrapolated: true,
    })
}
