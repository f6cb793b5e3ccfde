//! Validity of every generated schedule over the grid of the acceptance criteria:
//! pp in 2..=8, vpp in 1..=4 where the schedule allows it, microbatches in pp..=4pp.
//!
//! Everything is checked here from first principles, independently of the library's own
//! program check: the placement of stages on ranks is recomputed from the conventions
//! (interleaved: s mod pp; V shapes: r and 2pp-1-r), inputs are recomputed from the
//! dependency rules, and the simulation is run with uneven per-stage costs and a nonzero hop
//! cost so that a wrong dependency would show.

use parsim::schedule::{
    generate, generate_with, simulate, ActionKind, ComputeAction, Costs, GenerateOptions, Overlap,
    Program, ScheduleError, ScheduleKind, Simulation,
};
use std::collections::HashMap;

const EPS: f64 = 1e-9;

/// vpp values each schedule accepts in the grid.
fn vpps(kind: ScheduleKind) -> Vec<u32> {
    match kind {
        ScheduleKind::Gpipe | ScheduleKind::OneFOneB | ScheduleKind::ZbH1 => vec![1],
        ScheduleKind::Interleaved1F1B => vec![1, 2, 3, 4],
        ScheduleKind::ZbV | ScheduleKind::DualPipeV => vec![2],
    }
}

/// The rank that must run `stage`, from the conventions.
fn expected_rank(kind: ScheduleKind, pp: u32, stage: u32) -> u32 {
    match kind {
        ScheduleKind::ZbV | ScheduleKind::DualPipeV => {
            if stage < pp {
                stage
            } else {
                2 * pp - 1 - stage
            }
        }
        _ => stage % pp,
    }
}

/// Uneven costs: stage s forward 1 + 0.1 s, backward parts differ too, hop 0.05 + 0.01.
fn uneven_costs(stages: u32) -> Costs {
    let n = stages as usize;
    let f: Vec<f64> = (0..n).map(|s| 1.0 + 0.1 * s as f64).collect();
    let i: Vec<f64> = (0..n).map(|s| 1.2 + 0.05 * (s % 3) as f64).collect();
    let w: Vec<f64> = (0..n).map(|s| 0.7 + 0.03 * (s % 2) as f64).collect();
    Costs::from_split(f, i, w, 0.05, vec![0.01; n - 1]).unwrap()
}

fn check(kind: ScheduleKind, program: &Program, sim: &Simulation, costs: &Costs) {
    let pp = program.pp;
    let stages = program.pp * program.vpp;
    let m = program.microbatches;
    let ctx = format!("{kind} pp={pp} vpp={} m={m}", program.vpp);

    // (1) exactly one F, and one B or one I + one W, per (microbatch, stage), on the right rank
    let mut count: HashMap<(ActionKind, u32, u32), u32> = HashMap::new();
    for (r, acts) in program.ranks.iter().enumerate() {
        for a in acts {
            assert!(
                a.stage < stages && a.microbatch < m,
                "{ctx}: out of range {a:?}"
            );
            assert_eq!(
                expected_rank(kind, pp, a.stage),
                r as u32,
                "{ctx}: {a:?} on rank {r}"
            );
            *count.entry((a.kind, a.stage, a.microbatch)).or_default() += 1;
        }
    }
    for s in 0..stages {
        for mb in 0..m {
            let c = |k| count.get(&(k, s, mb)).copied().unwrap_or(0);
            assert_eq!(c(ActionKind::F), 1, "{ctx}: F of stage {s} mb {mb}");
            let full = c(ActionKind::B);
            let split = (c(ActionKind::I), c(ActionKind::W));
            assert!(
                (full == 1 && split == (0, 0)) || (full == 0 && split == (1, 1)),
                "{ctx}: backward of stage {s} mb {mb}: B {full}, I/W {split:?}"
            );
        }
    }
    assert_eq!(count.values().sum::<u32>() as usize, program.num_actions());

    // (2) times: index every end, then check every start against its inputs
    let mut end: HashMap<(ActionKind, u32, u32), f64> = HashMap::new();
    for (acts, spans) in program.ranks.iter().zip(&sim.timeline) {
        assert_eq!(acts.len(), spans.len(), "{ctx}: one span per action");
        for (a, s) in acts.iter().zip(spans) {
            end.insert((a.kind, a.stage, a.microbatch), s.end);
        }
    }
    let hop = |lower: u32, from: u32, to: u32| {
        if expected_rank(kind, pp, from) != expected_rank(kind, pp, to) {
            costs.p2p_latency + costs.hop_transfer[lower as usize]
        } else {
            0.0
        }
    };
    let grad_end = |s: u32, mb: u32| {
        end.get(&(ActionKind::B, s, mb))
            .or(end.get(&(ActionKind::I, s, mb)))
            .copied()
            .unwrap()
    };
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        let mut prev_end = 0.0f64;
        let mut k = 0;
        while k < acts.len() {
            let a: &ComputeAction = &acts[k];
            let sp = spans[k];
            let pair = a.overlap == Overlap::First;
            assert!(
                sp.start >= prev_end - EPS,
                "{ctx}: rank {r} overlaps at {k}"
            );
            let members: Vec<usize> = if pair { vec![k, k + 1] } else { vec![k] };
            let mut dur = 0.0;
            for &j in &members {
                let b = &acts[j];
                assert_eq!(spans[j].start, sp.start, "{ctx}: halves share a start");
                let (s, mb) = (b.stage, b.microbatch);
                let needed = match b.kind {
                    ActionKind::F if s == 0 => 0.0,
                    ActionKind::F => end[&(ActionKind::F, s - 1, mb)] + hop(s - 1, s - 1, s),
                    ActionKind::B | ActionKind::I => {
                        let own = end[&(ActionKind::F, s, mb)];
                        if s + 1 == stages {
                            own
                        } else {
                            own.max(grad_end(s + 1, mb) + hop(s, s + 1, s))
                        }
                    }
                    ActionKind::W => end[&(ActionKind::I, s, mb)],
                };
                assert!(
                    spans[j].start >= needed - EPS,
                    "{ctx}: rank {r} action {j} {b:?} starts at {} before its inputs at {needed}",
                    spans[j].start
                );
                dur += match b.kind {
                    ActionKind::F => costs.forward[s as usize],
                    ActionKind::B => costs.backward[s as usize],
                    ActionKind::I => costs.input_grad[s as usize],
                    ActionKind::W => costs.weight_grad[s as usize],
                };
            }
            let dur = if pair {
                dur * costs.overlap_factor
            } else {
                dur
            };
            assert!(
                (sp.end - sp.start - dur).abs() < 1e-9,
                "{ctx}: rank {r} action {k} lasts {} not {dur}",
                sp.end - sp.start
            );
            prev_end = sp.end;
            k += members.len();
        }
        assert!(prev_end <= sim.makespan + EPS);
    }
}

#[test]
fn every_schedule_is_valid_over_the_grid() {
    let mut checked = 0;
    for &kind in ScheduleKind::ALL {
        for pp in 2..=8u32 {
            for vpp in vpps(kind) {
                for m in pp..=4 * pp {
                    let program = match generate(kind, pp, vpp, m) {
                        Ok(p) => p,
                        Err(e) => {
                            // Only the documented rules may reject a grid point.
                            match (&kind, &e) {
                                (
                                    ScheduleKind::Interleaved1F1B,
                                    ScheduleError::InterleavedRemainder { .. },
                                ) => assert!(vpp > 1 && m % pp != 0, "{e}"),
                                (
                                    ScheduleKind::DualPipeV,
                                    ScheduleError::DualPipeTooFewMicrobatches { .. },
                                ) => assert!(m < 2 * pp, "{e}"),
                                _ => panic!("{kind} pp={pp} vpp={vpp} m={m}: {e}"),
                            }
                            continue;
                        }
                    };
                    let costs = uneven_costs(pp * vpp);
                    let sim = simulate(&program, &costs)
                        .unwrap_or_else(|e| panic!("{kind} pp={pp} vpp={vpp} m={m}: {e}"));
                    check(kind, &program, &sim, &costs);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 700, "grid too small: {checked}");
}

/// Megatron-LM runs microbatch counts that are not a multiple of pp when the group size N
/// allows it (pp <= N <= m, m % N == 0 or >= pp): every such m in the grid is generated with
/// the smallest valid N and must be valid too.
#[test]
fn interleaved_runs_non_multiples_with_a_valid_group_size() {
    for pp in 2..=8u32 {
        for vpp in 2..=4u32 {
            for m in pp..=4 * pp {
                if m % pp == 0 {
                    continue;
                }
                let n = (pp..=m)
                    .find(|n| m % n == 0 || m % n >= pp)
                    .expect("N = m always works");
                let opts = GenerateOptions {
                    microbatch_group_size: Some(n),
                };
                let program =
                    generate_with(ScheduleKind::Interleaved1F1B, pp, vpp, m, &opts).unwrap();
                let costs = uneven_costs(pp * vpp);
                let sim = simulate(&program, &costs).unwrap();
                check(ScheduleKind::Interleaved1F1B, &program, &sim, &costs);
            }
        }
    }
}

#[test]
fn overlap_factor_shortens_dualpipe_slots_and_stays_valid() {
    let program = generate(ScheduleKind::DualPipeV, 4, 2, 12).unwrap();
    let costs = uneven_costs(8).with_overlap_factor(0.6).unwrap();
    let sim = simulate(&program, &costs).unwrap();
    check(ScheduleKind::DualPipeV, &program, &sim, &costs);
    let full = simulate(&program, &uneven_costs(8)).unwrap();
    assert!(sim.makespan < full.makespan);
}

#[test]
fn small_microbatch_counts_below_pp_do_not_deadlock() {
    for &kind in &[
        ScheduleKind::Gpipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbV,
    ] {
        let vpp = if kind == ScheduleKind::ZbV { 2 } else { 1 };
        for pp in 2..=6u32 {
            for m in 1..pp {
                let program = generate(kind, pp, vpp, m).unwrap();
                let costs = uneven_costs(pp * vpp);
                let sim = simulate(&program, &costs).unwrap();
                check(kind, &program, &sim, &costs);
            }
        }
    }
}
