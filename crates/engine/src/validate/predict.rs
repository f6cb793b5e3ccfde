//! Estimates a source row at its published settings: the reader's overlay merged over the
//! defaults exactly as a configuration file is (so the framework's defaults apply where the row
//! and its source say nothing), validated by the same rules as `parsim estimate`, estimated
//! with the shipped profile. A row the rules refuse is not expressible, with their message.

use super::{Degrees, Measured, Outcome, Predicted, Row, Source, SourceRow};
use crate::config::{Config, Layer, Resolved};
use crate::estimate::estimate;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// A configuration error as one line: the rules' "invalid configuration:" list joined by "; ".
fn one_line(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    let text = text.trim_start_matches("invalid configuration:");
    text.lines()
        .map(|l| l.trim().trim_start_matches("- "))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The outcome of one overlay.
pub fn outcome(overlay: &serde_json::Value, measured: &Measured) -> Outcome {
    let config = match Config::from_layers(&[Layer::overrides(overlay.clone())]) {
        Ok(c) => c,
        Err(e) => return Outcome::NotExpressible(one_line(e)),
    };
    let resolved = match Resolved::new(config) {
        Ok(r) => r,
        Err(e) => return Outcome::NotExpressible(one_line(e)),
    };
    let e = match estimate(&resolved) {
        Ok(e) => e,
        Err(e) => return Outcome::NotExpressible(one_line(e)),
    };
    let (lo, hi) = (e.time.step_s_p10, e.time.step_s_p90);
    let interval = lo.is_finite() && hi.is_finite() && lo > 0.0 && hi >= lo;
    Outcome::Predicted(Predicted {
        step_s: e.time.step_s,
        step_s_p10: interval.then_some(lo),
        step_s_p90: interval.then_some(hi),
        covered: measured
            .step_s
            .filter(|_| interval)
            .map(|m| lo <= m && m <= hi),
        fits: e.memory.fits,
        // What a run's memory log shows: the reserved peak (nvidia-smi, max_memory_reserved).
        peak_bytes: e
            .memory
            .reserved_peak_bytes()
            .unwrap_or(e.memory.per_gpu_max_bytes),
        regime: Some(e.step_interval.regime),
    })
}

/// Every row of `rows` estimated (in parallel), in the given order.
pub fn all(rows: &[(Source, SourceRow)], progress: &(dyn Fn(u64, u64) + Sync)) -> Vec<Row> {
    let total = rows.len() as u64;
    let done = AtomicU64::new(0);
    rows.par_iter()
        .map(|(source, r)| {
            let outcome = match &r.setup {
                Ok(overlay) => outcome(overlay, &r.measured),
                Err(why) => Outcome::NotExpressible(why.to_string()),
            };
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
            Row {
                source: *source,
                index: r.index,
                label: r.label.clone(),
                model: r.model.clone(),
                system: r.system.clone(),
                measured: r.measured,
                outcome,
                notes: r.notes.clone(),
                degrees: r.setup.as_ref().ok().and_then(Degrees::of_overlay),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_valid_overlay_is_estimated_and_a_refused_one_says_why() {
        let measured = Measured {
            step_s: Some(1.0),
            ..Measured::default()
        };
        let ok = json!({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm",
                        "num_gpus": 8}, "parallel": {"tp": 1},
                        "training": {"seq_length": 4096, "global_batch_size": 16}});
        let Outcome::Predicted(p) = outcome(&ok, &measured) else {
            panic!("expected a prediction");
        };
        assert!(p.step_s > 0.0 && p.peak_bytes > 0);
        // The interval brackets the step, and coverage is read off it.
        let (lo, hi) = (p.step_s_p10.unwrap(), p.step_s_p90.unwrap());
        assert!(lo <= p.step_s && p.step_s <= hi);
        assert_eq!(p.covered, Some(lo <= 1.0 && 1.0 <= hi));
        let bad = json!({"model": {"preset": "llama3-8b"}, "cluster": {"num_gpus": 8},
                         "parallel": {"tp": 3}});
        match outcome(&bad, &measured) {
            Outcome::NotExpressible(why) => assert!(why.contains("parallel.tp"), "{why}"),
            other => panic!("expected not expressible, got {other:?}"),
        }
        let unknown = json!({"model": {"preset": "no-such-model"}});
        assert!(matches!(
            outcome(&unknown, &measured),
            Outcome::NotExpressible(_)
        ));
    }
}
