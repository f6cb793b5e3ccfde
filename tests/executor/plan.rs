//! Lowering: every schedule's program becomes per-rank action lists whose sends and receives
//! pair up, with the schedule's computations in the schedule's order.

use super::common::*;
use parsim::schedule::{generate, ActionKind};
use parsim_plan::plan::Action;
use parsim_plan::GroupKind;
use std::collections::HashMap;

#[test]
fn every_schedule_lowers_to_matching_sends_and_receives() {
    for (schedule, vpp) in [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved-1f1b", 2),
        ("zb-h1", 1),
        ("zb-v", 2),
        ("dualpipe-v", 2),
    ] {
        for pp in [2u32, 4] {
            let mix = Mix {
                pp,
                vpp,
                schedule,
                dp: 2,
                tp: 2,
                ..Mix::single()
            };
            let plan = plan(config(&mix, 16, true, "rmsnorm", "swiglu"));
            assert_eq!(plan.ranks.len() as u32, 2 * 2 * pp);
            let kind: parsim::config::ScheduleKind = schedule.parse().expect("kind");
            let program = generate(kind, pp, vpp, plan.microbatches).expect("program");
            let mut sends: HashMap<(u32, u32, u32, u32, bool), usize> = HashMap::new();
            let mut recvs: HashMap<(u32, u32, u32, u32, bool), usize> = HashMap::new();
            for r in &plan.ranks {
                assert_eq!(r.actions.last(), Some(&Action::OptimizerStep));
                // The computations are the schedule's, in its order.
                let comp: Vec<(ActionKind, u32, u32)> = r
                    .actions
                    .iter()
                    .filter_map(|a| match *a {
                        Action::Forward { stage, mb } => Some((ActionKind::F, stage, mb)),
                        Action::Backward { stage, mb } => Some((ActionKind::B, stage, mb)),
                        Action::BackwardInput { stage, mb } => Some((ActionKind::I, stage, mb)),
                        Action::BackwardWeight { stage, mb } => Some((ActionKind::W, stage, mb)),
                        _ => None,
                    })
                    .collect();
                let want: Vec<_> = program.ranks[r.coords.pp as usize]
                    .iter()
                    .map(|a| (a.kind, a.stage, a.microbatch))
                    .collect();
                assert_eq!(comp, want, "{schedule} pp {pp} rank {}", r.rank);
                for a in &r.actions {
                    match *a {
                        Action::SendActivation { to, stage, mb } => {
                            *sends.entry((r.rank, to, stage, mb, false)).or_default() += 1
                        }
                        Action::SendGrad { to, stage, mb } => {
                            *sends.entry((r.rank, to, stage, mb, true)).or_default() += 1
                        }
                        Action::RecvActivation { from, stage, mb } => {
                            *recvs.entry((from, r.rank, stage, mb, false)).or_default() += 1
                        }
                        Action::RecvGrad { from, stage, mb } => {
                            *recvs.entry((from, r.rank, stage, mb, true)).or_default() += 1
                        }
                        _ => {}
                    }
                }
                // Peers differ only in the pipeline coordinate.
                for a in &r.actions {
                    if let Action::SendActivation { to, .. } | Action::SendGrad { to, .. } = *a {
                        let p = &plan.ranks[to as usize].coords;
                        assert_eq!((p.tp, p.dp), (r.coords.tp, r.coords.dp));
                        assert_ne!(p.pp, r.coords.pp);
                    }
                }
            }
            assert_eq!(sends, recvs, "{schedule} pp {pp}");
            assert!(!sends.is_empty());
        }
    }
}

#[test]
fn unexecutable_fields_are_refused_by_name() {
    // Context parallelism merges partial outputs by their log-sum-exp: flash attention only.
    let mut v = config(&Mix::single(), 16, true, "rmsnorm", "swiglu");
    v["parallel"]["cp"] = 2.into();
    v["cluster"]["num_gpus"] = 2.into();
    v["training"]["flash_attention"] = false.into();
    let e = match parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(v)]) {
        Ok(cfg) => match parsim::config::Resolved::new(cfg) {
            Ok(r) => parsim::lower::lower(&r, &options())
                .unwrap_err()
                .to_string(),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    assert!(e.contains("training.flash_attention"), "{e}");
    // The lowered CP plan passes the executor's own checks, and names its groups.
    let mut v = config(&Mix::single(), 16, true, "rmsnorm", "swiglu");
    v["parallel"]["cp"] = 2.into();
    v["cluster"]["num_gpus"] = 2.into();
    let p = parsim::lower::lower(&resolve(v), &options()).expect("lowers");
    p.validate().expect("valid");
    assert_eq!(p.ranks[0].groups.get(GroupKind::Cp), vec![0, 1]);
    assert_eq!(p.ranks[1].groups.get(GroupKind::DpCp), vec![0, 1]);
}
