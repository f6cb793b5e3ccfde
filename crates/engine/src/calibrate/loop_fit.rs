//! The whole fit of measurement lines (`parsim calibrate`, `parsim execute --calibrate`):
//! rate tables from the op timings of the fitting lines, never the held-out ones, then the
//! scalar efficiencies on top of the tables, so the scalars fit only what no table covers and
//! the held-out lines are predicted by a profile that never saw them.

use super::measurements::Measurement;
use super::profile_fit::{fit_profile, held_out_lines, ProfileFit, ProfileFitError};
use super::table_fit::{fit_tables, merge_tables, reproduce, Reproduction, TableFitError};
use crate::config::tables::{RateTables, TableProvenance};
use crate::config::GpuProfile;
use parsim_plan::op_timing::OpTiming;
use serde::Serialize;

/// Why measurement lines cannot be fitted.
#[derive(Debug, thiserror::Error)]
pub enum LoopFitError {
    #[error("fitting rate tables from the lines' `ops`: {0}")]
    Tables(#[from] TableFitError),
    #[error(transparent)]
    Profile(#[from] ProfileFitError),
}

/// Rate tables fitted from op timings, and how closely they give back those timings.
#[derive(Debug, Clone, Serialize)]
pub struct FittedTables {
    pub tables: RateTables,
    /// Per op class, over the fitting lines' timings.
    pub reproduction: Vec<Reproduction>,
}

/// The fit: the scalar fit (whose profile carries the tables) and the tables, when the
/// fitting lines carry op timings.
#[derive(Debug, Clone, Serialize)]
pub struct LoopFit {
    pub fit: ProfileFit,
    pub tables: Option<FittedTables>,
}

/// The op timings of the lines [`fit_profile`] fits (not held out).
pub fn fitting_ops(ms: &[Measurement]) -> Vec<OpTiming> {
    ms.iter()
        .zip(held_out_lines(ms))
        .filter(|(_, held)| !held)
        .flat_map(|(m, _)| m.ops.iter().cloned())
        .collect()
}

/// Fits tables from the fitting lines' op timings into `base` (each with `provenance`), then
/// the scalars on top of them.
pub fn fit_with_tables(
    base: &GpuProfile,
    ms: &[Measurement],
    origin: &str,
    provenance: &TableProvenance,
) -> Result<LoopFit, LoopFitError> {
    let ops = fitting_ops(ms);
    let mut base = base.clone();
    let tables = if ops.is_empty() {
        None
    } else {
        let tables = fit_tables(&ops, &base, provenance)?;
        let reproduction = reproduce(&ops, &tables, &base);
        merge_tables(&mut base.tables, tables.clone());
        Some(FittedTables {
            tables,
            reproduction,
        })
    };
    let fit = fit_profile(&base, ms, origin)?;
    Ok(LoopFit { fit, tables })
}
