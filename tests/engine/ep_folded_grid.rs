//! Expert parallelism on Megatron-Core's folded grid (`initialize_model_parallel`: the dense
//! generator has ep = 1, the expert generator tp = expert_tp, cp = 1, ep, dp = tp x cp x dp /
//! (expert_tp x ep)), so ep need only fit expert_tp x ep | tp x cp x dp, not divide dp.
//! NVIDIA's published recipe for Qwen3-235B-A22B on 256 H100s (Megatron-Bridge
//! scripts/performance/configs/qwen/qwen3_workload_base_configs.py,
//! `QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_BF16_V1`: tp 2, pp 8, vpp 4, ep 32, expert_tp 1,
//! global batch 2048; micro batch 1, the embedding and loss counted in the pipeline split, from
//! recipes/qwen/qwen3_moe.py; seq 4096 and forced load balancing from qwen3_llm_pretrain.py)
//! has ep 32 over dp 16.

use super::common::{group_info, resolve};
use parsim::config::Resolved;
use parsim::estimate::estimate;
use parsim::layout::{GroupKind, Layout};
use parsim::model::CommKind;
use parsim::search::{search, Constraint, SearchSpec};
use serde_json::{json, Value};
use std::sync::atomic::AtomicBool;

/// The recipe with `ep` (32 published) and `recompute`.
fn qwen3_235b(ep: u32, recompute: &str) -> Value {
    json!({
        "model": {"preset": "qwen3-235b-a22b", "moe_router_force_load_balancing": true},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 256, "gpus_per_node": 8},
        "parallel": {
            "tp": 2, "sp": true, "pp": 8, "vpp": 4, "schedule": "interleaved-1f1b",
            "ep": ep, "expert_tp": 1,
            "account_for_embedding_in_pipeline_split": true,
            "account_for_loss_in_pipeline_split": true
        },
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 2048,
                     "recompute": recompute}
    })
}

/// The recipe resolves and estimates with ep 32 over dp 16. By hand: dp = 256 / (2 x 8) = 16;
/// expert dp = 2 x 16 / (1 x 32) = 1; the expert grid (etp 1 fastest, then ep) makes the EP
/// group of rank 0 ranks 0..31, four 8-GPU nodes, so the all-to-all is priced across the
/// network. Its bytes per GPU: each microbatch's 4096 / tp 2 = 2048 tokens per rank, top-8,
/// hidden 4096 in bf16, 31/32 of them to other ranks, dispatch and combine forward and again
/// backward (4 exchanges), on the 12 layers of the busiest rank ((94 + 2) / 32 = 3 per chunk,
/// 4 chunks), 2048 / 16 = 128 microbatches.
#[test]
fn the_qwen3_235b_h100_recipe_estimates_with_ep_above_dp() {
    let r = resolve(qwen3_235b(32, "none"));
    assert_eq!((r.dp, r.expert_dp()), (16, 1));
    let layout = Layout::of(&r);
    assert!(layout.is_folded());
    assert_eq!(
        layout.group_of(GroupKind::Ep, 0),
        (0..32).collect::<Vec<_>>()
    );
    assert_eq!(
        layout.group_of(GroupKind::Ep, 40),
        (32..64).collect::<Vec<_>>()
    );
    assert_eq!(layout.group_geometry(GroupKind::Ep, 0), (32, 8, 4));
    assert_eq!(layout.group_of(GroupKind::ExpertDp, 5), vec![5]);
    // The dense DP group keeps its stride tp = 2 over the stage's 32 ranks.
    assert_eq!(
        layout.group_of(GroupKind::Dp, 0),
        (0..16).map(|i| 2 * i).collect::<Vec<_>>()
    );
    let e = estimate(&r).expect("estimate");
    let ep = group_info(&e, GroupKind::Ep);
    assert_eq!(ep.size, 32);
    assert!(ep.crosses_nodes);
    let per_exchange = 2048u64 * 8 * 4096 * 2 * 31 / 32;
    assert_eq!(
        e.communication.per_step_bytes_per_gpu[CommKind::Ep],
        per_exchange * 4 * 12 * 128
    );
    assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0);
    eprintln!(
        "qwen3-235b recipe: step {:.3} s, MFU {:.3}, peak {:.2} GiB (fits {})",
        e.time.step_s,
        e.throughput.mfu,
        e.memory.per_gpu_max_bytes as f64 / (1u64 << 30) as f64,
        e.memory.fits
    );
}

/// Memory follows the expert grid: a rank holds experts / ep of each MoE layer's 128 experts
/// (3 x 4096 x 1536 weights each, SwiGLU), and the distributed optimizer shards their state
/// over expert dp = 32 / ep. From ep 16 to ep 32 a middle stage (12 MoE layers) loses 128 x
/// (1/16 - 1/32) experts' bf16 weights per layer, while its optimizer state stays (the
/// experts / ep shard over 32 / ep replicas is experts / 32 either way).
#[test]
fn expert_memory_follows_the_expert_grid() {
    let at = |ep: u32| -> (Resolved, parsim::estimate::Estimate) {
        let r = resolve(qwen3_235b(ep, "full"));
        let e = estimate(&r).expect("estimate");
        (r, e)
    };
    let ((r16, e16), (r32, e32)) = (at(16), at(32));
    assert_eq!((r16.expert_dp(), r32.expert_dp()), (2, 1));
    let expert = 3u64 * 4096 * 1536;
    let bytes = r32.config.training.weight_bytes();
    let (s16, s32) = (&e16.memory.stages[3], &e32.memory.stages[3]);
    assert_eq!(
        s16.weights - s32.weights,
        12 * (128 / 16 - 128 / 32) * expert * bytes
    );
    assert_eq!(s16.optimizer, s32.optimizer);
}

/// `search` takes the recipe's mix: restricted to tp 2, pp 8, vpp 4, ep 32 and micro batch 1,
/// it enumerates ep 32 (a divisor of tp x cp x dp / expert_tp = 32 that divides 128 experts,
/// above dp 16) and ranks a fitting variant of it.
#[test]
fn search_offers_the_recipes_ep_above_dp() {
    let mut base = resolve(qwen3_235b(32, "none")).config;
    base.parallel.ep = 1;
    let spec = SearchSpec {
        base,
        mbs_max: 1,
        top: 3,
        constraints: ["tp=2", "pp=8", "vpp=4", "ep=32", "cp=1", "zero=1"]
            .iter()
            .map(|c| Constraint::parse(c).unwrap())
            .collect(),
        exhaustive: false,
    };
    let r = search(&spec, &|_, _| {}, &AtomicBool::new(false)).expect("search");
    assert!(!r.top.is_empty(), "no fitting mix: {:?}", r.pruned);
    for x in &r.top {
        assert_eq!((x.mix.tp, x.mix.pp, x.mix.vpp, x.mix.ep), (2, 8, 4, 32));
        assert!(x.estimate.memory.fits);
    }
}

/// The all-to-all is priced by where the EP group's members sit: the recipe's EP group (ranks
/// 0..31) spans four 8-GPU nodes, each its own NVLink domain on H100s, so it runs on the NIC
/// network; in NVLink domains of 32 GPUs (four nodes) the same members share one domain and it
/// runs on NVLink (the network's intra-domain latency); in domains of 16 it spans two. The bytes
/// do not move, the exposed expert all-to-all shrinks inside one domain.
#[test]
fn the_expert_all_to_all_is_priced_by_its_members_domains() {
    let at = |domain: Option<u32>| {
        let mut v = qwen3_235b(32, "full");
        if let Some(d) = domain {
            v["cluster"]["nvlink_domain_size"] = d.into();
        }
        let r = resolve(v);
        let layout = Layout::of(&r);
        let e = estimate(&r).expect("estimate");
        (r, layout, e)
    };
    let (r8, l8, e8) = at(None);
    let (r32, l32, e32) = at(Some(32));
    let (_, l16, _) = at(Some(16));
    assert_eq!(l8.group_geometry(GroupKind::Ep, 0), (32, 8, 4));
    assert_eq!(l16.group_geometry(GroupKind::Ep, 0), (32, 16, 2));
    assert_eq!(l32.group_geometry(GroupKind::Ep, 0), (32, 32, 1));
    let (n8, n32) = (
        parsim::network::Network::new(&l8, &r8.gpu),
        parsim::network::Network::new(&l32, &r32.gpu),
    );
    assert!(n8.crosses_nodes(GroupKind::Ep) && !n32.crosses_nodes(GroupKind::Ep));
    assert_eq!(
        n32.latency_s(GroupKind::Ep),
        r32.gpu.links.intra_node.latency_s
    );
    assert!(group_info(&e8, GroupKind::Ep).crosses_nodes);
    assert!(!group_info(&e32, GroupKind::Ep).crosses_nodes);
    assert_eq!(
        e8.communication.per_step_bytes_per_gpu[CommKind::Ep],
        e32.communication.per_step_bytes_per_gpu[CommKind::Ep]
    );
    let (x8, x32) = (
        e8.time.exposed_comm_by_group_s[CommKind::Ep],
        e32.time.exposed_comm_by_group_s[CommKind::Ep],
    );
    eprintln!("exposed expert all-to-all: {x8:.3} s over 4 domains, {x32:.3} s in one");
    assert!(x32 < x8);
}
