//! The search space: every mix of tp, cp and its exchange, pp with its pipeline
//! arrangements, ep, ZeRO stage, micro batch and recomputation that the GPU count allows.

use super::balance;
use super::grid::splits;
use super::mix::Mix;
use super::options::{expert_parallel_sizes, micro_batches, pipelines};
use crate::config::rules::ulysses_splits_heads;
use crate::config::{Config, CpComm, Recompute};

/// Every mix the enumeration produces for `base` (before validation and pruning), tensor
/// parallelism inside the NVLink domain its profile gives (the node where it does not load).
pub fn enumerate(base: &Config, mbs_max: u64) -> Vec<Mix> {
    let c = &base.cluster;
    let domain = crate::config::GpuProfile::load(&c.gpu)
        .map_or(c.nvlink_domain_size.unwrap_or(c.per_node()), |g| {
            c.nvlink_domain(&g)
        });
    enumerate_in(base, mbs_max, domain)
}

/// [`enumerate`] with tensor parallelism inside NVLink domains of `domain` GPUs: the mixes
/// of every split the divisibility rules keep ([`super::grid::splits`]).
pub(super) fn enumerate_in(base: &Config, mbs_max: u64, domain: u32) -> Vec<Mix> {
    let ends = balance::end_costs(base);
    let mut out = Vec::new();
    for (split, _) in splits(base, mbs_max, domain)
        .into_iter()
        .filter(|(_, skip)| skip.is_none())
    {
        let (tp, cp, pp, dp) = (split.tp, split.cp, split.pp, split.dp);
        push_mixes_of_split(base, mbs_max, [tp, cp, pp, dp], ends, &mut out);
    }
    out
}

/// Every mix of one split of the GPUs into `[tp, cp, pp, dp]`: the CP exchanges it allows,
/// the pipeline arrangements of its pp, the expert sizes of its tp x cp x dp, every ZeRO
/// stage, micro batch dividing the global batch over dp and recomputation, in the search's
/// order (the pipeline innermost, so that neighbours share a timed ledger).
fn push_mixes_of_split(
    base: &Config,
    mbs_max: u64,
    [tp, cp, pp, dp]: [u64; 4],
    ends: Option<balance::EndCosts>,
    out: &mut Vec<Mix>,
) {
    let m = &base.model;
    let gbs = base.training.global_batch_size;
    // Ulysses only where each CP rank gets whole heads (config rules' own test).
    let ulysses = ulysses_splits_heads(base, tp as u32, cp as u32);
    let all: Vec<CpComm> = CpComm::ALL
        .iter()
        .copied()
        .filter(|&c| c != CpComm::A2a || ulysses)
        .collect();
    let comms: &[CpComm] = if cp > 1 { &all } else { &[CpComm::P2p] };
    let pp32 = pp as u32;
    let mut pipes = pipelines(m.num_layers, pp32, ends);
    pipes.sort_by_key(|p| p.1.as_str());
    for ep in expert_parallel_sizes(base, tp * cp * dp) {
        for zero in 0..=3u8 {
            for mbs in micro_batches(mbs_max, gbs) {
                // mbs <= gbs and dp <= num_gpus: the product fits in u64.
                if gbs % (mbs * dp) != 0 {
                    continue;
                }
                for recompute in Recompute::ALL.iter().copied() {
                    for &cp_comm in comms {
                        for &(vpp, schedule, first, last, slots) in &pipes {
                            out.push(Mix {
                                tp: tp as u32,
                                cp: cp as u32,
                                cp_comm,
                                pp: pp32,
                                vpp,
                                schedule,
                                first_stage_layers: first,
                                last_stage_layers: last,
                                slots,
                                ep: ep as u32,
                                zero,
                                mbs,
                                recompute,
                            });
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::options::{divisors, micro_batches};
    use super::{balance, enumerate_in, push_mixes_of_split, Mix};
    use crate::config::{Config, CpComm, GpuProfile, Layer, Resolved};

    /// Ulysses is enumerated exactly where validation accepts it: Llama-3-70B's 8 KV heads
    /// split over tp x cp up to 8 (tp 2 x cp 4 yes, tp 4 x cp 4 no), and every other CP
    /// exchange is kept.
    #[test]
    fn ulysses_is_enumerated_where_its_rule_holds() {
        let base = Config::from_layers(&[Layer::overrides(serde_json::json!({
            "model": {"preset": "llama3-70b"},
            "cluster": {"num_gpus": 64, "gpus_per_node": 8, "gpu": "h100-sxm"},
            "training": {"seq_length": 8192, "global_batch_size": 64}
        }))])
        .unwrap();
        let gpu = std::sync::Arc::new(GpuProfile::load(&base.cluster.gpu).unwrap());
        let mixes = enumerate_in(&base, 1, 8);
        let a2a = |tp: u32, cp: u32| {
            mixes
                .iter()
                .any(|m| m.tp == tp && m.cp == cp && m.cp_comm == CpComm::A2a)
        };
        assert!(a2a(2, 4) && a2a(1, 8) && !a2a(4, 4) && !a2a(8, 2));
        assert!(mixes
            .iter()
            .any(|m| m.tp == 4 && m.cp == 4 && m.cp_comm == CpComm::P2p));
        // Each enumerated Ulysses mix passes the rule (it may fail others).
        for m in mixes.iter().filter(|m| m.cp_comm == CpComm::A2a) {
            if let Err(e) = Resolved::with_gpu(m.apply(&base), gpu.clone()) {
                assert!(!e.to_string().contains("Ulysses"), "{m}: {e}");
            }
        }
    }

    #[test]
    fn micro_batches_are_the_powers_of_two_and_a_maximum_that_is_not_one() {
        let tried = |max, gbs| micro_batches(max, gbs).collect::<Vec<_>>();
        assert_eq!(tried(8, 1024), [1, 2, 4, 8]);
        // A recipe's micro batch of 3 (GPT-OSS-20B on B300) is tried.
        assert_eq!(tried(3, 24), [1, 2, 3]);
        // Capped by the global batch: 6 cannot divide 4, and 4 is already a power of two.
        assert_eq!(tried(6, 4), [1, 2, 4]);
        assert_eq!(tried(u64::MAX, 3), [1, 2]);
    }

    /// The enumeration as nested loops over tp, cp and pp with their filters inline (before
    /// the splits and their rules moved to grid.rs; cp = 1 no longer needs an even sequence),
    /// each split's mixes built as the search builds them: the splits are what is compared.
    fn enumerate_by_loops(base: &Config, mbs_max: u64, domain: u32) -> Vec<Mix> {
        let m = &base.model;
        let n = base.cluster.num_gpus as u64;
        let per_node = u64::from(domain);
        let heads = m.num_attention_heads as u64;
        let kv = m.num_query_groups as u64;
        let layers = m.num_layers;
        let seq = base.training.seq_length;
        let ends = balance::end_costs(base);
        let mut out = Vec::new();
        for tp in divisors(n.min(per_node))
            .into_iter()
            .filter(|t| n % t == 0 && heads % t == 0 && (m.mla.is_some() || kv % t == 0))
        {
            for cp in divisors(n / tp)
                .into_iter()
                .filter(|&c| c.is_power_of_two() && (c == 1 || seq % (2 * c) == 0) && c <= 64)
            {
                for pp in divisors(n / (tp * cp))
                    .into_iter()
                    .filter(|&p| p <= layers as u64)
                {
                    let dp = n / (tp * cp * pp);
                    push_mixes_of_split(base, mbs_max, [tp, cp, pp, dp], ends, &mut out);
                }
            }
        }
        out
    }

    /// The mixes built from the kept splits are the loops' mixes, in their order, for dense,
    /// MoE and MLA models, NVLink domains smaller than and not dividing the GPU count, and
    /// odd sequences.
    #[test]
    fn kept_splits_give_the_loops_mixes() {
        for (v, domain) in [
            (
                serde_json::json!({"model": {"preset": "llama3-70b"}, "cluster": {"num_gpus": 64},
                "training": {"seq_length": 8192, "global_batch_size": 64}}),
                8,
            ),
            (
                serde_json::json!({"model": {"preset": "llama3-8b"}, "cluster": {"num_gpus": 16},
                "training": {"seq_length": 4095, "global_batch_size": 48}}),
                12,
            ),
            (
                serde_json::json!({"model": {"preset": "mixtral-8x7b"}, "cluster": {"num_gpus": 32},
                "training": {"seq_length": 4096, "global_batch_size": 32}}),
                8,
            ),
            (
                serde_json::json!({"model": {"preset": "deepseek-v3", "num_layers": 8},
                "cluster": {"num_gpus": 24}, "training": {"global_batch_size": 24}}),
                4,
            ),
        ] {
            let base = Config::from_layers(&[Layer::overrides(v)]).unwrap();
            for mbs_max in [1, 3, 8] {
                let new = enumerate_in(&base, mbs_max, domain);
                assert!(!new.is_empty());
                assert_eq!(new, enumerate_by_loops(&base, mbs_max, domain));
            }
        }
    }
}
