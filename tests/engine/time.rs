//! The time model: collective costs, link classes from the layout, overlaps, weak scaling,
//! and the step-time breakdown adding up.

use super::common::{est, resolve};
use parsim::config::GpuProfile;
use parsim::layout::{GroupKind, Layout};
use parsim::model::{CollectiveKind, CommKind};
use parsim::network::{ring_s, Network};
use proptest::prelude::*;
use serde_json::json;

#[test]
fn isolated_collectives_cost_alpha_plus_ring_factor_bytes_over_bandwidth() {
    // Alpha-beta model with ring factors (Thakur et al. 2005; NCCL's bus-bandwidth notes):
    // all-reduce alpha + 2(n-1)/n B/bw, all-gather and reduce-scatter alpha + (n-1)/n B/bw.
    let (alpha, bw, b) = (5e-6, 4.5e11, 1u64 << 30);
    for n in [2u32, 4, 8] {
        let nf = n as f64;
        let bf = b as f64;
        let ar = ring_s(CollectiveKind::AllReduce, bf, n, bw, alpha);
        assert!((ar - (alpha + 2.0 * (nf - 1.0) / nf * bf / bw)).abs() < 1e-15);
        for kind in [
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::AllToAll,
        ] {
            let t = ring_s(kind, bf, n, bw, alpha);
            assert!(
                (t - (alpha + (nf - 1.0) / nf * bf / bw)).abs() < 1e-15,
                "{kind:?}"
            );
        }
        assert!(
            (ring_s(CollectiveKind::SendRecv, bf, n, bw, alpha) - (alpha + bf / bw)).abs() < 1e-15
        );
    }
    assert_eq!(
        ring_s(CollectiveKind::AllReduce, 1e9, 1, bw, alpha),
        0.0,
        "a group of one sends nothing"
    );
}

#[test]
fn tp_inside_a_node_uses_nvlink_and_dp_across_nodes_the_network() {
    // The alpha-beta path (profiles without `links.nccl`); the NCCL path is checked against
    // nccl-tests in tests/calibration/nccl_busbw.rs and by its bounds below.
    let mut gpu = GpuProfile::load("h100-sxm").unwrap();
    gpu.links.nccl = None;
    // 32 GPUs, 8 per node, TP 8: TP groups are whole nodes; DP 4 spans 4 nodes.
    let layout = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 4, 1, 8).unwrap();
    let links = Network::new(&layout, &gpu);
    assert!(!links.crosses_nodes(GroupKind::Tp));
    assert!(links.crosses_nodes(GroupKind::Dp));
    let b = 256u64 << 20;
    let intra = &gpu.links.intra_node;
    let inter = &gpu.links.inter_node;
    let tp = links.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b, 8);
    let expect =
        intra.latency_s + 7.0 / 8.0 * b as f64 / (intra.bandwidth_bytes_per_s * intra.efficiency);
    assert!((tp - expect).abs() < 1e-12);
    // One GPU per node in each DP group: a flat ring at the inter-node link.
    let dp = links.collective_s(GroupKind::Dp, CollectiveKind::AllReduce, b, 4);
    let expect = inter.latency_s
        + 2.0 * 3.0 / 4.0 * b as f64 / (inter.bandwidth_bytes_per_s * inter.efficiency);
    assert!((dp - expect).abs() < 1e-12);
    // 16 GPUs with TP 1, DP 16: 8 per node over 2 nodes -> hierarchical all-reduce:
    // reduce-scatter in the node, all-reduce of B/8 across 2 nodes, all-gather in the node.
    let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, 1, 16, 1, 8).unwrap();
    let links = Network::new(&layout, &gpu);
    let t = links.collective_s(GroupKind::Dp, CollectiveKind::AllReduce, b, 16);
    let bf = b as f64;
    let rs = intra.latency_s + 7.0 / 8.0 * bf / (intra.bandwidth_bytes_per_s * intra.efficiency);
    let ar =
        inter.latency_s + 2.0 * 0.5 * (bf / 8.0) / (inter.bandwidth_bytes_per_s * inter.efficiency);
    assert!((t - (2.0 * rs + ar)).abs() < 1e-12);
}

#[test]
fn breakdown_adds_up_to_the_step() {
    for cfg in [
        json!({}),
        json!({"model": {"preset": "llama3-70b"}, "cluster": {"num_gpus": 64}, "parallel": {"tp": 8, "pp": 4, "vpp": 5, "schedule": "interleaved-1f1b", "cp": 2, "cp_comm": "zigzag"}, "training": {"global_batch_size": 64}}),
        json!({"model": {"preset": "mixtral-8x7b"}, "cluster": {"num_gpus": 32}, "parallel": {"tp": 2, "pp": 2, "ep": 8, "zero": 3, "schedule": "zb-h1"}, "training": {"global_batch_size": 64, "seq_length": 4096}}),
    ] {
        let e = est(cfg);
        let t = &e.time;
        let sum = t.compute_s + t.exposed_comm_s + t.bubble_s + t.optimizer_s;
        assert!(
            ((sum - t.step_s) / t.step_s).abs() < 1e-9,
            "{sum} vs {}",
            t.step_s
        );
        let tokens = (e.config.training.global_batch_size * e.config.training.seq_length) as f64;
        assert!((e.throughput.tokens_per_s * t.step_s - tokens).abs() < 1e-6 * tokens);
        let world = e.config.cluster.num_gpus as f64;
        let peak = GpuProfile::load(&e.config.cluster.gpu)
            .unwrap()
            .peak_flops
            .bf16;
        assert!(
            (e.throughput.mfu - e.flops.per_step_model / (t.step_s * world * peak)).abs() < 1e-12
        );
    }
}

fn config(
    tp: u32,
    pp: u32,
    cp: u32,
    dp: u32,
    zero: u8,
    gpn: u32,
    mbs_per_rank: u64,
) -> serde_json::Value {
    json!({
        "model": {"preset": "llama2-7b"},
        "cluster": {"num_gpus": tp * pp * cp * dp, "gpus_per_node": gpn},
        "parallel": {"tp": tp, "pp": pp, "cp": cp, "zero": zero, "sp": tp > 1},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": mbs_per_rank * dp as u64}
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn turning_an_overlap_on_never_slows_the_step(
        tl in 0u32..=2, pl in 0u32..=1, cl in 0u32..=1, zero in 0u8..=3,
    ) {
        let (tp, pp, cp) = (1u32 << tl, 1u32 << pl, 1u32 << cl);
        let base = config(tp, pp, cp, 4, zero, 8, 8);
        let step = |knob: &str, on: bool| {
            let mut c = base.clone();
            c["parallel"][knob] = on.into();
            est(c).time.step_s
        };
        for knob in ["tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "cp_comm_overlap"] {
            prop_assert!(step(knob, true) <= step(knob, false) * (1.0 + 1e-12), "{knob}");
        }
    }

    #[test]
    fn weak_scaling_changes_only_the_dp_term(tl in 0u32..=2, pl in 0u32..=1, dl in 0u32..=3) {
        // Doubling DP at a fixed micro batch and microbatches per rank (ZeRO-0: the optimizer
        // does not shard) changes the step only by the data-parallel communication. Nodes hold
        // exactly one TP x PP... block so no other group changes its links.
        let (tp, pp, dp) = (1u32 << tl, 1u32 << pl, 1u32 << dl);
        let gpn = tp;
        let a = est(config(tp, pp, 1, dp, 0, gpn, 8)).time;
        let b = est(config(tp, pp, 1, 2 * dp, 0, gpn, 8)).time;
        let d_step = b.step_s - a.step_s;
        let d_dp = b.exposed_comm_by_group_s[CommKind::Dp] - a.exposed_comm_by_group_s[CommKind::Dp];
        prop_assert!((d_step - d_dp).abs() <= 1e-9 * a.step_s, "{d_step} vs {d_dp}");
        prop_assert!((b.compute_s - a.compute_s).abs() <= 1e-12 * a.compute_s);
    }
}

#[test]
fn contiguous_ring_is_slower_than_zigzag_under_a_causal_mask() {
    // The contiguous layout's last CP rank does (2cp-1)/cp of the average causal work
    // (Brandon et al. 2023, "Striped Attention"; the zigzag split balances it).
    let run = |comm: &str| {
        let r = resolve(
            json!({"cluster": {"num_gpus": 8}, "parallel": {"tp": 1, "sp": false, "cp": 8, "cp_comm": comm},
                               "training": {"seq_length": 32768, "global_batch_size": 8}}),
        );
        let l = parsim::model::Ledger::build(&r);
        l.dense
            .ops
            .iter()
            .find(|o| o.name == "attn.core")
            .unwrap()
            .rank_flops
            .fwd
    };
    assert!(((run("p2p") / run("zigzag")) - 15.0 / 8.0).abs() < 1e-12);
}

/// `cluster.nics_per_node` and `cluster.nic_bandwidth_bytes_per_s`: each GPU's share of the
/// network is nics x rate / gpus per node; with half the NICs an inter-node ring of one GPU
/// per node moves its bytes at half the rate (the latency unchanged). Bad values name the field.
#[test]
fn nics_per_node_share_the_network_among_a_nodes_gpus() {
    let base = json!({"cluster": {"num_gpus": 32}, "parallel": {"tp": 8}});
    let full = resolve(base.clone());
    let mut half_cfg = base.clone();
    half_cfg["cluster"]["nics_per_node"] = json!(4);
    let half = resolve(half_cfg);
    let (f, h) = (&full.gpu.links.inter_node, &half.gpu.links.inter_node);
    assert_eq!(h.bandwidth_bytes_per_s, f.bandwidth_bytes_per_s / 2.0);
    let layout = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 4, 1, 8).unwrap();
    let b = 1u64 << 30;
    let t = |gpu: &GpuProfile| {
        Network::new(&layout, gpu).collective_s(GroupKind::Dp, CollectiveKind::AllReduce, b, 4)
    };
    let alpha_beta = |gpu: &GpuProfile| {
        let mut g = gpu.clone();
        g.links.nccl = None;
        t(&g)
    };
    let (tf, th) = (alpha_beta(&full.gpu), alpha_beta(&half.gpu));
    assert!(((th - f.latency_s) / (tf - f.latency_s) - 2.0).abs() < 1e-9);
    // NCCL's model (the profile's default): 1 GiB is bandwidth-bound, so half the NICs take
    // nearly twice as long (latencies unchanged), and the rail's line rate bounds the bus
    // bandwidth: 2(n-1)/n B / t <= 50 GB/s.
    let (tf, th) = (t(&full.gpu), t(&half.gpu));
    assert!((1.8..=2.0).contains(&(th / tf)), "{}", th / tf);
    assert!(1.5 * b as f64 / tf <= 50e9 * (1.0 + 1e-9));
    // Eight 400 Gb/s NICs on 8 GPUs: 50 GB/s each, whatever the profile says.
    let mut rate_cfg = base.clone();
    rate_cfg["cluster"]["nic_bandwidth_bytes_per_s"] = json!(50e9);
    let r = resolve(rate_cfg);
    assert_eq!(r.gpu.links.inter_node.bandwidth_bytes_per_s, 50e9);
    for (field, bad) in [
        ("nics_per_node", json!(0)),
        ("nics_per_node", json!(65)),
        ("nic_bandwidth_bytes_per_s", json!(-1.0)),
        ("nic_bandwidth_bytes_per_s", json!(0.0)),
    ] {
        let mut c = base.clone();
        c["cluster"][field] = bad.clone();
        let cfg = parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(c)])
            .expect("parses");
        let err = parsim::config::Resolved::new(cfg)
            .expect_err("rejected")
            .to_string();
        assert!(
            err.contains(&format!("cluster.{field}")),
            "{field}={bad}: {err}"
        );
    }
}
