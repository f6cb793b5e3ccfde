//! The fitted sources (`calibration/data/published-throughput.json`: Narayanan et al. 2021, the
//! Megatron-LM README's Megatron-Core r0.8.0 weak scaling, MosaicML llm-foundry): each row
//! predicted by the GPU family's efficiencies fitted without its table
//! ([`crate::calibrate::loso`]), and covered (or not) by the interval of the shipped residual
//! model without any residual of its table ([`crate::calibrate::residuals::held_out`]):
//! leave-one-source-out, as every other source's coverage.

use super::{Degrees, Measured, Outcome, Predicted, Row, Source, ValidateError};
use crate::calibrate::residuals;
use crate::calibrate::{loso, Role};
use crate::interval::{ResidualFile, SHIPPED_JSON};

/// How the fitted sources' rows become configurations (calibrate::published says per row).
pub const DEFAULTS: &str = "Each table's own settings with what it does not give assumed as \
crates/engine/src/calibrate/published.rs says per source (Narayanan et al.: Megatron-LM's 2021 \
scripts; Megatron-Core 2024: micro batch 1, no virtual stages, no recomputation, bf16; \
llm-foundry: the MPT yamls). Every row is predicted by its GPU family's efficiencies fitted from \
placeholder values on the other tables alone (leave-one-source-out); its interval comes from the \
residual model without any residual of its table (leave-one-source-out).";

/// The rows of the fitted `sources` (every `every`-th), and remarks on the run.
pub fn rows(sources: &[Source], every: usize) -> Result<(Vec<Row>, Vec<String>), ValidateError> {
    let l = loso::shared()?;
    let file = ResidualFile::parse(SHIPPED_JSON, residuals::PATH)?;
    let mut out = Vec::new();
    let mut remarks = Vec::new();
    for &source in sources {
        let Some(published) = source.published() else {
            continue;
        };
        // The k-th residual of a source is its k-th predicted held-out row (residuals::build).
        let covered = residuals::held_out(&file, published.short())?;
        let mut k = 0;
        let mut stale = false;
        for r in l
            .evaluation
            .rows
            .iter()
            .filter(|r| r.case.source == published)
        {
            let case = &r.case;
            let world = case.config.cluster.num_gpus as f64;
            let measured_s = case.convention_flops() / (case.published_tflops * 1e12 * world);
            let outcome = match (&r.role, &r.prediction) {
                (Role::HeldOut, Ok(p)) => {
                    let c = covered.get(k).filter(|(res, ..)| res.row == case.label);
                    stale |= c.is_none();
                    k += 1;
                    Outcome::Predicted(Predicted {
                        step_s: p.step_s,
                        step_s_p10: None,
                        step_s_p90: None,
                        covered: c.map(|(_, inside, _)| *inside),
                        fits: p.fits,
                        regime: c.map(|(res, ..)| res.regime),
                        peak_bytes: (p.memory_fraction
                            * case_capacity_bytes(case.gpu).unwrap_or(0) as f64)
                            as u64,
                    })
                }
                (Role::HeldOut, Err(why)) => Outcome::NotExpressible(why.clone()),
                (role, _) => Outcome::Excluded(match role {
                    Role::OutOfScope(w) | Role::Inconsistent(w) => format!("{}: {w}", role.name()),
                    other => other.name().to_string(),
                }),
            };
            if case.index % every.max(1) != 0 {
                continue;
            }
            out.push(Row {
                source,
                index: case.index,
                label: case.label.clone(),
                model: case.config.model.name.clone(),
                system: case.gpu.to_string(),
                measured: Measured {
                    step_s: Some(measured_s),
                    memory_bytes: None,
                    fits: Some(true),
                    memory_contradicted: false,
                },
                outcome,
                notes: case
                    .assumed
                    .iter()
                    .map(|a| format!("assumed: {a}"))
                    .collect(),
                degrees: Some(Degrees {
                    tp: case.config.parallel.tp,
                    pp: case.config.parallel.pp,
                    mbs: case.config.training.micro_batch_size,
                }),
            });
        }
        if stale || k != covered.len() {
            remarks.push(format!(
                "{}: {} does not match today's leave-one-source-out rows (rebuild it with `{}`); \
                 coverage is left out where it does not",
                source.name(),
                residuals::PATH,
                residuals::COMMAND
            ));
        }
    }
    if !l.evaluation.unreadable.is_empty() {
        remarks.push(format!(
            "{} rows of the fitted tables could not be read: {}",
            l.evaluation.unreadable.len(),
            l.evaluation.unreadable.join("; ")
        ));
    }
    Ok((out, remarks))
}

/// The memory capacity of a shipped profile, bytes.
fn case_capacity_bytes(gpu: &str) -> Option<u64> {
    crate::config::GpuProfile::load(gpu)
        .ok()
        .map(|p| p.memory_bytes)
}
