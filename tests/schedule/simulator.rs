//! The simulator on hand-built programs: deadlocks and malformed programs are reported as
//! errors (never a hang or a panic), timing follows the dataflow rules, and random sizes
//! never break generation or simulation.

use parsim::schedule::{
    generate, natural_vpp, simulate, simulate_summaries, simulate_summary, ActionKind,
    CheckedProgram, ComputeAction, Costs, PipelineSummary, Placement, Program, ScheduleError,
    ScheduleKind,
};
use proptest::prelude::*;

fn program(pp: u32, m: u32, ranks: Vec<Vec<ComputeAction>>) -> Program {
    Program {
        kind: ScheduleKind::OneFOneB,
        pp,
        vpp: 1,
        microbatches: m,
        placement: Placement::Loop,
        ranks,
    }
}

fn a(kind: ActionKind, stage: u32, mb: u32) -> ComputeAction {
    ComputeAction::new(kind, stage, mb)
}

#[test]
fn cross_rank_cycle_is_a_deadlock() {
    use ActionKind::*;
    // rank 1 wants B(1, 0) before it has run F(1, 0): it waits for itself forever, and rank 0
    // waits for rank 1's gradient.
    let p = program(
        2,
        1,
        vec![vec![a(F, 0, 0), a(B, 0, 0)], vec![a(B, 1, 0), a(F, 1, 0)]],
    );
    let costs = Costs::uniform(2, 1, 1.0, 1.0, None, 0.0).unwrap();
    match simulate(&p, &costs) {
        Err(ScheduleError::Deadlock(msg)) => assert!(msg.contains("rank 1"), "{msg}"),
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

#[test]
fn only_true_cycles_deadlock() {
    use ActionKind::*;
    let costs = Costs::uniform(2, 1, 1.0, 1.0, None, 0.0).unwrap();
    // Backwards in different microbatch orders on the two ranks: rank 0 waits a while for
    // B(1, 1), but rank 1 gets there without needing rank 0, so this is no deadlock.
    let p = program(
        2,
        2,
        vec![
            vec![a(F, 0, 0), a(F, 0, 1), a(B, 0, 1), a(B, 0, 0)],
            vec![a(F, 1, 0), a(B, 1, 0), a(F, 1, 1), a(B, 1, 1)],
        ],
    );
    assert!(simulate(&p, &costs).is_ok());
    // Rank 1 starts with F(1, 1), which needs F(0, 1); rank 0 runs that only after B(0, 0),
    // which needs B(1, 0), which rank 1 runs last: a cycle.
    let p = program(
        2,
        2,
        vec![
            vec![a(F, 0, 0), a(B, 0, 0), a(F, 0, 1), a(B, 0, 1)],
            vec![a(F, 1, 1), a(B, 1, 1), a(F, 1, 0), a(B, 1, 0)],
        ],
    );
    assert!(matches!(
        simulate(&p, &costs),
        Err(ScheduleError::Deadlock(_))
    ));
}

#[test]
fn malformed_programs_are_rejected() {
    use ActionKind::*;
    let costs = Costs::uniform(2, 1, 1.0, 1.0, None, 0.0).unwrap();
    // missing backward
    let p = program(2, 1, vec![vec![a(F, 0, 0), a(B, 0, 0)], vec![a(F, 1, 0)]]);
    assert!(matches!(
        simulate(&p, &costs),
        Err(ScheduleError::InvalidProgram(_))
    ));
    // stage on the wrong rank
    let p = program(
        2,
        1,
        vec![vec![a(F, 1, 0), a(B, 1, 0)], vec![a(F, 0, 0), a(B, 0, 0)]],
    );
    assert!(matches!(
        simulate(&p, &costs),
        Err(ScheduleError::InvalidProgram(_))
    ));
    // duplicated forward
    let p = program(
        2,
        1,
        vec![
            vec![a(F, 0, 0), a(F, 0, 0), a(B, 0, 0)],
            vec![a(F, 1, 0), a(B, 1, 0)],
        ],
    );
    assert!(matches!(
        simulate(&p, &costs),
        Err(ScheduleError::InvalidProgram(_))
    ));
    // costs for the wrong number of stages
    let p = generate(ScheduleKind::OneFOneB, 2, 1, 2).unwrap();
    let wrong = Costs::uniform(3, 1, 1.0, 1.0, None, 0.0).unwrap();
    assert!(matches!(
        simulate(&p, &wrong),
        Err(ScheduleError::BadCosts(_))
    ));
}

#[test]
fn bad_costs_are_rejected() {
    assert!(Costs::uniform(2, 1, f64::NAN, 1.0, None, 0.0).is_err());
    assert!(Costs::uniform(2, 1, 1.0, -1.0, None, 0.0).is_err());
    assert!(Costs::uniform(2, 1, 1.0, 1.0, None, f64::INFINITY).is_err());
    let c = Costs::uniform(2, 1, 1.0, 1.0, None, 0.0).unwrap();
    assert!(c.clone().with_overlap_factor(0.0).is_err());
    assert!(c.with_overlap_factor(1.5).is_err());
}

/// Two ranks, one microbatch, by hand: F on rank 0 [0,1), hop 0.5 + 0.25, F on rank 1
/// [1.75, 3.75), B on rank 1 [3.75, 6.75), hop, B on rank 0 [7.5, 9.5).
#[test]
fn hop_costs_and_per_stage_durations_are_charged() {
    let p = generate(ScheduleKind::OneFOneB, 2, 1, 1).unwrap();
    let c = Costs::from_unsplit(vec![1.0, 2.0], vec![2.0, 3.0], 0.5, vec![0.25]).unwrap();
    let s = simulate(&p, &c).unwrap();
    let r0 = &s.timeline[0];
    let r1 = &s.timeline[1];
    assert_eq!((r0[0].start, r0[0].end), (0.0, 1.0));
    assert_eq!((r1[0].start, r1[0].end), (1.75, 3.75));
    assert_eq!((r1[1].start, r1[1].end), (3.75, 6.75));
    assert_eq!((r0[1].start, r0[1].end), (7.5, 9.5));
    assert_eq!(s.makespan, 9.5);
    assert_eq!(s.busy, vec![3.0, 5.0]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_sizes_generate_and_simulate_or_fail_cleanly(
        kind_ix in 0usize..6,
        pp in 1u32..10,
        m in 1u32..40,
        f in 0.1f64..3.0,
        b in 0.1f64..3.0,
        w in proptest::option::of(0.1f64..3.0),
        p2p in 0.0f64..0.5,
    ) {
        let kind = ScheduleKind::ALL[kind_ix];
        let vpp = natural_vpp(kind);
        match generate(kind, pp, vpp, m) {
            Ok(program) => {
                let costs = Costs::uniform(pp, vpp, f, b, w, p2p).unwrap();
                let s = simulate(&program, &costs).unwrap();
                prop_assert!(s.makespan > 0.0);
                prop_assert!(s.idle.iter().all(|x| *x >= -1e-9));
                prop_assert!(s.bubble_fraction >= -1e-12);
            }
            Err(e) => {
                // only the documented microbatch rules reject these sizes
                let msg = e.to_string();
                prop_assert!(msg.contains("microbatches"), "{}", msg);
            }
        }
    }
}

/// Random per-stage costs for `stages` stages from `seed` (a small LCG: uneven stages, hops and
/// overlap factors without a proptest strategy per vector).
fn uneven_costs(stages: usize, seed: u64) -> Costs {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |lo: f64, hi: f64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (hi - lo) * ((x >> 11) as f64 / (1u64 << 53) as f64)
    };
    let mut v = |n: usize, lo: f64, hi: f64| (0..n).map(|_| next(lo, hi)).collect::<Vec<_>>();
    let (f, i, w) = (
        v(stages, 0.2, 3.0),
        v(stages, 0.2, 3.0),
        v(stages, 0.1, 2.0),
    );
    let hops = v(stages - 1, 0.0, 0.4);
    let latency = v(1, 0.0, 0.1)[0];
    let factor = v(1, 0.5, 1.0)[0];
    Costs::from_split(f, i, w, latency, hops)
        .unwrap()
        .with_overlap_factor(factor)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Playing several cost sets in one walk gives each the figures of its own full
    /// simulation (the walk depends only on which inputs exist, never on when).
    #[test]
    fn cost_sets_played_together_match_their_own_simulations(
        kind_ix in 0usize..6,
        pp in 1u32..9,
        m in 1u32..30,
        seed in any::<u64>(),
    ) {
        let kind = ScheduleKind::ALL[kind_ix];
        let vpp = natural_vpp(kind);
        let Ok(program) = generate(kind, pp, vpp, m) else {
            return Ok(());
        };
        let stages = (pp * vpp) as usize;
        let (a, b) = (uneven_costs(stages, seed), uneven_costs(stages, seed ^ 0x9e37));
        let checked = CheckedProgram::new(&program).unwrap();
        let [sa, sb] = simulate_summaries(checked, [&a, &b]).unwrap();
        let alone = simulate_summary(checked, &b).unwrap();
        let full_a = PipelineSummary::of(&simulate(&program, &a).unwrap());
        let full_b = PipelineSummary::of(&simulate(&program, &b).unwrap());
        prop_assert_eq!(&sa, &full_a);
        prop_assert_eq!(&sb, &full_b);
        prop_assert_eq!(&alone, &full_b);
    }
}

/// A malformed program is refused when checked, before any play.
#[test]
fn checked_programs_refuse_malformed_ones() {
    use ActionKind::*;
    let p = program(2, 1, vec![vec![a(F, 0, 0), a(B, 0, 0)], vec![a(F, 1, 0)]]);
    assert!(matches!(
        CheckedProgram::new(&p),
        Err(ScheduleError::InvalidProgram(_))
    ));
    let short = program(2, 1, vec![vec![a(F, 0, 0), a(B, 0, 0)]]);
    assert!(matches!(
        CheckedProgram::new(&short),
        Err(ScheduleError::InvalidProgram(_))
    ));
}

/// Blocking pipeline p2p on a uniform 1F1B pipeline matches a closed form derived from the
/// order of 2021 Megatron-LM's calls (megatron/schedules.py at NVIDIA/Megatron-LM de7dc40f,
/// `forward_backward_pipelining_without_interleaving`; every `p2p_communication._communicate`
/// waits for its transfers, then `torch.cuda.synchronize()`s).
///
/// Derivation. Every stage's forward takes F, its backward B, and one transfer between
/// neighbours h (latency included); a transfer holds both ends for h. Stage s runs
/// `recv_forward, F, send_forward` for its p - 1 - s warm-up microbatches, then per
/// steady-state microbatch `F, send_forward_recv_backward, B, send_backward_recv_forward`
/// (each call one transfer with one neighbour, both directions at once), then
/// `recv_backward, B, send_backward` to cool down. A receive is the very transfer its
/// neighbour's send makes, so counting each transfer once on the sender's side, a forward
/// with a next stage lasts F + h and a backward with a previous stage B + h, and the next
/// action on the other rank can start when it ends: a middle stage is busy F + B + 2h per
/// microbatch, the first and the last F + B + h.
///
/// Without communication, the longest chain of 1F1B has m + p - 1 forwards and as many
/// backwards ((m + p - 1)(F + B), Narayanan et al. 2021, Section 2.2). With p >= 3 the
/// longest chain runs microbatch 0's forwards down to the last stage and its backwards back
/// to stage 1, then zig-zags between stages 1 and 2 (F on 1, F on 2, B on 2, B on 1, two
/// microbatches on), the last microbatch's forwards down again and backwards up to stage 0.
/// Every one of its actions carries an h but the last stage's two forwards and stage 0's
/// final backward: T = (m + p - 1)(F + B) + (2(m + p - 1) - 3) h. With p = 2 the chain is
/// F on 0, then all of stage 1's m forwards and m backwards, then B on 0, and only stage 0's
/// forward and stage 1's backwards carry an h: T = (m + 1)(F + B) + (m + 1) h. (An
/// independent event simulation of the engines' calls, with each transfer waiting for both
/// ends, gave the same values, for h up to 0.3 F with B = 1.5 to 2.5 F.)
#[test]
fn blocking_p2p_matches_the_2021_megatron_closed_form() {
    let (f, b, latency, transfer) = (1.0, 2.0, 0.05, 0.2);
    let h: f64 = latency + transfer;
    for (p, m) in [
        (2u32, 1u32),
        (2, 4),
        (2, 9),
        (3, 3),
        (3, 7),
        (4, 4),
        (4, 8),
        (8, 8),
        (8, 16),
    ] {
        let costs = Costs::uniform(p, 1, f, b, None, latency)
            .unwrap()
            .with_hop_transfer(transfer)
            .unwrap()
            .with_blocking_hops(Placement::Loop, p)
            .unwrap();
        assert_eq!(costs.p2p_latency, 0.0);
        assert!(costs.hop_transfer.iter().all(|&x| x == 0.0));
        let program = generate(ScheduleKind::OneFOneB, p, 1, m).unwrap();
        let got = simulate(&program, &costs).unwrap().makespan;
        let slots = f64::from(m + p - 1);
        let want = if p == 2 {
            slots * (f + b) + f64::from(m + 1) * h
        } else {
            slots * (f + b) + (2.0 * slots - 3.0) * h
        };
        assert!((got - want).abs() < 1e-9, "p {p} m {m}: {got} vs {want}");
        // Each stage's busy time: F + B per microbatch, plus one h per send it makes.
        let busy = simulate(&program, &costs).unwrap().busy;
        for (s, busy_s) in busy.iter().enumerate() {
            let sends = u32::from(s + 1 < p as usize) + u32::from(s > 0);
            let want = f64::from(m) * (f + b + f64::from(sends) * h);
            assert!((busy_s - want).abs() < 1e-9, "p {p} m {m} stage {s}");
        }
    }
}

/// Two stages of one rank (the bottom of ZB-V's V) hand over free under blocking p2p too,
/// and the hops between ranks move into the actions at their ends, nowhere else.
#[test]
fn blocking_p2p_folds_only_hops_between_ranks() {
    let pp = 3;
    let costs = Costs::uniform(pp, 2, 1.0, 2.0, Some(1.0), 0.1)
        .unwrap()
        .with_hop_transfer(0.4)
        .unwrap()
        .with_blocking_hops(Placement::V, pp)
        .unwrap();
    // Stages 0..5 on ranks 0 1 2 2 1 0: boundary 2|3 is on rank 2.
    assert_eq!(costs.forward, vec![1.5, 1.5, 1.0, 1.5, 1.5, 1.0]);
    assert_eq!(costs.input_grad, vec![2.0, 2.5, 2.5, 2.0, 2.5, 2.5]);
    assert_eq!(costs.weight_grad, vec![1.0; 6]);
    for s in 0..6 {
        assert_eq!(
            costs.backward[s],
            costs.input_grad[s] + costs.weight_grad[s]
        );
    }
}
