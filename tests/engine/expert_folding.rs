//! MoE Parallel Folding end to end (Liu et al. 2025, "MoE Parallel Folding: Heterogeneous
//! Parallelism Mappings for Efficient Large-Scale MoE Model Training with Megatron Core";
//! Megatron-Core's `initialize_model_parallel`, `expert_decoder_rank_generator`): with tp 8,
//! expert_tp 1 and ep 8 on 8-GPU nodes the expert grid is etp 1 x ep 8 x edp, so the EP group
//! is 8 consecutive ranks, one node, and the expert all-to-all runs on NVLink; the dense grid's
//! ep axis (stride tp = 8) would spread it over 8 nodes on the NIC network. With expert_tp =
//! tp the expert grid is the dense one: the estimate is what the unfolded layout gives.

use super::common::{group_info, resolve};
use parsim::config::Resolved;
use parsim::estimate::{Estimate, Prepared};
use parsim::layout::{GroupKind, Layout};
use parsim::model::{CollectiveKind, CommKind};
use parsim::network::Network;
use serde_json::json;

/// DeepSeek-V3 (61 layers, 256 experts, top-8) on 1024 H100s in 8-GPU nodes: tp 8 + SP, pp 16
/// (3 and 2 layers on the end stages, 4 on the others), ep 8 over dp 8, expert TP `etp`.
fn dsv3(etp: u32) -> Resolved {
    resolve(json!({
        "model": {"preset": "deepseek-v3"},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 1024, "gpus_per_node": 8},
        "parallel": {
            "tp": 8, "sp": true, "pp": 16, "ep": 8, "expert_tp": etp,
            "first_stage_layers": 3, "last_stage_layers": 2
        },
        "training": {"seq_length": 4096, "global_batch_size": 1024, "recompute": "full"}
    }))
}

/// The layout as the engine placed expert groups before the folding: the dense grid's axes.
fn unfolded(r: &Resolved) -> Layout {
    let p = &r.config.parallel;
    Layout::new(&p.order, p.tp, p.cp, p.ep, r.dp, p.pp, 8).expect("valid layout")
}

/// The estimate of `r` with the expert groups placed on `layout`.
fn estimate_on(r: &Resolved, layout: &Layout) -> Estimate {
    Prepared::new(r, Some(Network::new(layout, &r.gpu)))
        .and_then(|p| p.finish())
        .expect("estimate")
}

fn ep_crosses_nodes(e: &Estimate) -> bool {
    let g = group_info(e, GroupKind::Ep);
    assert_eq!(g.size, 8);
    g.crosses_nodes
}

#[test]
fn expert_tp_1_under_tp_8_keeps_the_expert_all_to_all_inside_a_node() {
    let r = dsv3(1);
    let layout = Layout::of(&r);
    assert!(layout.is_folded());
    // The EP group of rank 0 is ranks 0..7 (etp 1 fastest, then ep): one node.
    assert_eq!(
        layout.group_of(GroupKind::Ep, 0),
        (0..8).collect::<Vec<_>>()
    );
    let folded = Network::new(&layout, &r.gpu);
    let dense = Network::new(&unfolded(&r), &r.gpu);
    let g = folded.geometry(GroupKind::Ep);
    assert_eq!((g.size, g.per_node, g.nodes), (8, 8, 1));
    let d = dense.geometry(GroupKind::Ep);
    assert_eq!((d.size, d.per_node, d.nodes), (8, 1, 8));
    assert!(!folded.crosses_nodes(GroupKind::Ep));
    assert_eq!(
        folded.latency_s(GroupKind::Ep),
        r.gpu.links.intra_node.latency_s
    );
    // One all-to-all of 64 MiB: NVLink beats the NIC network.
    let (a2a, bytes) = (CollectiveKind::AllToAll, 64 << 20);
    let on_nvlink = folded.collective_s(GroupKind::Ep, a2a, bytes, 8);
    let on_nics = dense.collective_s(GroupKind::Ep, a2a, bytes, 8);
    eprintln!(
        "all-to-all of 64 MiB over ep 8: {on_nvlink:.6} s folded, {on_nics:.6} s at stride 8"
    );
    assert!(on_nvlink < on_nics);

    // The estimate: the EP group no longer crosses nodes, and its exposed all-to-all and the
    // step get shorter than with the EP group at stride 8.
    let now = estimate_on(&r, &layout);
    let before = estimate_on(&r, &unfolded(&r));
    assert_eq!(
        serde_json::to_value(&now).unwrap()["time"],
        serde_json::to_value(parsim::estimate::estimate(&r).unwrap()).unwrap()["time"]
    );
    assert!(!ep_crosses_nodes(&now));
    assert!(ep_crosses_nodes(&before));
    let (ep_now, ep_before) = (
        now.time.exposed_comm_by_group_s[CommKind::Ep],
        before.time.exposed_comm_by_group_s[CommKind::Ep],
    );
    eprintln!(
        "exposed ep {ep_now:.4} s (was {ep_before:.4} s), step {:.3} s (was {:.3} s)",
        now.time.step_s, before.time.step_s
    );
    assert!(ep_before > 0.0 && ep_now < ep_before);
    assert!(now.time.step_s < before.time.step_s);
    // Only placement moved: the bytes each GPU sends are the same.
    assert_eq!(
        now.communication.per_step_bytes_per_gpu[CommKind::Ep],
        before.communication.per_step_bytes_per_gpu[CommKind::Ep]
    );
}

#[test]
fn expert_tp_equal_to_tp_changes_nothing() {
    let r = dsv3(8);
    let layout = Layout::of(&r);
    assert!(!layout.is_folded());
    let now = serde_json::to_value(parsim::estimate::estimate(&r).unwrap()).unwrap();
    let before = serde_json::to_value(estimate_on(&r, &unfolded(&r))).unwrap();
    assert_eq!(now, before);
    // The EP group at stride tp = 8 spans 8 nodes, as Megatron-Core places it.
    assert_eq!(
        layout.group_of(GroupKind::Ep, 0),
        (0..8).map(|j| 8 * j).collect::<Vec<_>>()
    );
    assert!(now["communication"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["group"] == "ep" && g["crosses_nodes"] == true));
}
