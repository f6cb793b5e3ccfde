//! Fitting a profile's rate tables ([`RateTables`]) from op-class timings (`execute
//! --profile-ops`, parsim_plan::op_timing): per bucket the time-weighted rate of its timings
//! (their work over their seconds), each point with the calls behind it; and the check that
//! the fitted tables reproduce the op times they were fitted from.
//!
//! Buckets: a GEMM's dtype and the power-of-two octaves of m, n and k; an attention
//! implementation's pass, mask, head dimension and key length; a memory-bound op's octave of
//! bytes; a collective's op, group size, placement and octave of bytes. Within an octave the
//! point sits at the median size of its timings, so neighbouring points interpolate; the end
//! points sit at the smallest and largest sizes timed, so a curve covers what was measured.

use crate::config::tables::{
    octave, AttentionCurve, AttentionTable, CollectiveCurve, CollectiveTable, GemmBucket,
    GemmTable, HostGapTable, MemoryTable, RateTables, TableProvenance,
};
use crate::config::GpuProfile;
use crate::op_cost::gemm_peak;
use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{MaskKind, OpKey, OpTiming, Pass};
use serde::Serialize;
use std::collections::BTreeMap;

/// The acceptance bound: every table reproduces the op times it was fitted from within 10%.
pub const REPRODUCTION_BOUND: f64 = 0.10;

/// Why op timings cannot be fitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TableFitError {
    #[error("ops[{index}] ({key}): {message}")]
    Op {
        index: usize,
        key: String,
        message: String,
    },
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn median_u64(xs: &mut [u64]) -> u64 {
    xs.sort_unstable();
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        xs[n / 2 - 1] / 2 + xs[n / 2] / 2 + (xs[n / 2 - 1] % 2 + xs[n / 2] % 2) / 2
    }
}

fn key_text(key: &OpKey) -> String {
    serde_json::to_string(key).unwrap_or_else(|_| format!("{key:?}"))
}

/// Samples of one bucket: per timing its size, and the bucket's work, seconds and calls.
/// The bucket's rate is its work over its seconds (time-weighted), so a table gives back the
/// total time of the timings it was fitted from, which is what a step's time adds up.
#[derive(Default)]
struct Samples {
    sizes: Vec<u64>,
    work: f64,
    seconds: f64,
    calls: u64,
}

impl Samples {
    /// Adds a timing of `calls` calls of `size`, `rate` work per second, `seconds` in all.
    fn add(&mut self, size: u64, rate: f64, seconds: f64, calls: u64) {
        self.sizes.push(size);
        self.work += rate * seconds;
        self.seconds += seconds;
        self.calls += calls;
    }

    fn rate(&self) -> f64 {
        self.work / self.seconds
    }
}

/// Points of a size curve from octave buckets: (size, time-weighted rate, calls), by size.
/// An inner point sits at its bucket's median size; the first at its bucket's smallest size
/// and the last at its largest, so the curve covers every size its timings span (a lone
/// bucket keeps its median: one point covers one size).
fn curve_points(buckets: BTreeMap<u64, Samples>) -> (Vec<u64>, Vec<f64>, Vec<u64>) {
    let n = buckets.len();
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (i, (_, mut s)) in buckets.into_iter().enumerate() {
        let size = match (i, n) {
            (_, 1) => median_u64(&mut s.sizes),
            (0, _) => s.sizes.iter().copied().min().unwrap_or(0),
            (i, n) if i + 1 == n => s.sizes.iter().copied().max().unwrap_or(0),
            _ => median_u64(&mut s.sizes),
        };
        out.0.push(size);
        out.1.push(s.rate());
        out.2.push(s.calls);
    }
    out
}

/// Builds every table the timings give (a class without timings gets no table), each with
/// `provenance`. Efficiencies are over `gpu`'s dense peaks. Timings are refused by position
/// when they fail [`OpTiming::validate`], take no time, or run a GEMM faster than the peak.
pub fn fit_tables(
    timings: &[OpTiming],
    gpu: &GpuProfile,
    provenance: &TableProvenance,
) -> Result<RateTables, TableFitError> {
    let mut gemm: BTreeMap<(DType, u64, u64, u64), Samples> = BTreeMap::new();
    let mut attention: BTreeMap<(String, Pass, MaskKind, u64), BTreeMap<u64, Samples>> =
        BTreeMap::new();
    let mut memory: BTreeMap<u64, Samples> = BTreeMap::new();
    let mut collective: BTreeMap<CollKey, BTreeMap<u64, Samples>> = BTreeMap::new();
    let mut gaps = Samples::default();
    for (index, t) in timings.iter().enumerate() {
        let refuse = |message: String| TableFitError::Op {
            index,
            key: key_text(&t.key),
            message,
        };
        t.validate().map_err(|e| refuse(e.to_string()))?;
        if t.key == OpKey::HostGap {
            // Seconds per op over all the gaps: each record's calls are the ops its gaps fall
            // between (parsim_plan::op_timing).
            gaps.seconds += t.total_s;
            gaps.calls += t.calls;
            continue;
        }
        // Waiting for other ranks is the schedule's, not a rate's.
        if t.key == OpKey::Wait {
            continue;
        }
        if t.mean_s() <= 0.0 {
            return Err(refuse(format!(
                "`total_s` = {} gives no rate: a timed op takes some time",
                t.total_s
            )));
        }
        // The work per second of OpKey::work; a banded mask's work is not in its key, so no
        // curve takes it.
        let Some(rate) = t.rate() else {
            continue;
        };
        if let Some(((kernel, pass, mask, head_dim), kv_len)) = t.key.attention_point() {
            attention
                .entry((kernel.to_string(), pass, mask, head_dim))
                .or_default()
                .entry(kv_len)
                .or_default()
                .add(kv_len, rate, t.total_s, t.calls);
            continue;
        }
        match &t.key {
            OpKey::Gemm { m, n, k, dtype } => {
                let (peak, field) = gemm_peak(gpu, *dtype)
                    .ok_or_else(|| refuse(format!("`dtype` {dtype:?}: no GEMM peak for it")))?;
                let e = rate / peak;
                if e > 1.0 {
                    return Err(refuse(format!(
                        "runs at {e:.3} of the profile's {field} ({peak:e} FLOP/s): faster than the peak (a unit mistake, or the wrong profile)"
                    )));
                }
                gemm.entry((*dtype, octave(*m), octave(*n), octave(*k)))
                    .or_default()
                    .add(0, e, t.total_s, t.calls);
            }
            OpKey::Memory { bytes } => {
                memory
                    .entry(octave(*bytes))
                    .or_default()
                    .add(*bytes, rate, t.total_s, t.calls);
            }
            OpKey::Collective {
                op,
                bytes,
                group_size,
                placement,
            } => {
                if *group_size < 2 {
                    return Err(refuse(format!(
                        "`group_size` = {group_size}: a collective needs at least 2 ranks"
                    )));
                }
                collective
                    .entry((*op, *group_size, *placement))
                    .or_default()
                    .entry(octave(*bytes))
                    .or_default()
                    .add(*bytes, rate, t.total_s, t.calls);
            }
            // The host gap is handled above; a wait and attention have no rate here.
            OpKey::HostGap | OpKey::Wait | OpKey::Attention { .. } => {
                unreachable!("handled above")
            }
        }
    }
    Ok(assemble(
        Buckets {
            gemm,
            attention,
            memory,
            collective,
            gaps,
        },
        provenance,
    ))
}

type CollKey = (
    parsim_plan::op_timing::CollectiveKind,
    u32,
    parsim_plan::op_timing::Placement,
);

/// The timings sorted into buckets, per op class.
struct Buckets {
    gemm: BTreeMap<(DType, u64, u64, u64), Samples>,
    attention: BTreeMap<(String, Pass, MaskKind, u64), BTreeMap<u64, Samples>>,
    memory: BTreeMap<u64, Samples>,
    collective: BTreeMap<CollKey, BTreeMap<u64, Samples>>,
    gaps: Samples,
}

/// One table per op class with buckets: each bucket's time-weighted rate and calls.
fn assemble(b: Buckets, provenance: &TableProvenance) -> RateTables {
    let Buckets {
        gemm,
        attention,
        memory,
        collective,
        gaps,
    } = b;
    let p = || provenance.clone();
    let mut tables = RateTables::default();
    if !gemm.is_empty() {
        tables.gemm = Some(GemmTable {
            provenance: p(),
            buckets: gemm
                .into_iter()
                .map(|((dtype, m, n, k), s)| GemmBucket {
                    dtype,
                    m,
                    n,
                    k,
                    efficiency: s.rate(),
                    count: s.calls,
                })
                .collect(),
        });
    }
    let mut by_kernel: BTreeMap<String, Vec<AttentionCurve>> = BTreeMap::new();
    for ((kernel, pass, mask, head_dim), lengths) in attention {
        let (seq_len, flops_per_s, count) = curve_points(lengths);
        by_kernel.entry(kernel).or_default().push(AttentionCurve {
            pass,
            mask,
            head_dim,
            seq_len,
            flops_per_s,
            count,
        });
    }
    tables.attention = by_kernel
        .into_iter()
        .map(|(k, curves)| {
            (
                k,
                AttentionTable {
                    provenance: p(),
                    curves,
                },
            )
        })
        .collect();
    // One measured implementation is the one the runs used: it times their attention.
    if tables.attention.len() == 1 {
        tables.attention_kernel = tables.attention.keys().next().cloned();
    }
    if !memory.is_empty() {
        let (bytes, bytes_per_s, count) = curve_points(memory);
        tables.memory = Some(MemoryTable {
            provenance: p(),
            bytes,
            bytes_per_s,
            count,
        });
    }
    if !collective.is_empty() {
        tables.collective = Some(CollectiveTable {
            provenance: p(),
            rendezvous_s: None,
            curves: collective
                .into_iter()
                .map(|((op, group_size, placement), sizes)| {
                    let (bytes, bus_bytes_per_s, count) = curve_points(sizes);
                    CollectiveCurve {
                        op,
                        group_size,
                        placement,
                        bytes,
                        bus_bytes_per_s,
                        count,
                        link_efficiency: None,
                    }
                })
                .collect(),
        });
    }
    if gaps.calls > 0 {
        tables.host_gap = Some(HostGapTable {
            provenance: p(),
            seconds_per_op: gaps.seconds / gaps.calls as f64,
            count: gaps.calls,
        });
    }
    tables
}

/// Puts the tables of `fitted` into `into`, replacing those of the same class (and, for
/// attention, the same kernel implementation); the others stay.
pub fn merge_tables(into: &mut RateTables, fitted: RateTables) {
    let RateTables {
        attention_kernel,
        gemm,
        attention,
        memory,
        collective,
        host_gap,
    } = fitted;
    into.attention_kernel = attention_kernel.or(into.attention_kernel.take());
    into.gemm = gemm.or(into.gemm.take());
    into.attention.extend(attention);
    into.memory = memory.or(into.memory.take());
    // A rendezvous measured apart from the op timings stays with the fitted curves.
    let rendezvous_s = into.collective.as_ref().and_then(|c| c.rendezvous_s);
    into.collective = collective.or(into.collective.take()).map(|mut c| {
        c.rendezvous_s = c.rendezvous_s.or(rendezvous_s);
        c
    });
    into.host_gap = host_gap.or(into.host_gap.take());
}

/// The seconds per call `tables` give an op (the rate only: without the host gap, which the
/// timings hold as their own class); `None` where no table covers it.
pub fn table_seconds(tables: &RateTables, gpu: &GpuProfile, key: &OpKey) -> Option<f64> {
    // The table's rate, in the unit of OpKey::work.
    let rate = match key {
        OpKey::Gemm { m, n, k, dtype } => {
            gemm_peak(gpu, *dtype)?.0 * tables.gemm_efficiency(*dtype, *m, *n, *k)?
        }
        OpKey::Attention { .. } => {
            let ((kernel, pass, mask, head_dim), kv_len) = key.attention_point()?;
            tables.attention_flops_per_s(kernel, pass, mask, head_dim, kv_len)?
        }
        OpKey::Memory { bytes } => tables.memory_bytes_per_s(*bytes)?,
        OpKey::Collective {
            op,
            bytes,
            group_size,
            placement,
        } => tables.collective_bus_bytes_per_s(*op, *group_size, *placement, *bytes)?,
        OpKey::HostGap => return Some(tables.host_gap.as_ref()?.seconds_per_op),
        // Waits are the schedule's to predict, not a table's.
        OpKey::Wait => return None,
    };
    Some(key.work()?.0 / rate)
}

/// How well one op class's table reproduces its timings: |table / measured - 1| per timing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reproduction {
    pub class: &'static str,
    /// Timings compared.
    pub ops: usize,
    /// Timings no table covers (a banded mask).
    pub uncovered: usize,
    pub median_error: f64,
    pub worst_error: f64,
    /// The class's total: the tables' seconds for every covered timing (calls included) over
    /// the measured seconds, less 1. What a step's time adds up, and what the bound applies to.
    pub total_error: f64,
}

impl Reproduction {
    /// Whether the class's total is within [`REPRODUCTION_BOUND`] of the measured one.
    pub fn within_bound(&self) -> bool {
        self.total_error.abs() <= REPRODUCTION_BOUND
    }
}

/// Per op class, how closely `tables` give back the mean time per call of each of
/// `timings` (classes in a fixed order: gemm, attention, memory, collective, host_gap).
pub fn reproduce(timings: &[OpTiming], tables: &RateTables, gpu: &GpuProfile) -> Vec<Reproduction> {
    // Per class: per-timing errors, uncovered timings, and table and measured seconds.
    let mut errors: BTreeMap<&'static str, (Vec<f64>, usize, f64, f64)> = BTreeMap::new();
    for t in timings {
        let entry = errors.entry(t.key.class()).or_default();
        let measured = t.mean_s();
        match table_seconds(tables, gpu, &t.key) {
            Some(p) if measured > 0.0 => {
                entry.0.push((p / measured - 1.0).abs());
                entry.2 += p * t.calls as f64;
                entry.3 += t.total_s;
            }
            // A timing of no time: only a table that gives none reproduces it.
            Some(p) => entry.0.push(if p == 0.0 { 0.0 } else { 1.0 }),
            None => entry.1 += 1,
        }
    }
    ["gemm", "attention", "memory", "collective", "host_gap"]
        .into_iter()
        .filter_map(|class| {
            let (mut e, uncovered, table_s, measured_s) = errors.remove(class)?;
            let worst = e.iter().copied().fold(0.0, f64::max);
            Some(Reproduction {
                class,
                ops: e.len(),
                uncovered,
                median_error: if e.is_empty() { 0.0 } else { median(&mut e) },
                worst_error: worst,
                total_error: if measured_s > 0.0 {
                    table_s / measured_s - 1.0
                } else {
                    0.0
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_samples() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median_u64(&mut [5, 1, 3]), 3);
        assert_eq!(median_u64(&mut [4097, 4095]), 4096);
        assert_eq!(median_u64(&mut [u64::MAX, u64::MAX]), u64::MAX);
    }
}
