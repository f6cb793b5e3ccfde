//! The whole fit of measurement lines (`parsim calibrate`, `parsim execute --calibrate`):
//! rate tables from the op timings of the fitting lines, never the held-out ones, then the
//! scalar efficiencies on top of the tables, so the scalars fit only what no table covers and
//! the held-out lines are predicted by a profile that never saw them.

use super::measurements::Measurement;
use super::profile_fit::{fit_profile, held_out_lines, ProfileFit, ProfileFitError};
use super::table_fit::{fit_tables, merge_tables, reproduce, Reproduction, TableFitError};
use crate::config::tables::{RateTables, TableProvenance};
use crate::config::GpuProfile;
use crate::op_cost::gemm_peak;
use parsim_plan::op_timing::{OpKey, OpTiming};
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

/// The efficiency the timed GEMMs ran at, every shape together: their FLOPs over their
/// seconds at their dtype's peak (time-weighted, as the tables' rates are); `None` without a
/// GEMM timing. A GEMM outside the table's buckets (a width the sweep never ran) is timed by
/// the roofline at `efficiency.matmul`, which the tables leave no step to identify: without
/// this it kept the base profile's value, however far the host's GEMMs ran from it.
pub fn measured_matmul_efficiency(ops: &[OpTiming], gpu: &GpuProfile) -> Option<f64> {
    let (mut at_peak_s, mut measured_s) = (0.0, 0.0);
    for t in ops {
        let OpKey::Gemm { dtype, .. } = t.key else {
            continue;
        };
        let (Some((flops, _)), Some((peak, _))) = (t.key.work(), gemm_peak(gpu, dtype)) else {
            continue;
        };
        at_peak_s += flops * t.calls as f64 / peak;
        measured_s += t.total_s;
    }
    let e = at_peak_s / measured_s;
    (measured_s > 0.0 && e.is_finite() && e > 0.0 && e <= 1.0).then_some(e)
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
        if let Some(e) = measured_matmul_efficiency(&ops, &base) {
            base.efficiency.matmul = e;
            base.provenance.insert(
                "efficiency.matmul".into(),
                format!("the time-weighted efficiency of the GEMM timings in {origin}: the roofline's rate for a GEMM outside the table's buckets"),
            );
        }
        Some(FittedTables {
            tables,
            reproduction,
        })
    };
    let fit = fit_profile(&base, ms, origin)?;
    Ok(LoopFit { fit, tables })
}
