//! MoE layers with expert tensor parallelism 1 under TP 2 + SP (Megatron's
//! `--expert-tensor-parallel-size 1`, MoE Parallel Folding: the MoE layers regroup the
//! tp x cp x dp ranks as etp x ep x edp). The attention and the shared experts run TP 2 + SP;
//! each TP rank routes its own sequence shard (the decisions, the load-balancing loss and the
//! capacity are the whole microbatch's), its experts are whole, and the TP ranks fill the
//! expert grid's fastest axes (Megatron-Core's expert rank generator: EP, then expert DP).
//! Every mix gives the single-rank run's loss after one step and parameters after three
//! (fp32, 1e-5 relative); every rank's peak lies within 2% of the
//! engine's prediction under forced load balancing. Expert TP 2 under TP 4 (blocks of a TP
//! group) and expert TP above tp (TP 2 with expert TP 4 over DP 2, TP 1 with expert TP 2 over
//! DP 4 and EP 2: the expert-TP group spans DP ranks) are checked the same way.

use super::common::*;
use super::memory::{compare_config, weight_bytes};
use super::moe::{compare, moe_config, Moe, BASE};
use parsim_plan::GroupKind;
use serde_json::Value;

/// Every rank's measured peak within 2% of the engine's prediction, and its weights within
/// the router's expert bias (8 fp32 per MoE layer, 3 layers), which the engine counts and the
/// executor keeps outside its tracker.
pub(super) fn check_memory(label: &str, v: Value) {
    for (rank, got, want, gb, wb) in compare_config(v) {
        let rel = (got as f64 - want as f64) / want as f64;
        eprintln!("{label} rank {rank}: {:+.2}%", 100.0 * rel);
        eprintln!("  measured  {gb}\n  predicted {wb}");
        let dw = weight_bytes(&gb) - weight_bytes(&wb);
        assert!(
            dw.abs() <= 4 * 8 * 3,
            "{label} rank {rank}: weights {gb} vs {wb}"
        );
        assert!(
            rel.abs() <= 0.02,
            "{label} rank {rank}: {:.2}%\n  measured {gb}\n  predicted {wb}",
            100.0 * rel
        );
    }
}

/// [`moe_config`] with expert TP 1.
fn folded(c: &Moe) -> Value {
    let mut v = moe_config(c);
    v["parallel"]["expert_tp"] = 1.into();
    v
}

fn ds() -> Moe {
    Moe {
        first_dense: 1,
        deepseek: true,
        tp: 2,
        sp: true,
        ..BASE
    }
}

/// TP 2 + SP with expert TP 1: the plain router with its load-balancing loss and EP 1 (the
/// two TP ranks hold every expert), with EP 2 over DP 2 and ZeRO-1; DeepSeek-style routing
/// with a shared expert, EP 2 with ZeRO-2 and ZeRO-3 under full recompute, capacity dropping,
/// PP 2 with ZB-V (the experts' gradients held for the W action), and CP 2 Ulysses (the
/// logits gathered over TP, then over CP).
fn mixes() -> Vec<Moe> {
    let plain = Moe {
        tp: 2,
        sp: true,
        ..BASE
    };
    vec![
        plain,
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..plain
        },
        Moe {
            ep: 2,
            dp: 2,
            zero: 2,
            ..ds()
        },
        Moe {
            ep: 2,
            dp: 2,
            zero: 3,
            recompute: "full",
            ..ds()
        },
        Moe {
            capacity_factor: 1.25,
            ep: 2,
            dp: 2,
            ..plain
        },
        Moe {
            pp: 2,
            vpp: 2,
            schedule: "zb-v",
            ..ds()
        },
        Moe {
            cp: 2,
            cp_comm: "a2a",
            ..ds()
        },
    ]
}

#[test]
fn whole_experts_under_tp_match_the_single_rank_run() {
    for c in mixes() {
        let reference = run(&plan(moe_config(&c.single())), 3);
        let got = run(&plan(folded(&c)), 3);
        compare(&format!("expert TP 1 {c:?}"), &got, &reference);
        if c.capacity_factor > 0.0 {
            let drops = |r: &parsim_plan::run_report::RunReport| {
                r.ranks.iter().map(|x| x.moe_dropped).sum::<u64>()
            };
            assert!(drops(&reference) > 0, "the capacity drops nothing");
            assert_eq!(drops(&got), drops(&reference), "dropped assignments");
        }
    }
}

/// The layout, worked by hand from Megatron-Core's expert rank generator (parallel_state.py:
/// order tp-cp-ep-dp-pp with tp = expert_tp 1, cp 1, ep 2, dp = 4 / 2): TP 2, EP 2, DP 2 on 4
/// ranks. Each rank's experts are whole (expert-TP group: itself); EP is the fastest expert
/// axis, so the EP group is the TP group {2j, 2j + 1} (the two TP ranks hold different
/// experts) and the expert-DP group the ranks of one TP index over DP ({t, t + 2}).
#[test]
fn whole_experts_are_held_by_every_tp_rank() {
    let c = Moe {
        ep: 2,
        dp: 2,
        ..ds()
    };
    let p = plan(folded(&c));
    assert_eq!(p.parallel.etp, 1);
    for r in &p.ranks {
        let (t, j) = (r.rank % 2, r.rank / 2);
        assert_eq!(
            r.groups.get(GroupKind::ExpertTp),
            vec![r.rank],
            "rank {}",
            r.rank
        );
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            vec![2 * j, 2 * j + 1],
            "rank {}",
            r.rank
        );
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            r.groups.get(GroupKind::Tp),
            "rank {}: its TP group",
            r.rank
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertDp),
            vec![t, t + 2],
            "rank {}",
            r.rank
        );
    }
}

#[test]
fn whole_experts_under_tp_memory_is_within_2_percent_of_the_prediction() {
    for c in [
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            force_balance: true,
            ..ds()
        },
        Moe {
            pp: 2,
            vpp: 2,
            schedule: "zb-v",
            force_balance: true,
            ..ds()
        },
    ] {
        check_memory(&format!("expert TP 1 {c:?}"), folded(&c));
    }
}

/// [`moe_config`] with expert TP 2 (under TP 4: two expert-TP blocks per TP group).
fn etp2(c: &Moe) -> Value {
    let mut v = moe_config(c);
    v["parallel"]["expert_tp"] = 2.into();
    v
}

/// TP 4 + SP with expert TP 2 (MoE Parallel Folding between the two cases above): each TP
/// rank routes its sequence shard, the rows received by the two ranks of its expert-TP block
/// gather before its half of each expert and reduce-scatter back; the two blocks of a TP
/// group are EP peers with EP 2, expert-DP peers with EP 1. EP 2 over DP 2 with ZeRO-1
/// (DeepSeek-style routing with a shared expert split over TP 4), and EP 1 over DP 2 with
/// ZeRO-3 (the plain router; the experts shard over the expert-DP group of 4).
fn etp2_mixes() -> Vec<Moe> {
    vec![
        Moe {
            tp: 4,
            ep: 2,
            dp: 2,
            zero: 1,
            ..ds()
        },
        Moe {
            tp: 4,
            sp: true,
            dp: 2,
            zero: 3,
            ..BASE
        },
    ]
}

#[test]
fn expert_tp_below_tp_matches_the_single_rank_run() {
    for c in etp2_mixes() {
        let reference = run(&plan(moe_config(&c.single())), 3);
        let got = run(&plan(etp2(&c)), 3);
        compare(&format!("expert TP 2 {c:?}"), &got, &reference);
    }
}

/// The groups by hand from Megatron-Core's expert rank generator (order tp-cp-ep-dp-pp with
/// tp = expert_tp 2, ep 2, dp = 8 / (2 x 2) = 2; TP 4, EP 2, DP 2 on 8 ranks): the TP ranks
/// 0-3 of a TP group split into expert-TP blocks {0, 1} and {2, 3} (stride 1); the EP group
/// pairs a rank with the same expert-TP index in the other block (stride 2); the expert-DP
/// group is the same TP index in the other TP group (stride 2 x 2 = 4).
#[test]
fn expert_tp_blocks_and_expert_dp_groups_follow_the_layout() {
    let c = Moe {
        tp: 4,
        ep: 2,
        dp: 2,
        ..ds()
    };
    let p = plan(etp2(&c));
    assert_eq!(p.parallel.etp, 2);
    for r in &p.ranks {
        let (tp, base) = (r.coords.tp, r.rank - r.coords.tp);
        let block = base + (tp / 2) * 2;
        assert_eq!(
            r.groups.get(GroupKind::ExpertTp),
            vec![block, block + 1],
            "rank {}",
            r.rank
        );
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            vec![base + tp % 2, base + 2 + tp % 2],
            "rank {}",
            r.rank
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertDp),
            vec![tp, tp + 4],
            "rank {}",
            r.rank
        );
    }
}

#[test]
fn expert_tp_below_tp_memory_is_within_2_percent_of_the_prediction() {
    for c in etp2_mixes() {
        let c = Moe {
            force_balance: true,
            ..c
        };
        check_memory(&format!("expert TP 2 {c:?}"), etp2(&c));
    }
}

/// [`moe_config`] with expert TP `etp`.
fn with_etp(c: &Moe, etp: u32) -> Value {
    let mut v = moe_config(c);
    v["parallel"]["expert_tp"] = etp.into();
    v
}

/// Expert TP above tp (MoE Parallel Folding: the expert-TP group spans DP or CP ranks): TP 2 +
/// SP with expert TP 4 over DP 2, EP 1 (DeepSeek-style routing, a shared expert split over
/// TP 2, ZeRO-1); TP 1 with expert TP 2 over DP 4, EP 2 (the plain router with its
/// load-balancing loss, ZeRO-3: the experts shard over the expert-DP group of 1); TP 2 + SP
/// with expert TP 4 over CP 2 (Ulysses); TP 2 + SP with expert TP 3 over DP 3 (not a multiple
/// of tp: an expert-TP group takes part of a TP group); and expert TP 4 over DP 2 under PP 2
/// with ZeRO-2. Each rank routes its own tokens (its SP shard, or its whole microbatch), the
/// rows its expert-TP group received gather before its slice of each expert and
/// reduce-scatter back.
fn etp_above_tp_mixes() -> Vec<(Moe, u32)> {
    vec![
        (
            Moe {
                dp: 2,
                zero: 1,
                ..ds()
            },
            4,
        ),
        (
            Moe {
                ep: 2,
                dp: 4,
                zero: 3,
                ..BASE
            },
            2,
        ),
        (
            Moe {
                cp: 2,
                cp_comm: "a2a",
                ..ds()
            },
            4,
        ),
        (Moe { dp: 3, ..ds() }, 3),
        (
            Moe {
                dp: 2,
                pp: 2,
                zero: 2,
                ..ds()
            },
            4,
        ),
    ]
}

/// The configuration of mix `c` with expert TP `etp`, or (`single`) of its single-rank run.
/// Expert TP 3 over DP 3 takes a global batch of 6 and an expert intermediate size of 48 (in
/// both).
fn above(c: &Moe, etp: u32, single: bool) -> Value {
    let mut v = if single {
        moe_config(&c.single())
    } else {
        with_etp(c, etp)
    };
    if c.dp == 3 {
        v["training"]["global_batch_size"] = 6.into();
        v["model"]["moe_ffn_hidden_size"] = 48.into();
    }
    v
}

#[test]
fn expert_tp_above_tp_matches_the_single_rank_run() {
    for (c, etp) in etp_above_tp_mixes() {
        let reference = run(&plan(above(&c, etp, true)), 3);
        let got = run(&plan(above(&c, etp, false)), 3);
        compare(&format!("expert TP {etp} {c:?}"), &got, &reference);
    }
}

/// The groups worked by hand from Megatron-Core's expert rank generator (parallel_state.py:
/// the order tp-cp-ep-dp-pp with tp = expert_tp, cp = 1, dp = world / (expert_tp x ep x pp),
/// expert_tp fastest). TP 2, DP 2, EP 1, expert TP 4: the one expert-TP group is every rank
/// (both TP groups), the expert-DP group the rank alone. TP 1, DP 4, EP 2, expert TP 2:
/// expert-TP groups {0, 1} and {2, 3} (stride 1), EP groups {0, 2} and {1, 3} (stride 2), an
/// expert DP of 1. TP 2, DP 3, expert TP 3: expert-TP groups {0, 1, 2} and {3, 4, 5} (the
/// middle TP group split between them), EP 1, expert-DP groups {0, 3}, {1, 4}, {2, 5}. In
/// each, the expert-DP group has the engine's count (`Resolved::expert_dp`: world / (etp x ep
/// x pp)), and the plan's expert groups are the engine layout's.
#[test]
fn expert_tp_above_tp_groups_follow_the_layout() {
    use parsim::config::{Config, Layer, Resolved};
    use parsim::layout::Layout;
    let mixes = etp_above_tp_mixes();
    let all4 = vec![0, 1, 2, 3];
    let (lo, hi) = (vec![0, 1, 2], vec![3, 4, 5]);
    let alone = |n: u32| (0..n).map(|r| vec![r]).collect::<Vec<_>>();
    type Case = (usize, Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<Vec<u32>>);
    let cases: [Case; 3] = [
        (0, vec![all4.clone(); 4], alone(4), alone(4)),
        (
            1,
            vec![vec![0, 1], vec![0, 1], vec![2, 3], vec![2, 3]],
            alone(4),
            vec![vec![0, 2], vec![1, 3], vec![0, 2], vec![1, 3]],
        ),
        (
            3,
            vec![lo.clone(), lo.clone(), lo, hi.clone(), hi.clone(), hi],
            (0..6).map(|r| vec![r % 3, r % 3 + 3]).collect(),
            alone(6),
        ),
    ];
    for (mix, want_etp, want_edp, want_ep) in cases {
        let (c, etp) = &mixes[mix];
        let v = above(c, *etp, false);
        let cfg = Config::from_layers(&[Layer::overrides(v.clone())]).expect("loads");
        let res = Resolved::new(cfg).unwrap_or_else(|e| panic!("validates: {e}"));
        let layout = Layout::of(&res);
        let p = plan(v);
        assert_eq!(p.parallel.etp, *etp);
        for r in &p.ranks {
            let i = r.rank as usize;
            assert_eq!(
                r.groups.get(GroupKind::ExpertTp),
                want_etp[i],
                "{mix} rank {i}: expert-TP group"
            );
            assert_eq!(
                r.groups.get(GroupKind::ExpertDp),
                want_edp[i],
                "{mix} rank {i}: expert-DP group"
            );
            assert_eq!(
                r.groups.get(GroupKind::Ep),
                want_ep[i],
                "{mix} rank {i}: EP group"
            );
            assert_eq!(
                r.groups.get(GroupKind::ExpertDp).len(),
                res.expert_dp() as usize
            );
            assert_eq!(
                r.groups.get(GroupKind::Ep),
                layout.group_of(GroupKind::Ep, r.rank)
            );
            assert_eq!(
                r.groups.get(GroupKind::ExpertDp),
                layout.group_of(GroupKind::ExpertDp, r.rank)
            );
            // Expert TP x expert DP x EP covers the world once per rank.
            assert_eq!(
                r.groups.get(GroupKind::ExpertTp).len()
                    * r.groups.get(GroupKind::ExpertDp).len()
                    * r.groups.get(GroupKind::Ep).len(),
                p.ranks.len(),
                "{mix} rank {i}"
            );
            let place = want_etp[i].iter().position(|&x| x == r.rank);
            assert_eq!(Some(r.et_rank() as usize), place, "{mix} rank {i}");
        }
    }
}

/// The CUDA runner creates its communicators from the plan's group lists: with expert TP 2
/// over DP 4 and EP 2 (no GPU needed: host logic), the expert-TP groups {0, 1} and {2, 3}
/// (ranks of different DP indices) are among its groups, each an NCCL communicator over the
/// members' GPUs.
#[test]
fn the_cuda_runner_creates_the_expert_tp_groups_above_tp() {
    use parsim_executor::backend::cuda::comm::groups::{plan_groups, Placement, Transport};
    let (c, etp) = &etp_above_tp_mixes()[1];
    let p = plan(above(c, *etp, false));
    let specs = plan_groups(&p, Placement::SingleProcess { gpus: 4 }, |_| 0, |_| 0)
        .expect("places the ranks");
    for members in [vec![0, 1], vec![2, 3]] {
        assert!(p
            .ranks
            .iter()
            .any(|r| r.groups.get(GroupKind::ExpertTp) == members));
        let g = specs
            .iter()
            .find(|g| g.members == members)
            .unwrap_or_else(|| panic!("no group {members:?}"));
        assert_eq!(g.devices, members, "one GPU per rank");
        assert_eq!(g.transport, Transport::Nccl);
    }
    for r in &p.ranks {
        assert!(specs
            .iter()
            .any(|g| g.members == r.groups.get(GroupKind::ExpertTp)));
        assert!(specs
            .iter()
            .any(|g| g.members == r.groups.get(GroupKind::ExpertDp)));
    }
}

#[test]
fn expert_tp_above_tp_memory_is_within_2_percent_of_the_prediction() {
    for (c, etp) in etp_above_tp_mixes() {
        let c = Moe {
            force_balance: true,
            ..c
        };
        check_memory(&format!("expert TP {etp} {c:?}"), above(&c, etp, false));
    }
}

/// LoRA (Hu et al. 2021) on the routed experts with expert TP above tp: adapters (rank 4, B
/// seeded nonzero so an adapter path that does nothing fails) on qkv, proj, fc1 and fc2, each
/// routed expert's fc1 A split over expert TP with its rows, fc2's A by input columns (A x
/// all-reduced over the expert-TP group, here TP 2 x DP 2 ranks and 2 DP ranks): the
/// single-rank LoRA run's loss and parameters.
#[test]
fn lora_on_experts_with_expert_tp_above_tp_matches_the_single_rank_run() {
    let lora = |mut v: Value| {
        v["training"]["mode"] = "lora".into();
        v["training"]["lora"] =
            serde_json::json!({"rank": 4, "alpha": 16.0, "targets": ["qkv", "proj", "fc1", "fc2"]});
        let mut p = plan(v);
        p.lora.as_mut().expect("lora plan").seeded_b = true;
        p
    };
    for (c, etp) in etp_above_tp_mixes().into_iter().take(2) {
        let reference = run(&lora(above(&c, etp, true)), 3);
        let got = run(&lora(above(&c, etp, false)), 3);
        compare(&format!("LoRA expert TP {etp} {c:?}"), &got, &reference);
    }
}

/// or whose expert TP x ep does not divide tp x cp x dp, is refused by the executor naming
/// the rule.
#[test]
fn the_executor_refuses_a_foreign_expert_tp_group() {
    use parsim_executor::runner::{run_cpu, RunOptions};
    let c = Moe { tp: 4, ..ds() };
    let mut p = plan(etp2(&c));
    // Ranks 0 and 2 share an expert-TP index, not a block.
    p.ranks[0].groups.insert(GroupKind::ExpertTp, vec![0, 2]);
    let e = run_cpu(&p, &RunOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("rank 0: the expert-TP group") && e.contains("expert tp (2)"),
        "{e}"
    );
    let mut p = plan(etp2(&c));
    p.parallel.etp = 3;
    let e = run_cpu(&p, &RunOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("expert tp (3) x ep (1) must divide tp x cp x dp (4)"),
        "{e}"
    );
    // Above tp: an expert-TP group of both TP groups that leaves out a TP peer.
    let (c, etp) = &etp_above_tp_mixes()[0];
    let mut p = plan(with_etp(c, *etp));
    p.ranks[1]
        .groups
        .insert(GroupKind::ExpertTp, vec![0, 1, 2, 2]);
    let e = run_cpu(&p, &RunOptions::default()).unwrap_err().to_string();
    assert!(e.contains("rank 1: the expert-TP group"), "{e}");
}
