//! The engine's expert groups against the executor plan's, rank by rank, and both against
//! Megatron-Core's rule worked independently: a port of `generate_masked_orthogonal_rank_groups`
//! (megatron/core/parallel_state.py) run on the expert rank generator's sizes
//! (`expert_decoder_rank_generator = RankGenerator(tp=expert_tp, ep=ep, dp=world / (expert_tp x
//! ep x pp), pp=pp, cp=1, order)`, MoE Parallel Folding, Liu et al. 2025). The engine's layout
//! and the plan share one implementation (`Layout::with_expert_tp`), so the port is the
//! independent side: it enumerates group members from strides as Megatron does, not from a
//! rank's digits. With expert_tp = tp and cp = 1 the groups must also be the dense grid's, as
//! before the folding.

use super::common::{plan, run};
use super::moe::{compare, moe_config, Moe, BASE};
use parsim::layout::{GroupKind, Layout};
use serde_json::Value;

/// Megatron-Core's `generate_masked_orthogonal_rank_groups`: the groups along the `mask`ed axes
/// of a grid of `sizes` (fastest first), each listed by its members' indices along those axes.
fn masked_groups(sizes: &[u32], mask: &[bool]) -> Vec<Vec<u32>> {
    let prefix = |a: &[u32]| {
        let mut out = vec![1u32];
        for &v in a {
            out.push(out.last().unwrap() * v);
        }
        out
    };
    let decompose = |index: u32, shape: &[u32]| {
        let stride = prefix(shape);
        shape
            .iter()
            .zip(&stride)
            .map(|(&s, &d)| (index / d) % s)
            .collect::<Vec<u32>>()
    };
    let dot = |a: &[u32], b: &[u32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<u32>();
    let world: u32 = sizes.iter().product();
    let global = prefix(sizes);
    let pick = |v: &[u32], keep: bool| -> Vec<u32> {
        v.iter()
            .zip(mask)
            .filter(|(_, &m)| m == keep)
            .map(|(&x, _)| x)
            .collect()
    };
    let (masked_shape, unmasked_shape) = (pick(sizes, true), pick(sizes, false));
    let (masked_stride, unmasked_stride) = (pick(&global, true), pick(&global, false));
    let group_size: u32 = masked_shape.iter().product();
    (0..world / group_size)
        .map(|g| {
            let gi = decompose(g, &unmasked_shape);
            (0..group_size)
                .map(|k| {
                    dot(&decompose(k, &masked_shape), &masked_stride) + dot(&gi, &unmasked_stride)
                })
                .collect()
        })
        .collect()
}

/// Megatron's expert groups along `token` (tp, ep or dp of the expert generator) for order
/// tp-cp-ep-dp-pp: the group of each rank, ascending.
fn megatron_expert_groups(c: &Mix, token: &str) -> Vec<Vec<u32>> {
    let world = c.tp * c.cp * c.dp * c.pp;
    let edp = world / (c.etp * c.ep * c.pp);
    let names = ["tp", "cp", "ep", "dp", "pp"];
    let sizes = [c.etp, 1, c.ep, edp, c.pp];
    let mask: Vec<bool> = names.iter().map(|n| *n == token).collect();
    let mut of_rank = vec![Vec::new(); world as usize];
    for mut g in masked_groups(&sizes, &mask) {
        g.sort_unstable();
        for &r in &g {
            of_rank[r as usize] = g.clone();
        }
    }
    of_rank
}

#[derive(Debug, Clone, Copy)]
struct Mix {
    tp: u32,
    etp: u32,
    ep: u32,
    cp: u32,
    dp: u32,
    pp: u32,
}

/// The small MoE model of the executor tests at `c`, on 8-GPU nodes.
fn config(c: &Mix) -> Value {
    config_of(c, false)
}

/// [`config`], or (`single`) the single-rank run of the same model and batch.
fn config_of(c: &Mix, single: bool) -> Value {
    let moe = Moe {
        tp: c.tp,
        sp: c.tp > 1,
        ep: c.ep,
        cp: c.cp,
        dp: c.dp,
        pp: c.pp,
        ..BASE
    };
    let mut v = moe_config(&if single { moe.single() } else { moe });
    if !single {
        v["parallel"]["expert_tp"] = c.etp.into();
    }
    v["cluster"]["gpus_per_node"] = 8.into();
    // 8 heads and 8 KV heads split over tp 8; a batch of 2 per DP rank.
    v["model"]["num_query_groups"] = 8.into();
    v["training"]["global_batch_size"] = (2 * c.dp).into();
    v
}

/// The mixes: tp 8 / etp 1 / ep 8; tp 2 / etp 1 / ep 4 / cp 2; tp 4 / etp 2 with ep 2
/// over dp 2 and ep 4 over dp 4; tp 2 / etp 4 / dp 2; expert_tp = tp with cp 1 (tp 2, ep 2,
/// dp 4, pp 2), where nothing may change; expert_tp = tp with cp 2 (tp 2, ep 2, dp 2), which
/// Megatron-Core folds too (its expert generator has cp = 1 whatever expert_tp is); and EP
/// wider than DP: ep 4 over dp 2 (tp 4 / etp 2, tp 2 / etp 1) and over dp 1 (tp 4 / etp 1).
fn mixes() -> Vec<Mix> {
    let m = |tp, etp, ep, cp, dp, pp| Mix {
        tp,
        etp,
        ep,
        cp,
        dp,
        pp,
    };
    vec![
        m(8, 1, 8, 1, 8, 1),
        m(2, 1, 4, 2, 4, 1),
        m(4, 2, 2, 1, 2, 1),
        m(4, 2, 4, 1, 4, 1),
        m(2, 4, 1, 1, 2, 1),
        m(2, 2, 2, 1, 4, 2),
        m(2, 2, 2, 2, 2, 1),
        // EP wider than DP (Megatron-Core's expert grid, not EP inside DP).
        m(4, 2, 4, 1, 2, 1),
        m(2, 1, 4, 1, 2, 1),
        m(4, 1, 4, 1, 1, 1),
    ]
}

/// Members in the first member's node and nodes spanned, from a member list.
fn span(members: &[u32]) -> (u32, u32, u32) {
    let mut nodes: Vec<u32> = members.iter().map(|r| r / 8).collect();
    let per_node = nodes.iter().filter(|&&n| n == nodes[0]).count() as u32;
    nodes.dedup();
    (members.len() as u32, per_node, nodes.len() as u32)
}

#[test]
fn engine_and_plan_expert_groups_are_megatrons_for_every_rank() {
    for c in mixes() {
        let v = config(&c);
        let res = super::common::resolve(v.clone());
        let layout = Layout::of(&res);
        let p = plan(v);
        let (ep, edp, etp) = (
            megatron_expert_groups(&c, "ep"),
            megatron_expert_groups(&c, "dp"),
            megatron_expert_groups(&c, "tp"),
        );
        for r in &p.ranks {
            let i = r.rank as usize;
            let label = format!("{c:?} rank {i}");
            assert_eq!(r.groups.get(GroupKind::Ep), ep[i], "{label}: plan EP");
            assert_eq!(
                r.groups.get(GroupKind::ExpertDp),
                edp[i],
                "{label}: plan expert DP"
            );
            assert_eq!(
                r.groups.get(GroupKind::ExpertTp),
                etp[i],
                "{label}: plan expert TP"
            );
            assert_eq!(
                layout.group_of(GroupKind::Ep, r.rank),
                ep[i],
                "{label}: engine EP"
            );
            assert_eq!(
                layout.group_of(GroupKind::ExpertDp, r.rank),
                edp[i],
                "{label}: engine expert DP"
            );
            assert_eq!(
                layout.expert_tp_group(r.rank),
                etp[i],
                "{label}: engine expert TP"
            );
            // The geometry the network prices: size, members per node, nodes.
            assert_eq!(layout.group_geometry(GroupKind::Ep, r.rank), span(&ep[i]));
            assert_eq!(
                layout.group_geometry(GroupKind::ExpertDp, r.rank),
                span(&edp[i])
            );
            // Sizes did not change: ep, and world / (etp x ep x pp).
            assert_eq!(ep[i].len() as u32, c.ep);
            assert_eq!(edp[i].len() as u32, res.expert_dp());
        }
    }
}

/// tp 8 / expert_tp 1 / ep 8 by hand: EP groups are the 8 ranks of a node, {8j..8j+7}.
#[test]
fn expert_tp_1_under_tp_8_puts_each_ep_group_in_one_node() {
    let p = plan(config(&mixes()[0]));
    for r in &p.ranks {
        let j = r.rank / 8;
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            (8 * j..8 * j + 8).collect::<Vec<_>>()
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertDp),
            (0..8).map(|d| r.rank % 8 + 8 * d).collect::<Vec<_>>()
        );
    }
}

/// expert_tp = tp with cp 1: the engine's and the plan's expert groups are the dense grid's
/// (the layout before the folding: Ep along the ep axis, ExpertDp along the expert-DP axis,
/// expert TP the TP group).
#[test]
fn expert_tp_equal_to_tp_without_cp_keeps_the_dense_groups() {
    let c = mixes()[5];
    assert_eq!((c.etp, c.cp), (c.tp, 1));
    let v = config(&c);
    let res = super::common::resolve(v.clone());
    let dense = Layout::new("tp-cp-ep-dp-pp", c.tp, c.cp, c.ep, c.dp, c.pp, 8).unwrap();
    let layout = Layout::of(&res);
    assert!(!layout.is_folded());
    let p = plan(v);
    for r in &p.ranks {
        for kind in GroupKind::ALL {
            assert_eq!(
                layout.group_of(kind, r.rank),
                dense.group_of(kind, r.rank),
                "{kind}"
            );
        }
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            dense.group_of(GroupKind::Ep, r.rank)
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertDp),
            dense.group_of(GroupKind::ExpertDp, r.rank)
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertTp),
            r.groups.get(GroupKind::Tp)
        );
    }
}

/// ep 4 over dp 2 (tp 4, expert_tp 2): Megatron's grid takes it (2 x 4 divides 4 x 2), and so
/// does the engine. By hand (order tp-cp-ep-dp-pp; expert grid etp 2, ep 4, expert dp 4 x 2 /
/// (2 x 4) = 1): the EP group of rank r is {t, t + 2, t + 4, t + 6} with t = r mod 2 (stride
/// etp = 2, over both DP ranks), expert DP is r alone, expert TP the pair {r - t, r - t + 1}.
#[test]
fn ep_above_dp_lies_on_the_expert_grid() {
    let c = Mix {
        tp: 4,
        etp: 2,
        ep: 4,
        cp: 1,
        dp: 2,
        pp: 1,
    };
    let p = plan(config(&c));
    for r in &p.ranks {
        let t = r.rank % 2;
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            vec![t, t + 2, t + 4, t + 6],
            "rank {}",
            r.rank
        );
        assert_eq!(r.groups.get(GroupKind::ExpertDp), vec![r.rank]);
        assert_eq!(
            r.groups.get(GroupKind::ExpertTp),
            vec![r.rank - t, r.rank - t + 1]
        );
        // The dense DP group {r mod 4, r mod 4 + 4} has 2 ranks; the EP group covers both.
        assert_eq!(
            r.groups.get(GroupKind::DpCp),
            vec![r.rank % 4, r.rank % 4 + 4]
        );
        let mut dps: Vec<u32> = r
            .groups
            .get(GroupKind::Ep)
            .iter()
            .map(|&x| p.ranks[x as usize].coords.dp)
            .collect();
        dps.dedup();
        assert_eq!(dps, [0, 1]);
    }
}

/// expert_tp = tp = 2 with cp 2, ep 2, dp 2 (8 ranks; dense grid tp, cp, ep, dp / ep = 1): the
/// expert grid is etp 2 x ep 2 x edp 2 (cp folded into expert DP), so the EP group pairs a
/// rank with the one 2 above it, {r, r + 2} within each block of 4 (ranks of the other CP
/// index), where the dense grid's ep axis pairs it with r + 4; expert DP then is {r, r + 4}.
#[test]
fn expert_tp_equal_to_tp_with_cp_folds_cp_into_expert_dp() {
    let c = mixes()[6];
    assert_eq!((c.tp, c.etp, c.cp), (2, 2, 2));
    let v = config(&c);
    let layout = Layout::of(&super::common::resolve(v.clone()));
    assert!(layout.is_folded());
    let p = plan(v);
    for r in &p.ranks {
        let lo = r.rank % 2 + (r.rank / 4) * 4;
        assert_eq!(
            r.groups.get(GroupKind::Ep),
            vec![lo, lo + 2],
            "rank {}",
            r.rank
        );
        assert_ne!(
            p.ranks[r.groups.get(GroupKind::Ep)[0] as usize].coords.cp,
            p.ranks[r.groups.get(GroupKind::Ep)[1] as usize].coords.cp
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertDp),
            vec![r.rank % 4, r.rank % 4 + 4]
        );
        assert_eq!(
            r.groups.get(GroupKind::ExpertTp),
            r.groups.get(GroupKind::Tp)
        );
    }
}

/// The executor runs the folded groups: tp 2 + SP / expert_tp 1 / ep 4 / cp 2 (ring) / dp 4 on
/// 16 ranks, where each EP group is the 4 ranks (both TP ranks of both CP indices) of one DP
/// rank (the dense grid's ep axis spans 4 DP ranks instead), gives the
/// single-rank run's loss after one step and parameters after three (fp32, 1e-5 relative).
#[test]
fn the_folded_groups_run_as_the_single_rank_run() {
    let c = mixes()[1];
    assert_eq!((c.tp, c.etp, c.ep, c.cp), (2, 1, 4, 2));
    let reference = run(&plan(config_of(&c, true)), 3);
    let got = run(&plan(config(&c)), 3);
    compare(&format!("{c:?}"), &got, &reference);
}
