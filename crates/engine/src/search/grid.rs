//! The splits of a GPU count into tp x cp x pp x dp that a search starts from, each kept or
//! skipped with the divisibility rule that skips it (before any mix is built): tensor
//! parallelism dividing an NVLink domain and the heads, context parallelism a power of
//! two up to 64 that splits the sequence into 2 x cp even chunks, at most one pipeline stage per layer and a
//! split of the layers, a micro batch that divides the global batch over dp, and an expert
//! grid for an MoE model. The enumeration builds mixes from the kept splits; a search that
//! finds none names the rules ([`super::NoFit`]).

use super::balance;
use super::options::{divisors, expert_parallel_sizes, micro_batches, pipelines};
use crate::config::Config;

/// One split of the GPUs: tp, cp, pp and the dp they leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Split {
    pub tp: u64,
    pub cp: u64,
    pub pp: u64,
    pub dp: u64,
}

/// The rule a skipped split breaks: the field it names and the rule with its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Skip {
    pub field: &'static str,
    pub rule: String,
}

/// Every split of `base`'s GPUs in tp, cp, pp order (each increasing), with the rule that
/// skips it, if any; tensor parallelism within NVLink domains of `domain` GPUs.
pub(super) fn splits(base: &Config, mbs_max: u64, domain: u32) -> Vec<(Split, Option<Skip>)> {
    let n = u64::from(base.cluster.num_gpus);
    let mut out = Vec::new();
    for tp in divisors(n) {
        for cp in divisors(n / tp) {
            for pp in divisors(n / (tp * cp)) {
                let s = Split {
                    tp,
                    cp,
                    pp,
                    dp: n / (tp * cp * pp),
                };
                out.push((s, skip(base, mbs_max, domain, s)));
            }
        }
    }
    out
}

/// The first rule the enumeration applies that `s` breaks.
fn skip(base: &Config, mbs_max: u64, domain: u32, s: Split) -> Option<Skip> {
    let m = &base.model;
    let t = &base.training;
    let heads = u64::from(m.num_attention_heads);
    let kv = u64::from(m.num_query_groups);
    let rule = |field, rule: String| Some(Skip { field, rule });
    // Tensor parallelism tiles one NVLink domain (or the whole cluster when it is smaller).
    let tile = u64::from(domain).min(s.tp * s.cp * s.pp * s.dp);
    if tile % s.tp != 0 {
        return rule(
            "parallel.tp",
            format!("tp divides the NVLink domain ({tile} GPUs)"),
        );
    }
    if heads % s.tp != 0 || (m.mla.is_none() && kv % s.tp != 0) {
        return rule(
            "parallel.tp",
            format!("tp divides the attention heads ({heads}) and KV heads ({kv})"),
        );
    }
    if !s.cp.is_power_of_two() || s.cp > 64 {
        return rule("parallel.cp", "cp is a power of two up to 64".into());
    }
    if s.cp > 1 && t.seq_length % (2 * s.cp) != 0 {
        return rule(
            "training.seq_length",
            format!(
                "seq_length ({}) splits into 2 x cp chunks (load-balanced CP)",
                t.seq_length
            ),
        );
    }
    if s.pp > u64::from(m.num_layers) {
        return rule(
            "parallel.pp",
            format!("pp is at most num_layers ({})", m.num_layers),
        );
    }
    let ends = balance::end_costs(base);
    // pp <= num_layers, a u32.
    if pipelines(m.num_layers, s.pp as u32, ends).is_empty() {
        return rule(
            "model.num_layers",
            format!("{} layers split over pp {}", m.num_layers, s.pp),
        );
    }
    if expert_parallel_sizes(base, s.tp * s.cp * s.dp).is_empty() {
        return rule(
            "parallel.ep",
            "an ep divides the experts and the expert grid".into(),
        );
    }
    let gbs = t.global_batch_size;
    if !micro_batches(mbs_max, gbs).any(|mbs| gbs % (mbs * s.dp) == 0) {
        return rule(
            "training.global_batch_size",
            format!("global_batch_size ({gbs}) divides into micro batches (up to {mbs_max}) x dp"),
        );
    }
    None
}
