//! Expert parallelism wider than data parallelism, on Megatron-Core's expert grid (MoE
//! Parallel Folding: `expert_decoder_rank_generator` lays expert_tp x ep x expert dp over the
//! tp x cp x dp ranks of a stage, so ep need only divide tp x cp x dp / expert_tp, not dp).
//! With expert TP 1 under TP 2 + SP, ep 4 spans both TP ranks of both DP ranks (dp 2); under TP
//! 4 with dp 1, ep 4 is the TP group. Each TP rank routes its own sequence shard to the 4 EP
//! ranks, each of which holds 2 of the 8 experts whole; with CP 2 and dp 1, ep 2 spans the CP
//! ranks. Each gives the single-rank run's loss
//! after one step and parameters after three (fp32, 1e-5 relative), and every rank's peak lies
//! within 2% of the engine's prediction under forced load balancing.

use super::common::{plan, run};
use super::moe::{compare, moe_config, Moe, BASE};
use super::moe_folding::check_memory;
use parsim_plan::GroupKind;
use serde_json::Value;

/// [`moe_config`] with expert TP 1 (the engine's default, written out).
fn etp1(c: &Moe) -> Value {
    let mut v = moe_config(c);
    v["parallel"]["expert_tp"] = 1.into();
    v
}

/// tp 2 + SP, ep 4 over dp 2 (ZeRO-1); tp 4 + SP, ep 4 over dp 1.
fn mixes() -> [Moe; 2] {
    [
        Moe {
            tp: 2,
            sp: true,
            ep: 4,
            dp: 2,
            zero: 1,
            ..BASE
        },
        Moe {
            tp: 4,
            sp: true,
            ep: 4,
            ..BASE
        },
    ]
}

/// The groups by hand from the expert grid (order tp-cp-ep-dp-pp; etp 1, ep 4, expert dp
/// 4 / 4 = 1): the EP group is the 4 ranks of the stage, {0, 1, 2, 3}, where the dense DP group
/// of tp 2 x dp 2 is {t, t + 2} (2 ranks) and the TP group {2j, 2j + 1}; with tp 4 and dp 1 it
/// is the TP group. Expert DP and expert TP are each rank alone.
#[test]
fn ep_wider_than_dp_spans_the_stage() {
    for c in mixes() {
        let p = plan(etp1(&c));
        for r in &p.ranks {
            let label = format!("{c:?} rank {}", r.rank);
            assert_eq!(r.groups.get(GroupKind::Ep), [0, 1, 2, 3], "{label}");
            assert_eq!(r.groups.get(GroupKind::ExpertDp), [r.rank], "{label}");
            assert_eq!(r.groups.get(GroupKind::ExpertTp), [r.rank], "{label}");
            assert_eq!(r.groups.get(GroupKind::DpCp).len() as u32, c.dp, "{label}");
            assert!(
                r.groups.get(GroupKind::Ep).len() > r.groups.get(GroupKind::DpCp).len(),
                "{label}"
            );
        }
    }
    let p = plan(etp1(&mixes()[1]));
    assert!(p
        .ranks
        .iter()
        .all(|r| r.groups.get(GroupKind::Ep) == r.groups.get(GroupKind::Tp)));
}

/// The Plan contract takes ep above dp under the expert grid's rule and names the rule when
/// expert_tp x ep no longer divides tp x cp x dp (expert_tp 2 x ep 4 over 2 x 2 ranks) or ep
/// is 0.
#[test]
fn the_plan_validates_ep_above_dp_under_the_expert_grid_rule() {
    let mut p = plan(etp1(&mixes()[0]));
    assert_eq!((p.parallel.ep, p.parallel.dp), (4, 2));
    assert!(p.validate().is_ok());
    p.parallel.etp = 2;
    let e = p.validate().unwrap_err().to_string();
    assert!(
        e.contains("expert tp (2) x ep (4) must divide tp x cp x dp (4)"),
        "{e}"
    );
    p.parallel.etp = 1;
    p.parallel.ep = 0;
    let e = p.validate().unwrap_err().to_string();
    assert!(e.contains("ep must be at least 1"), "{e}");
}

/// CP 2 (ring) with ep 2 over dp 1: the expert grid folds CP into EP, so each CP rank sends
/// its sequence chunk's tokens to the experts of both.
const CP2_EP2: Moe = Moe {
    cp: 2,
    ep: 2,
    ..BASE
};

#[test]
fn ep_wider_than_dp_matches_the_single_rank_run() {
    for c in mixes().into_iter().chain([CP2_EP2]) {
        let reference = run(&plan(moe_config(&c.single())), 3);
        let got = run(&plan(etp1(&c)), 3);
        compare(&format!("ep wider than dp {c:?}"), &got, &reference);
    }
}

#[test]
fn ep_wider_than_dp_memory_is_within_2_percent_of_the_prediction() {
    for c in mixes().into_iter().chain([CP2_EP2]) {
        let c = Moe {
            force_balance: true,
            ..c
        };
        check_memory(&format!("ep wider than dp {c:?}"), etp1(&c));
    }
}
