//! The whole fit of measurement lines (`parsim calibrate`, `parsim execute --calibrate`):
//! rate tables from the op timings of the fitting lines, never the held-out ones, then the
//! scalar efficiencies on top of the tables, so the scalars fit only what no table covers and
//! the held-out lines are predicted by a profile that never saw them.

use super::fields::{ProfileField, INTER_LINK, INTRA_LINK, MATMUL};
use super::measurements::Measurement;
use super::profile_fit::{fit_profile_holding, held_out_lines, ProfileFit, ProfileFitError};
use super::table_fit::{fit_tables, merge_tables, reproduce, Reproduction, TableFitError};
use crate::config::tables::{RateTables, TableProvenance};
use crate::config::GpuProfile;
use crate::op_cost::gemm_peak;
use parsim_plan::op_timing::{CollectiveKind, OpKey, OpTiming, Placement};
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

/// The share of the link's bandwidth the timed collectives on `placement` ran at, every size
/// and kind together: their bus bytes (nccl-tests' bus factor times the payload) over their
/// seconds less the link's latency per call, over the link's bandwidth (time-weighted, as the
/// tables' rates are); `None` without such a timing or outside (0, 1]. A collective outside
/// the table's byte range (a width the sweep never ran) is timed by the alpha-beta ring on the
/// link at its efficiency, which no fitting step identifies: without this it kept the base
/// profile's value (the CPU profile's 10 GB/s at 1.0, where this host's large collectives
/// moved 1-3 GB/s).
pub fn measured_link_efficiency(
    ops: &[OpTiming],
    gpu: &GpuProfile,
    placement: Placement,
) -> Option<f64> {
    link_share(ops, gpu, placement, |_, _| true)
}

/// [`measured_link_efficiency`] of one collective kind over one group size: the rate of that
/// op's own timings, which times its calls outside its table curve
/// ([`crate::config::tables::CollectiveCurve::link_efficiency`]). A reduce-scatter on the CPU
/// backend copies its input and then sums it where an all-gather only copies: on this
/// project's host it moved half an all-gather's bus bytes per second.
pub fn measured_op_link_efficiency(
    ops: &[OpTiming],
    gpu: &GpuProfile,
    placement: Placement,
    op: CollectiveKind,
    group_size: u32,
) -> Option<f64> {
    link_share(ops, gpu, placement, |o, n| (o, n) == (op, group_size))
}

/// The bus bytes over the link's bandwidth times the wire seconds of the collectives on
/// `placement` that `keep` (op, group size) takes; `None` without one or outside (0, 1].
fn link_share(
    ops: &[OpTiming],
    gpu: &GpuProfile,
    placement: Placement,
    keep: impl Fn(CollectiveKind, u32) -> bool,
) -> Option<f64> {
    let link = match placement {
        Placement::IntraNode => &gpu.links.intra_node,
        Placement::InterNode => &gpu.links.inter_node,
    };
    let (mut bus_bytes, mut wire_s) = (0.0, 0.0);
    for t in ops {
        let OpKey::Collective {
            op,
            bytes,
            group_size,
            placement: p,
        } = t.key
        else {
            continue;
        };
        if p != placement || group_size < 2 || !keep(op, group_size) {
            continue;
        }
        bus_bytes += op.bus_factor(group_size) * bytes as f64 * t.calls as f64;
        wire_s += t.total_s - link.latency_s * t.calls as f64;
    }
    let e = bus_bytes / (wire_s * link.bandwidth_bytes_per_s);
    (wire_s > 0.0 && e.is_finite() && e > 0.0 && e <= 1.0).then_some(e)
}

/// Sets `tables.collective.rendezvous_s` in `base` to the median synchronisation the fitting
/// lines of `ms` measured (`rendezvous_s`), with its provenance naming `origin`, where `base`
/// has a collective table and a line measured one: every table-timed collective pays it (the
/// rank's wait for its peer to wake, which the collective's own timing leaves out).
fn set_measured_rendezvous(base: &mut GpuProfile, ms: &[Measurement], origin: &str) {
    let lines: Vec<f64> = ms
        .iter()
        .zip(held_out_lines(ms))
        .filter(|(_, held)| !held)
        .filter_map(|(m, _)| m.rendezvous_s)
        .collect();
    let Some(table) = base.tables.collective.as_mut() else {
        return;
    };
    if lines.is_empty() {
        return;
    }
    let n = lines.len();
    let s = super::fields::median(lines);
    table.rendezvous_s = Some(s);
    base.provenance.insert(
        "tables.collective.rendezvous_s".into(),
        format!(
            "measured: {:.1} us per synchronisation between two rank threads, the median of the `rendezvous_s` of {n} fitting lines in {origin}, not fitted",
            1e6 * s
        ),
    );
}

/// Sets on each collective curve of `base` the share of the link's bandwidth its own timings
/// in `ops` ran at ([`measured_op_link_efficiency`]), which times its calls outside the curve.
fn set_curve_link_efficiencies(base: &mut GpuProfile, ops: &[OpTiming]) {
    let measured = base.clone();
    let Some(table) = base.tables.collective.as_mut() else {
        return;
    };
    for c in &mut table.curves {
        c.link_efficiency =
            measured_op_link_efficiency(ops, &measured, c.placement, c.op, c.group_size);
    }
}

/// Sets the values measured from the fitting op timings `ops` in `base`, each with its
/// provenance naming `origin`: the GEMM efficiency and each link's efficiency (the rates of
/// the ops no table covers). Returns the fields set, which the scalar fit holds.
fn set_measured(base: &mut GpuProfile, ops: &[OpTiming], origin: &str) -> Vec<&'static str> {
    let mut measured = Vec::new();
    let mut set = |g: &mut GpuProfile, field: ProfileField, value: Option<f64>, what: &str| {
        if let Some(v) = value {
            (field.set)(g, v);
            g.provenance.insert(
                field.name.into(),
                format!("the time-weighted {what} timings in {origin}, measured, not fitted"),
            );
            measured.push(field.name);
        }
    };
    let gemm = measured_matmul_efficiency(ops, base);
    set(base, MATMUL, gemm, "efficiency of the GEMM");
    for (field, placement) in [
        (INTRA_LINK, Placement::IntraNode),
        (INTER_LINK, Placement::InterNode),
    ] {
        let link = measured_link_efficiency(ops, base, placement);
        set(
            base,
            field,
            link,
            "bus bandwidth over the link's of the collective",
        );
    }
    measured
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
    let mut measured = Vec::new();
    let tables = if ops.is_empty() {
        None
    } else {
        let tables = fit_tables(&ops, &base, provenance)?;
        let reproduction = reproduce(&ops, &tables, &base);
        merge_tables(&mut base.tables, tables.clone());
        set_curve_link_efficiencies(&mut base, &ops);
        set_measured_rendezvous(&mut base, ms, origin);
        measured = set_measured(&mut base, &ops, origin);
        Some(FittedTables {
            tables,
            reproduction,
        })
    };
    // The measured values are held: fitted, the GEMM efficiency took up what the off-table
    // GEMMs' share of some fitting steps left over and timed every unseen GEMM by it.
    let fit = fit_profile_holding(&base, ms, origin, &measured)?;
    Ok(LoopFit { fit, tables })
}
