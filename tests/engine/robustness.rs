//! No input reaches a panic: random configurations (valid or not, including huge sizes) either
//! estimate or fail validation with an error (overflow checks are on in test builds).

use parsim::config::{Config, Layer, Resolved};
use proptest::prelude::*;
use serde_json::json;

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=8,
        Just(0u64),
        1u64..=100_000,
        Just(1u64 << 40),
        Just(u32::MAX as u64)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_configurations_never_panic(
        preset in prop::sample::select(vec!["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b"]),
        tp in 0u32..=16, pp in 0u32..=8, cp in 0u32..=8, ep in 0u32..=64, etp in 0u32..=16, vpp in 0u32..=4, zero in 0u8..=4,
        gpus in prop_oneof![1u32..=64, Just(16384u32), Just(u32::MAX)],
        seq in size(), mbs in size(), gbs in size(), layers in size(), hidden in size(),
        schedule in prop::sample::select(vec!["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]),
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
        flash in any::<bool>(),
    ) {
        let v = json!({
            "model": {"preset": preset, "num_layers": layers.min(u32::MAX as u64), "hidden_size": hidden},
            "cluster": {"num_gpus": gpus},
            "parallel": {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "expert_tp": etp, "vpp": vpp, "zero": zero, "schedule": schedule},
            "training": {"seq_length": seq, "micro_batch_size": mbs, "global_batch_size": gbs,
                         "recompute": recompute, "flash_attention": flash}
        });
        if let Ok(cfg) = Config::from_layers(&[Layer::overrides(v)]) {
            if let Ok(r) = Resolved::new(cfg) {
                let _ = parsim::estimate::estimate(&r);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn valid_mixes_estimate_to_finite_consistent_numbers(
        preset in prop::sample::select(vec!["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "llama3-70b"]),
        tl in 0u32..=3, pl in 0u32..=3, cl in 0u32..=2, dl in 0u32..=4, zero in 0u8..=3, mbs_l in 0u32..=2,
        schedule in prop::sample::select(vec!["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]),
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
        cp_comm in prop::sample::select(vec!["p2p", "zigzag", "allgather", "a2a"]),
        el in 0u32..=5, etl in 0u32..=2,
    ) {
        let (tp, pp, cp, dp) = (1u32 << tl, 1u32 << pl, 1u32 << cl, 1u32 << dl);
        let vpp = match schedule { "interleaved-1f1b" | "zb-v" | "dualpipe-v" => 2, _ => 1 };
        let schedule = if pp == 1 { "1f1b" } else { schedule };
        let vpp = if pp == 1 { 1 } else { vpp };
        let mbs = 1u64 << mbs_l;
        // Expert parallelism on Megatron-Core's expert grid, up to 32 (above dp where
        // expert_tp x ep fits tp x cp x dp); a dense model keeps ep 1.
        let moe = matches!(preset, "mixtral-8x7b" | "deepseek-v3");
        let (ep, etp) = if moe { (1u32 << el, 1u32 << etl) } else { (1, 1) };
        let v = json!({
            "model": {"preset": preset},
            "cluster": {"num_gpus": tp * pp * cp * dp},
            "parallel": {"tp": tp, "sp": tp > 1, "pp": pp, "cp": cp, "cp_comm": cp_comm, "vpp": vpp, "zero": zero, "schedule": schedule, "ep": ep, "expert_tp": etp},
            "training": {"seq_length": 4096, "micro_batch_size": mbs, "global_batch_size": mbs * dp as u64 * 4 * pp as u64, "recompute": recompute}
        });
        let cfg = Config::from_layers(&[Layer::overrides(v)]).unwrap();
        if let Ok(r) = Resolved::new(cfg) {
            let e = parsim::estimate::estimate(&r).unwrap();
            prop_assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0);
            prop_assert!(e.throughput.mfu > 0.0 && e.throughput.mfu < 1.0, "mfu {}", e.throughput.mfu);
            prop_assert!(e.memory.per_gpu_max_bytes > 0);
            prop_assert!(e.schedule.bubble_fraction >= 0.0);
            prop_assert_eq!(e.schedule.peak_inflight_microbatches.len(), pp as usize);
        }
    }
}
