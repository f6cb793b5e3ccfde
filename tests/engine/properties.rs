//! Invariants that must hold for any configuration.

use super::common::{est, resolve};
use parsim::model::Ledger;
use parsim::model::{chunks_per_rank, rank_params, LedgerSummary};
use proptest::prelude::*;
use serde_json::{json, Value};

fn cfg(preset: &str, tp: u32, pp: u32, cp: u32, dp: u32, ep: u32, zero: u8) -> Value {
    json!({
        "model": {"preset": preset, "make_vocab_size_divisible_by": 128},
        "cluster": {"num_gpus": tp * pp * cp * dp, "gpus_per_node": 8},
        "parallel": {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero": zero, "sp": tp > 1, "schedule": "1f1b"},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16 * dp}
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn shards_of_one_replica_sum_to_the_total(
        preset in prop::sample::select(vec!["llama3-8b", "llama2-7b", "mixtral-8x7b"]),
        tl in 0u32..=3, pl in 0u32..=2, el in 0u32..=1,
    ) {
        let (tp, pp) = (1u32 << tl, 1u32 << pl);
        let ep = if preset == "mixtral-8x7b" { 1u32 << el } else { 1 };
        let r = resolve(cfg(preset, tp, pp, 1, 2, ep, 1));
        let l = Ledger::build(&r);
        let s = LedgerSummary::of(&l, r.config.training.recompute);
        let mut dense = 0u64;
        let mut expert = 0u64;
        let mut replicated = 0u64;
        let mut expert_total = 0u64;
        for ch in chunks_per_rank(&r) {
            let p = rank_params(&ch, &s);
            dense += p.rank_dense * tp as u64;
            expert += p.rank_expert * ep as u64;
            replicated += p.tp_replicated;
            expert_total += p.expert_total;
        }
        let total = est(cfg(preset, tp, pp, 1, 2, ep, 1)).params.total;
        // Every TP rank holds a 1/tp shard of the split weights and a full copy of the
        // replicated ones (norms, router): tp - 1 extra copies of those.
        prop_assert_eq!(dense, total - expert_total + (tp as u64 - 1) * replicated);
        // Routed experts: the EP ranks (expert TP 1) together hold each expert once.
        prop_assert_eq!(expert, expert_total);
    }

    #[test]
    fn memory_never_grows_with_more_parallelism(
        tl in 0u32..=2, pl in 0u32..=2, cl in 0u32..=1, zero in 0u8..=2,
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
    ) {
        // Weights + gradients + optimizer + activations of the most loaded rank (buffers are
        // excluded: SP, pipeline, CP ring and ZeRO-3 buffers appear when a degree leaves 1).
        let states = |tp: u32, pp: u32, cp: u32, zero: u8| {
            let mut c = cfg("llama2-7b", tp, pp, cp, 2, 1, zero);
            c["training"]["recompute"] = recompute.into();
            est(c).memory.stages.iter().map(|s| s.total - s.buffers).max().unwrap()
        };
        let (tp, pp, cp) = (1u32 << tl, 1u32 << pl, 1u32 << cl);
        let base = states(tp, pp, cp, zero);
        prop_assert!(states(2 * tp, pp, cp, zero) <= base, "tp");
        prop_assert!(states(tp, 2 * pp, cp, zero) <= base, "pp");
        prop_assert!(states(tp, pp, 2 * cp, zero) <= base, "cp");
        prop_assert!(states(tp, pp, cp, zero + 1) <= base, "zero");
    }
}
