//! `parsim execute`'s measured MoE load: the hottest EP rank's received rows over its uniform
//! share, and the `moe_load_imbalance` that makes the engine's hottest rank receive as many
//! (docs/engine.md, MoE load), so that a user can feed it back to `estimate`.

use parsim::model::imbalance_of_rank_load;
use parsim_executor::report::RankReport;
use serde::Serialize;

/// The run's MoE load, from every rank's [`parsim_executor::report::MoeLoad`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MoeLoadOut {
    /// The (first) rank whose experts received the most rows over its uniform share.
    pub hottest_rank: u32,
    /// Its received rows over its uniform share (what a balanced router sends it).
    pub hottest_rank_load: f64,
    /// The most loaded expert's rows over an expert's uniform share (any rank).
    pub hottest_expert_load: f64,
    /// The engine's `moe_load_imbalance` whose hottest rank receives `hottest_rank_load`:
    /// 1 + (load - 1) x E / ep, and 1 where no rank receives more than its share.
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
    let raw = imbalance_of_rank_load(load, experts as u64, ep as u64);
    let mut warnings = Vec::new();
    if raw < 1.0 {
        warnings.push(format!(
            "MoE load: the hottest EP rank (rank {hot}) received {load:.3}x its uniform share \
             (the expert capacity dropped assignments); model.moe_load_imbalance is at least 1, \
             so the prediction counts more rows than were kept"
        ));
    }
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
            imbalance: raw.max(1.0),
        },
        warnings,
    ))
}

/// One line of `execute`'s text output.
pub fn moe_load_text(m: &MoeLoadOut) -> String {
    let then = if m.hottest_rank_load < 1.0 {
        "(its least; the prediction counts more rows than were kept)"
    } else {
        "makes the engine's hottest rank receive as many"
    };
    format!(
        "MoE load: hottest EP rank {} received {:.3}x its uniform share (hottest expert {:.3}x); \
         --moe-load-imbalance {:.3} {then}\n",
        m.hottest_rank, m.hottest_rank_load, m.hottest_expert_load, m.imbalance
    )
}
