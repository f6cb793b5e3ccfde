//! What the model's own error says about its figures, in plain sentences: whether a search's
//! leading mixes lie inside the step-time interval of the first (so the model does not tell
//! them apart), whether an interval rests on measured steps of its own regime, and whether the
//! interval's fast end claims more than any published run on the GPU reached.

use crate::estimate::Estimate;
use crate::search::Ranked;

/// The best MFU of a published run on a GPU and where it comes from (the calibration data's
/// source and row), as the caller found it.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedBest {
    pub mfu: f64,
    pub source: String,
}

/// Lines on a search's leading mixes: how many lie inside the first's interval, and what the
/// first's interval rests on.
pub fn ranking_lines(top: &[Ranked], best: Option<&PublishedBest>) -> Vec<String> {
    let Some(lead) = top.first() else {
        return Vec::new();
    };
    let t = &lead.estimate.time;
    let mut out = Vec::new();
    let inside = top
        .iter()
        .take_while(|r| r.estimate.time.step_s <= t.step_s_p90)
        .count();
    if inside >= 2 {
        let last = &top[inside - 1].estimate.time;
        let spread = 100.0 * (last.step_s / t.step_s - 1.0);
        let rows = if inside == top.len() {
            format!("all {inside} mixes listed")
        } else {
            format!("#1 to #{inside}")
        };
        out.push(format!(
            "note: {rows} lie within {spread:.1}% of #1's step time, inside the model's own error for #1 (p10 {:+.0}% / p90 {:+.0}%): the model does not tell them apart, so measure the leading few before choosing",
            100.0 * (t.step_s_p10 / t.step_s - 1.0),
            100.0 * (t.step_s_p90 / t.step_s - 1.0),
        ));
    }
    out.extend(
        estimate_lines(&lead.estimate, best)
            .into_iter()
            .map(|l| l.replacen("note: the ", "note: #1: the ", 1)),
    );
    out
}

/// Lines on one estimate: its regime without measured steps of its own, and an optimistic
/// end above the best published run on its GPU.
pub fn estimate_lines(e: &Estimate, best: Option<&PublishedBest>) -> Vec<String> {
    let mut out = Vec::new();
    let iv = &e.step_interval;
    if !iv.pooled_over.is_empty() {
        let dims: Vec<&str> = iv.pooled_over.iter().map(|d| d.key()).collect();
        let own = match iv.regime_residuals {
            0 => "no measured step of its own".to_string(),
            n => format!("only {n} measured step(s) of its own"),
        };
        out.push(format!(
            "note: the interval's regime ({}) holds {own}: the interval is borrowed from neighbouring regimes (pooled over {}), so it is a guess at the error, not a measurement of it",
            crate::interval::Regime::describe(&iv.regime),
            dims.join(" and ")
        ));
    }
    if let Some(b) = best {
        let fast = e.throughput.mfu_p90;
        if fast > b.mfu {
            out.push(format!(
                "note: the interval's fast end, MFU {:.1}%, is above every published run on {} in parsim's calibration data (best {:.1}%, {}): read it as the model's error band, not as a throughput to plan on",
                100.0 * fast,
                e.gpu,
                100.0 * b.mfu,
                b.source
            ));
        }
    }
    out
}
