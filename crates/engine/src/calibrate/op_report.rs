//! `parsim calibrate --report`'s op-class table and `--ops-png`'s points: the op timings the
//! measurement lines carry (`ops`) against the time a profile predicts for the same ops,
//! before the fit (the profile as given) and after it (the fitted profile). A profile
//! predicts an op from its rate tables where they cover it, and from the analytic model of
//! the time model elsewhere.

use super::table_fit::{gemm_peak, table_seconds};
use crate::config::GpuProfile;
use crate::time::Rates;
use parsim_plan::op_timing::{OpKey, OpTiming, Placement};
use serde::Serialize;

/// The op classes, in the order the report lists them.
pub use parsim_plan::op_timing::OP_CLASSES as CLASSES;

/// The seconds of one call of `key` that `gpu` predicts, without the per-op overhead (the
/// timings hold host time as their own class, `host_gap`):
/// - where the profile's rate tables cover the op, the table's rate (as the fit reads it);
/// - else a GEMM by the time model's roofline with wave quantisation at `efficiency.matmul`;
///   attention's FLOPs ([`OpKey::work`]) at `efficiency.attention` of the bf16 peak; a
///   memory-bound op's bytes over HBM at `efficiency.memory_bound`; a collective's bus bytes
///   over its placement's link bandwidth times the link's efficiency, plus its latency; the
///   host gap as `efficiency.kernel_overhead_s`.
///
/// `None` where neither knows the op: a banded mask (its work is not in the key), or a GEMM
/// dtype with no peak.
pub fn predict_op_s(gpu: &GpuProfile, key: &OpKey) -> Option<f64> {
    if let Some(s) = table_seconds(&gpu.tables, gpu, key) {
        return Some(s);
    }
    let e = &gpu.efficiency;
    let (work, _) = match key {
        OpKey::HostGap => return Some(e.kernel_overhead_s),
        _ => key.work()?,
    };
    if work <= 0.0 {
        return Some(0.0);
    }
    Some(match key {
        OpKey::Gemm { m, n, k, dtype } => {
            let (peak, _) = gemm_peak(gpu, *dtype)?;
            let rates = Rates {
                gpu,
                peak_flops: peak,
                element_bytes: dtype.size_bytes(),
                matmul_efficiency: e.matmul,
            };
            rates.gemm_s(*m, *n, *k) - e.kernel_overhead_s
        }
        OpKey::Attention { .. } => work / (gpu.peak_flops.bf16 * e.attention),
        OpKey::Memory { .. } => work / (gpu.hbm_bytes_per_s * e.memory_bound),
        OpKey::Collective { placement, .. } => {
            let link = match placement {
                Placement::IntraNode => &gpu.links.intra_node,
                Placement::InterNode => &gpu.links.inter_node,
            };
            work / (link.bandwidth_bytes_per_s * link.efficiency) + link.latency_s
        }
        OpKey::HostGap | OpKey::Wait => return None,
    })
}

/// One profile's prediction of a class's timings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Predicted {
    /// Seconds predicted for the timings it predicts (calls x seconds per call).
    pub predicted_s: f64,
    /// Measured seconds of those same timings.
    pub measured_s: f64,
    /// Timings it does not predict ([`predict_op_s`] is `None`).
    pub unpredicted: usize,
}

impl Predicted {
    /// predicted / measured - 1 over the predicted timings; `None` when they measured no time
    /// (the report prints "n/a").
    pub fn error(&self) -> Option<f64> {
        (self.measured_s > 0.0).then(|| self.predicted_s / self.measured_s - 1.0)
    }
}

/// One op class of the report: what the lines measured and what each profile predicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassRow {
    pub class: &'static str,
    /// Timings of the class in the lines; 0: the class is absent from them.
    pub timings: usize,
    /// Seconds of all its timings (calls included).
    pub measured_s: f64,
    /// The profile as given.
    pub before: Predicted,
    /// The fitted profile.
    pub after: Predicted,
}

/// One timing on the scatter plot: seconds per call, measured and predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpPoint {
    pub class: &'static str,
    pub measured_s: f64,
    pub before_s: Option<f64>,
    pub after_s: Option<f64>,
}

/// The op-class comparison of `timings` (every line's `ops` together) under `before` and
/// `after`: a row per class of [`CLASSES`] (absent ones with no timings) and a point per
/// timing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpReport {
    pub rows: Vec<ClassRow>,
    pub points: Vec<OpPoint>,
}

/// Adds a timing to one profile's prediction of its class.
fn add(p: &mut Predicted, t: &OpTiming, per_call_s: Option<f64>) {
    match per_call_s {
        Some(s) => {
            p.predicted_s += s * t.calls as f64;
            p.measured_s += t.total_s;
        }
        None => p.unpredicted += 1,
    }
}

/// Compares `timings` with what `before` and `after` predict for them (see [`OpReport`]).
pub fn compare(timings: &[OpTiming], before: &GpuProfile, after: &GpuProfile) -> OpReport {
    let mut rows: Vec<ClassRow> = CLASSES
        .iter()
        .map(|&class| ClassRow {
            class,
            timings: 0,
            measured_s: 0.0,
            before: Predicted::default(),
            after: Predicted::default(),
        })
        .collect();
    let mut points = Vec::with_capacity(timings.len());
    for t in timings {
        let class = t.key.class();
        let Some(row) = rows.iter_mut().find(|r| r.class == class) else {
            continue;
        };
        let (b, a) = (predict_op_s(before, &t.key), predict_op_s(after, &t.key));
        row.timings += 1;
        row.measured_s += t.total_s;
        add(&mut row.before, t, b);
        add(&mut row.after, t, a);
        points.push(OpPoint {
            class,
            measured_s: t.mean_s(),
            before_s: b,
            after_s: a,
        });
    }
    OpReport { rows, points }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU profile's analytic model (its rate tables taken out) by hand: a memory-bound op
    /// of 1e9 bytes at
    /// hbm_bytes_per_s x efficiency.memory_bound; an intra-node all-reduce over 2 ranks of
    /// 1e9 bytes moves 2 x 1/2 of it on the bus (nccl-tests) over the link's bandwidth times
    /// its efficiency, plus its latency.
    #[test]
    fn the_analytic_model_times_memory_and_collectives_by_their_formulas() {
        let mut gpu = GpuProfile::load("cpu").unwrap();
        gpu.tables = Default::default();
        let e = &gpu.efficiency;
        let mem = predict_op_s(
            &gpu,
            &OpKey::Memory {
                bytes: 1_000_000_000,
            },
        )
        .unwrap();
        let expect = 1e9 / (gpu.hbm_bytes_per_s * e.memory_bound);
        assert!((mem - expect).abs() <= 1e-12 * expect, "{mem} vs {expect}");
        let ar = OpKey::Collective {
            op: parsim_plan::op_timing::CollectiveKind::AllReduce,
            bytes: 1_000_000_000,
            group_size: 2,
            placement: Placement::IntraNode,
        };
        let l = &gpu.links.intra_node;
        let expect = 1e9 / (l.bandwidth_bytes_per_s * l.efficiency) + l.latency_s;
        let got = predict_op_s(&gpu, &ar).unwrap();
        assert!((got - expect).abs() <= 1e-12 * expect, "{got} vs {expect}");
        assert_eq!(
            predict_op_s(&gpu, &OpKey::HostGap),
            Some(e.kernel_overhead_s)
        );
    }

    /// An absent class has no timings; a class measured in zero seconds has no error
    /// (the report prints "n/a"), never NaN.
    #[test]
    fn absent_classes_and_zero_time_have_no_error() {
        let gpu = GpuProfile::load("cpu").unwrap();
        let t = OpTiming {
            key: OpKey::HostGap,
            calls: 3,
            total_s: 0.0,
        };
        let r = compare(&[t], &gpu, &gpu);
        assert_eq!(r.rows.len(), CLASSES.len());
        let gap = r.rows.iter().find(|r| r.class == "host_gap").unwrap();
        assert_eq!((gap.timings, gap.after.error()), (1, None));
        assert!(r
            .rows
            .iter()
            .filter(|r| r.class != "host_gap")
            .all(|r| r.timings == 0 && r.before.error().is_none()));
    }
}
