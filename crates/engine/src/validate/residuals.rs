//! The validation sources' share of the step-time residual file (calibration/residuals.json):
//! the sources whose `use` allows fitting but that no efficiency is fitted to (vTrain, BLOOM
//! tr11) inform the interval's width with their residuals ln(measured / predicted step time),
//! each predicted at its published settings by the shipped profile. Megatron-Bridge
//! (validation only) never sets an interval. Each source's own coverage is then measured
//! leave-one-source-out ([`super::coverage`]).

use super::{predict, read, Outcome, Source, Use, ValidateError};
use crate::calibrate::{loso, residuals as calibrate_residuals};
use crate::config::Framework;
use crate::interval::memory::{self, MemoryResidual, MemoryResidualFile};
use crate::interval::{IntervalModel, Residual, ResidualFile, SHIPPED_JSON};
use std::path::Path;

/// The sources whose residuals join the file: fitting allowed, nothing fitted to them.
pub fn informing() -> Vec<Source> {
    Source::ALL
        .into_iter()
        .filter(|s| s.usage() == Use::NotFitted)
        .collect()
}

/// The residuals of every predicted row of `source` with a measured step time.
pub fn of_source(source: Source) -> Result<Vec<Residual>, ValidateError> {
    let rows: Vec<(Source, super::SourceRow)> =
        read(source)?.into_iter().map(|r| (source, r)).collect();
    let mut out = Vec::new();
    for r in predict::all(&rows, &|_, _| {}) {
        let (Outcome::Predicted(p), Some(measured_s)) = (&r.outcome, r.measured.step_s) else {
            continue;
        };
        let Some(regime) = p.regime else { continue };
        if measured_s > 0.0 && p.step_s > 0.0 {
            out.push(Residual {
                source: source.residual_source().to_string(),
                row: format!("#{} {}", r.index, r.label),
                regime,
                log_ratio: (measured_s / p.step_s).ln(),
            });
        }
    }
    Ok(out)
}

/// The whole residual file: the fitted tables' leave-one-source-out residuals and the
/// calibrated profiles' held-out runs (files under `root`), then the informing sources'.
pub fn build(root: &Path) -> Result<ResidualFile, ValidateError> {
    let mut file = calibrate_residuals::build(loso::shared()?, root)?;
    let sources = informing();
    for &s in &sources {
        file.residuals.extend(of_source(s)?);
    }
    file.about.push_str(&format!(
        " Validation sources whose use allows it ({}): every row predicted at its published \
         settings by the shipped profile; their coverage is measured leave-one-source-out.",
        sources
            .iter()
            .map(|s| s.key())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(file)
}

/// The shipped residual model without any residual of `source` (for its rows' coverage).
pub fn model_without(source: Source) -> Result<IntervalModel, ValidateError> {
    let mut file = ResidualFile::parse(SHIPPED_JSON, calibrate_residuals::PATH)?;
    let name = source.residual_source();
    file.residuals.retain(|r| r.source != name);
    Ok(IntervalModel::new(&file)?)
}

/// Every measured peak of the validation sources (the rows that label memory: BLOOM tr11's)
/// against the predicted peak of the most loaded GPU at the row's settings, with the row's
/// framework: the memory interval's file ([`crate::interval::memory`]).
pub fn memory_file() -> Result<MemoryResidualFile, ValidateError> {
    let mut residuals = Vec::new();
    let mut used = Vec::new();
    for source in Source::ALL {
        let rows: Vec<(Source, super::SourceRow)> =
            read(source)?.into_iter().map(|r| (source, r)).collect();
        let labelled: Vec<_> = rows
            .into_iter()
            // A figure that contradicts another row of its source is not fitted.
            .filter(|(_, r)| {
                r.measured.memory_bytes.is_some_and(|m| m > 0) && !r.measured.memory_contradicted
            })
            .collect();
        if labelled.is_empty() {
            continue;
        }
        used.push(source.key());
        let predicted = predict::all(&labelled, &|_, _| {});
        for ((_, sr), r) in labelled.iter().zip(predicted) {
            let (Outcome::Predicted(p), Some(m)) = (&r.outcome, r.measured.memory_bytes) else {
                continue;
            };
            if p.peak_bytes == 0 {
                continue;
            }
            residuals.push(MemoryResidual {
                source: source.key().to_string(),
                row: format!("#{} {}", r.index, r.label),
                framework: framework_of(sr),
                log_ratio: (m as f64 / p.peak_bytes as f64).ln(),
            });
        }
    }
    Ok(MemoryResidualFile {
        about: format!(
            "Residuals ln(measured / predicted peak memory of the most loaded GPU), each with the \
             run's framework, from the validation sources that label memory ({}): every row \
             predicted at its published settings by the shipped profile. An estimate's p10/p90 \
             peak is its predicted peak times the conformal lower and upper order statistic of \
             its framework's residuals; a framework with too few has no evidence and takes the \
             extremes of all. Rebuilt by `{}` (the memory terms change: rebuild after they do).",
            used.join(", "),
            memory::COMMAND
        ),
        command: memory::COMMAND.to_string(),
        lower_percentile: 0.1,
        upper_percentile: 0.9,
        residuals,
    })
}

/// The framework a source row runs under: its overlay's `training.framework`, else the
/// configuration's default (the overlay is merged over the defaults).
fn framework_of(row: &super::SourceRow) -> Framework {
    row.setup
        .as_ref()
        .ok()
        .and_then(|v| v.get("training")?.get("framework").cloned())
        .and_then(|f| serde_json::from_value(f).ok())
        .unwrap_or_default()
}
