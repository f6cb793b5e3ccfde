//! Peak-memory intervals from measured residuals, per framework: every measured peak of the
//! most loaded GPU against parsim's prediction at the run's settings (ln measured /
//! predicted), and an estimate's p10/p90 peak is its predicted peak times the split-conformal
//! lower and upper order statistics of its framework's residuals ([`super::conformal_ranks`]).
//! A framework without enough residuals has no evidence: its interval is the widest spread any
//! framework with evidence shows (a stated width, never zero), as for step time. The interval always holds the prediction
//! itself, so p10 <= p50 <= p90. The file is generated (`COMMAND`), since the memory terms it
//! measures change.

use super::conformal_ranks;
use crate::config::Framework;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// The shipped memory residuals (rebuilt by [`COMMAND`]).
pub const SHIPPED_JSON: &str = include_str!("../../../../calibration/memory-residuals.json");

/// Where the file lives, relative to the repository root.
pub const PATH: &str = "calibration/memory-residuals.json";

/// The command that rebuilds the file.
pub const COMMAND: &str = "cargo run --release --example fit_published -- --write-residuals";

/// One measured peak against its prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryResidual {
    /// The table or measurement file the measured peak comes from.
    pub source: String,
    /// The row or run.
    pub row: String,
    /// The framework the run used (its `training.framework` in parsim).
    pub framework: Framework,
    /// ln(measured peak / predicted peak).
    pub log_ratio: f64,
}

/// The memory residual file as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryResidualFile {
    /// How the residuals were made.
    pub about: String,
    /// The command that rebuilds the file.
    pub command: String,
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    pub residuals: Vec<MemoryResidual>,
}

/// Why a memory residual file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MemoryIntervalError {
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: residuals[{index}].log_ratio: must be a finite number")]
    NonFinite { origin: String, index: usize },
    #[error("{origin}: lower_percentile {lower} and upper_percentile {upper}: need 0 < lower < upper < 1 with some number of residuals giving both order statistics")]
    Percentiles {
        origin: String,
        lower: f64,
        upper: f64,
    },
    #[error("{origin}: no framework holds {need} residuals, so no measured spread exists to give a framework without evidence")]
    NoEvidence { origin: String, need: usize },
}

/// The memory interval of one estimate: factors on its predicted peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryInterval {
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    /// Lower and upper peak over the predicted one (lower <= 1 <= upper).
    pub lower_factor: f64,
    pub upper_factor: f64,
    /// Residuals of the framework the interval comes from (0 without evidence).
    pub residuals: u32,
    /// The framework holds too few residuals: the interval is the widest framework's spread.
    pub no_evidence: bool,
    /// One line: what the interval rests on.
    pub note: String,
}

impl Default for MemoryInterval {
    fn default() -> Self {
        MemoryInterval {
            lower_percentile: 0.1,
            upper_percentile: 0.9,
            lower_factor: 1.0,
            upper_factor: 1.0,
            residuals: 0,
            no_evidence: true,
            note: String::new(),
        }
    }
}

/// The memory verdict of one predicted peak: its interval in bytes, and "fits" decided at the
/// pessimistic end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryVerdict {
    pub peak_bytes_p10: u64,
    pub peak_bytes_p90: u64,
    /// The p90 peak is at most the usable bytes.
    pub fits: bool,
    /// The predicted peak alone is at most the usable bytes.
    pub fits_at_prediction: bool,
    /// Usable bytes less the p90 peak (negative: that much short).
    pub margin_bytes_p90: i64,
}

impl MemoryInterval {
    /// The verdict for a predicted peak of `peak_bytes` against `usable_bytes`.
    pub fn verdict(&self, peak_bytes: u64, usable_bytes: u64) -> MemoryVerdict {
        let peak = peak_bytes as f64;
        let p10 = ((peak * self.lower_factor).floor() as u64).min(peak_bytes);
        let p90 = ((peak * self.upper_factor).ceil() as u64).max(peak_bytes);
        MemoryVerdict {
            peak_bytes_p10: p10,
            peak_bytes_p90: p90,
            fits: p90 <= usable_bytes,
            fits_at_prediction: peak_bytes <= usable_bytes,
            margin_bytes_p90: usable_bytes as i64 - p90 as i64,
        }
    }
}

/// Per framework, the lower and upper log residual and their count; and the widest spread.
#[derive(Debug, Clone)]
pub struct MemoryIntervalModel {
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    /// The fewest residuals whose order statistics give both percentiles.
    pub min_residuals: usize,
    /// (framework, lower log, upper log, residuals), for frameworks with enough residuals.
    cells: Vec<(Framework, f64, f64, u32)>,
    /// The envelope of every framework's interval: the widest spread observed.
    widest: (f64, f64),
}

impl MemoryResidualFile {
    /// Parses and checks `text` (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<MemoryResidualFile, MemoryIntervalError> {
        let f: MemoryResidualFile =
            serde_json::from_str(text).map_err(|e| MemoryIntervalError::Parse {
                origin: origin.to_string(),
                message: e.to_string(),
            })?;
        if let Some(index) = f.residuals.iter().position(|r| !r.log_ratio.is_finite()) {
            return Err(MemoryIntervalError::NonFinite {
                origin: origin.to_string(),
                index,
            });
        }
        Ok(f)
    }
}

impl MemoryIntervalModel {
    /// The model of `file` (`origin` names it in errors).
    pub fn new(
        file: &MemoryResidualFile,
        origin: &str,
    ) -> Result<MemoryIntervalModel, MemoryIntervalError> {
        let (lower, upper) = (file.lower_percentile, file.upper_percentile);
        let bad_percentiles = || MemoryIntervalError::Percentiles {
            origin: origin.to_string(),
            lower,
            upper,
        };
        if !(lower > 0.0 && lower < upper && upper < 1.0) {
            return Err(bad_percentiles());
        }
        let min_residuals = (1..=1_000_000usize)
            .find(|n| conformal_ranks(*n, lower, upper).is_some())
            .ok_or_else(bad_percentiles)?;
        let mut cells = Vec::new();
        for f in Framework::ALL {
            let mut v: Vec<f64> = file
                .residuals
                .iter()
                .filter(|r| r.framework == f)
                .map(|r| r.log_ratio)
                .collect();
            v.sort_by(f64::total_cmp);
            if let Some((lo, hi)) = conformal_ranks(v.len(), lower, upper) {
                cells.push((f, v[lo - 1], v[hi - 1], v.len() as u32));
            }
        }
        if cells.is_empty() {
            return Err(MemoryIntervalError::NoEvidence {
                origin: origin.to_string(),
                need: min_residuals,
            });
        }
        let widest = cells
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |w, c| {
                (w.0.min(c.1), w.1.max(c.2))
            });
        Ok(MemoryIntervalModel {
            lower_percentile: lower,
            upper_percentile: upper,
            min_residuals,
            cells,
            widest,
        })
    }

    /// The interval of a prediction under `framework`, widened to hold the prediction itself.
    pub fn lookup(&self, framework: Framework) -> MemoryInterval {
        let pct = |p: f64| format!("p{}", (100.0 * p).round());
        let span = format!(
            "{}-{}",
            pct(self.lower_percentile),
            pct(self.upper_percentile)
        );
        let cell = self.cells.iter().find(|c| c.0 == framework);
        let (lo, hi, n, note) = match cell {
            Some(&(_, lo, hi, n)) => (
                lo,
                hi,
                n,
                format!(
                    "{span} peak from {n} measured peaks of {} runs",
                    framework.name()
                ),
            ),
            None => (
                self.widest.0,
                self.widest.1,
                0,
                format!(
                    "no evidence: fewer than {} measured peaks of {} runs, so the {span} peak takes the widest spread any framework shows",
                    self.min_residuals,
                    framework.name()
                ),
            ),
        };
        MemoryInterval {
            lower_percentile: self.lower_percentile,
            upper_percentile: self.upper_percentile,
            lower_factor: lo.min(0.0).exp(),
            upper_factor: hi.max(0.0).exp(),
            residuals: n,
            no_evidence: cell.is_none(),
            note,
        }
    }
}

/// The shipped model, parsed once; a defect in the embedded file is reported, not a panic.
pub fn shipped() -> Result<&'static MemoryIntervalModel, &'static MemoryIntervalError> {
    static MODEL: OnceLock<Result<MemoryIntervalModel, MemoryIntervalError>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            MemoryResidualFile::parse(SHIPPED_JSON, PATH)
                .and_then(|f| MemoryIntervalModel::new(&f, PATH))
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(residuals: Vec<(Framework, f64)>) -> MemoryResidualFile {
        MemoryResidualFile {
            about: "test".into(),
            command: "none".into(),
            lower_percentile: 0.1,
            upper_percentile: 0.9,
            residuals: residuals
                .into_iter()
                .enumerate()
                .map(|(i, (framework, log_ratio))| MemoryResidual {
                    source: "s".into(),
                    row: format!("{i}"),
                    framework,
                    log_ratio,
                })
                .collect(),
        }
    }

    /// Nine DeepSpeed residuals 0.01 .. 0.09: n = 9 gives ranks 1 and 9 (Lei et al. 2018), so
    /// the interval is [0, 0.09] once widened to hold the prediction (every residual is above
    /// it); a framework with none takes the widest framework's spread (here DeepSpeed's, the
    /// only one) and says so.
    #[test]
    fn framework_cells_and_no_evidence_by_hand() {
        let rs = (1..=9)
            .map(|i| (Framework::Deepspeed, f64::from(i) / 100.0))
            .collect();
        let m = MemoryIntervalModel::new(&file(rs), "t").unwrap();
        let i = m.lookup(Framework::Deepspeed);
        assert_eq!(i.residuals, 9);
        assert!(!i.no_evidence);
        assert_eq!(i.lower_factor, 1.0);
        assert!((i.upper_factor - 0.09f64.exp()).abs() < 1e-12);
        let none = m.lookup(Framework::MegatronCore);
        assert!(none.no_evidence && none.note.starts_with("no evidence"));
        assert!(none.upper_factor > 1.0, "a stated width, not zero");
        assert_eq!(none.upper_factor, i.upper_factor);
        // With a second, wider framework, the one without evidence takes the wider spread.
        let mut rs: Vec<_> = (1..=9)
            .map(|i| (Framework::Deepspeed, f64::from(i) / 100.0))
            .collect();
        rs.extend((-4..=4).map(|i| (Framework::Fsdp, f64::from(i) / 10.0)));
        let m = MemoryIntervalModel::new(&file(rs), "t").unwrap();
        let none = m.lookup(Framework::MegatronCore);
        assert!((none.lower_factor - (-0.4f64).exp()).abs() < 1e-12);
        assert!((none.upper_factor - 0.4f64.exp()).abs() < 1e-12);
        // Fewer than nine residuals anywhere: no spread to state, refused by name.
        let few = file(vec![(Framework::Deepspeed, 0.1); 8]);
        assert!(matches!(
            MemoryIntervalModel::new(&few, "t"),
            Err(MemoryIntervalError::NoEvidence { need: 9, .. })
        ));
    }

    /// The verdict flips at the pessimistic end, by hand: a 70 GiB peak against 76 GiB usable
    /// fits as predicted, but with an upper factor of 1.1 its p90 is 77 GiB, 1 GiB short; with
    /// 1.08 the p90 is 75.6 GiB, 0.4 GiB to spare.
    #[test]
    fn the_verdict_is_decided_at_p90() {
        let gib = 1u64 << 30;
        let iv = |upper_factor: f64| MemoryInterval {
            lower_factor: 0.95,
            upper_factor,
            ..MemoryInterval::default()
        };
        let v = iv(1.1).verdict(70 * gib, 76 * gib);
        assert!(v.fits_at_prediction && !v.fits);
        assert_eq!(v.peak_bytes_p90, 77 * gib);
        assert_eq!(v.margin_bytes_p90, -(gib as i64));
        assert_eq!(v.peak_bytes_p10, (70.0 * 0.95 * gib as f64) as u64);
        let v = iv(1.08).verdict(70 * gib, 76 * gib);
        assert!(v.fits);
        assert_eq!(
            v.margin_bytes_p90,
            76 * gib as i64 - (75.6 * gib as f64).ceil() as i64
        );
    }

    /// Any residuals (finite, any count from 9) give p10 <= predicted <= p90, finite, for
    /// every framework, and a verdict whose p10 <= peak <= p90.
    #[test]
    fn intervals_hold_the_prediction_and_are_finite() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::default();
        let strategy = (
            proptest::collection::vec((0usize..3, -3.0f64..3.0), 9..60),
            1u64..(1 << 40),
        );
        runner
            .run(&strategy, |(rs, peak)| {
                let rs: Vec<_> = rs
                    .into_iter()
                    .map(|(f, x)| (Framework::ALL[f], x))
                    .collect();
                let Ok(m) = MemoryIntervalModel::new(&file(rs), "t") else {
                    return Ok(());
                };
                for f in Framework::ALL {
                    let i = m.lookup(f);
                    prop_assert!(i.lower_factor.is_finite() && i.upper_factor.is_finite());
                    prop_assert!(i.lower_factor <= 1.0 && 1.0 <= i.upper_factor);
                    let v = i.verdict(peak, peak);
                    prop_assert!(v.peak_bytes_p10 <= peak && peak <= v.peak_bytes_p90);
                }
                Ok(())
            })
            .unwrap();
    }

    /// An unknown key or a non-finite residual is refused naming it.
    #[test]
    fn bad_files_are_refused_by_name() {
        let e = MemoryResidualFile::parse(r#"{"about":"a","command":"c","lower_percentile":0.1,"upper_percentile":0.9,"residuals":[],"extra":1}"#, "f").unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
        let e = MemoryResidualFile::parse(
            r#"{"about":"a","command":"c","lower_percentile":0.1,"upper_percentile":0.9,"residuals":[{"source":"s","row":"r","framework":"deepspeed","log_ratio":1e999}]}"#,
            "f",
        );
        assert!(e.is_err());
    }

    /// The shipped file parses, and every framework gets a finite interval around 1.
    #[test]
    fn shipped_file_gives_every_framework_an_interval() {
        let m = shipped().unwrap();
        for f in Framework::ALL {
            let i = m.lookup(f);
            assert!(i.lower_factor.is_finite() && i.upper_factor.is_finite());
            assert!(i.lower_factor <= 1.0 && 1.0 <= i.upper_factor, "{f:?}");
        }
    }
}
