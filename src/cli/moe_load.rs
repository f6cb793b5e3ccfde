//! `parsim execute`'s measured MoE load: the share of assignments the capacity dropped, the
//! hottest EP rank's received rows over its uniform share, and the `moe_dropped_fraction` and
//! `moe_load_imbalance` that make the engine's hottest rank send and receive as many
//! (docs/engine.md, MoE load), so that a user can feed them back to `estimate`.

use parsim::model::imbalance_of_rank_load;
use parsim_plan::run_report::RankReport;
use serde::Serialize;

/// The run's MoE load, from every rank's [`parsim_plan::run_report::MoeLoad`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MoeLoadOut {
    /// The (first) rank whose experts received the most rows over its uniform share.
    pub hottest_rank: u32,
    /// Its received rows over its uniform share (what a balanced router sends it).
    pub hottest_rank_load: f64,
    /// The most loaded expert's rows over an expert's uniform share (any rank).
    pub hottest_expert_load: f64,
    /// Assignments the capacity dropped over those routed, all ranks together: the engine's
    /// `moe_dropped_fraction` (0 without a capacity).
    pub dropped_fraction: f64,
    /// The engine's `moe_load_imbalance` whose hottest rank receives `hottest_rank_load` with
    /// that dropped share: 1 + (load / (1 - dropped) - 1) x E / ep (the imbalance of the kept
    /// assignments), and 1 where no rank receives more than the kept share.
    pub imbalance: f64,
}

/// The run's MoE load and its warnings; `None` without MoE layers (no rank routed anything).
pub fn moe_load(
    ranks: &[RankReport],
    experts: u32,
    ep: u32,
    topk: u32,
) -> Option<(MoeLoadOut, Vec<String>)> {
    // The first rank of the most loaded (TP ranks of one EP member receive alike).
    let (hot, load) = ranks
        .iter()
        .filter_map(|r| r.moe_load.rank_load().map(|l| (r.rank, l)))
        .reduce(|a, b| if b.1 > a.1 { b } else { a })?;
    let hottest_expert_load = ranks
        .iter()
        .filter_map(|r| r.moe_load.hottest_expert_load())
        .fold(0.0, f64::max);
    // Every rank routes as many; the kept ones are received once, so the hottest rank receives
    // at least the kept share (1 - dropped) and `raw` is at least 1 but for rounding. A rank's
    // drops are of its own tokens' assignments (its sequence shard's under TP).
    let assigned: u64 = ranks.iter().map(|r| r.moe_load.assigned).sum();
    let dropped: u64 = ranks.iter().map(|r| r.moe_dropped).sum();
    let dropped_fraction = if assigned > 0 {
        dropped as f64 / assigned as f64
    } else {
        0.0
    };
    let kept_load = if dropped < assigned {
        load / (1.0 - dropped_fraction)
    } else {
        1.0
    };
    let raw = imbalance_of_rank_load(kept_load, experts as u64, ep as u64);
    let mut warnings = Vec::new();
    let most = experts as f64 / topk.max(1) as f64;
    if raw > most {
        warnings.push(format!(
            "MoE load: the imbalance that reproduces the hottest EP rank ({raw:.3}) is above \
             model.moe_load_imbalance's bound E / top-k = {most}: its rank holds several hot experts"
        ));
    }
    Some((
        MoeLoadOut {
            hottest_rank: hot,
            hottest_rank_load: load,
            hottest_expert_load,
            dropped_fraction,
            imbalance: raw.max(1.0),
        },
        warnings,
    ))
}

/// One line of `execute`'s text output (with the dropped share's flag where any was dropped).
pub fn moe_load_text(m: &MoeLoadOut) -> String {
    let dropped = if m.dropped_fraction > 0.0 {
        format!(
            "; the capacity dropped {:.1}% of the assignments: --moe-dropped-fraction {:.4}",
            m.dropped_fraction * 100.0,
            m.dropped_fraction
        )
    } else {
        String::new()
    };
    format!(
        "MoE load: hottest EP rank {} received {:.3}x its uniform share (hottest expert {:.3}x){dropped}; \
         --moe-load-imbalance {:.3} makes the engine's hottest rank receive as many\n",
        m.hottest_rank, m.hottest_rank_load, m.hottest_expert_load, m.imbalance
    )
}
