//! Fitting a profile's rate tables ([`RateTables`]) from op-class timings (`execute
//! --profile-ops`, parsim_plan::op_timing): per bucket the median rate of its timings, each
//! point with the calls behind it; and the check that the fitted tables reproduce the op
//! times they were fitted from.
//!
//! Buckets: a GEMM's dtype and the power-of-two octaves of m, n and k; an attention
//! implementation's pass, mask, head dimension and key length; a memory-bound op's octave of
//! bytes; a collective's op, group size, placement and octave of bytes. Within an octave the
//! point sits at the median size of its timings, so neighbouring points interpolate.

use crate::config::tables::{
    octave, AttentionCurve, AttentionTable, CollectiveCurve, CollectiveTable, GemmBucket,
    GemmTable, HostGapTable, MemoryTable, RateTables, TableProvenance,
};
use crate::config::GpuProfile;
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

/// The dense peak a GEMM of `dtype` is measured against; `None` for dtypes no GEMM runs in.
pub(super) fn gemm_peak(gpu: &GpuProfile, dtype: DType) -> Option<(f64, &'static str)> {
    match dtype {
        DType::Bf16 => Some((gpu.peak_flops.bf16, "peak_flops.bf16")),
        DType::F32 => Some((gpu.peak_flops.fp32, "peak_flops.fp32")),
        DType::U8 => None,
    }
}

/// An attention curve: kernel implementation, pass, mask and head dimension.
type AttentionCurveKey<'a> = (&'a str, Pass, MaskKind, u64);

/// Where an attention timing sits in the tables: its curve (kernel implementation, pass,
/// mask, head dimension) and the key length along it; `None` for other classes.
fn attention_point(key: &OpKey) -> Option<(AttentionCurveKey<'_>, u64)> {
    match key {
        OpKey::Attention {
            kv_len,
            head_dim,
            mask,
            pass,
            kernel,
            ..
        } => Some(((kernel.as_str(), *pass, *mask, *head_dim), *kv_len)),
        _ => None,
    }
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

/// Samples of one bucket: per timing (size, rate) and the calls.
#[derive(Default)]
struct Samples {
    sizes: Vec<u64>,
    rates: Vec<f64>,
    calls: u64,
}

impl Samples {
    fn add(&mut self, size: u64, rate: f64, calls: u64) {
        self.sizes.push(size);
        self.rates.push(rate);
        self.calls += calls;
    }
}

/// Points of a size curve from octave buckets: (median size, median rate, calls), by size.
fn curve_points(buckets: BTreeMap<u64, Samples>) -> (Vec<u64>, Vec<f64>, Vec<u64>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (_, mut s) in buckets {
        out.0.push(median_u64(&mut s.sizes));
        out.1.push(median(&mut s.rates));
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
    let mut gaps: Vec<f64> = Vec::new();
    let mut gap_calls = 0u64;
    for (index, t) in timings.iter().enumerate() {
        let refuse = |message: String| TableFitError::Op {
            index,
            key: key_text(&t.key),
            message,
        };
        t.validate().map_err(|e| refuse(e.to_string()))?;
        if t.key == OpKey::HostGap {
            gaps.push(t.mean_s());
            gap_calls += t.calls;
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
        if let Some(((kernel, pass, mask, head_dim), kv_len)) = attention_point(&t.key) {
            attention
                .entry((kernel.to_string(), pass, mask, head_dim))
                .or_default()
                .entry(kv_len)
                .or_default()
                .add(kv_len, rate, t.calls);
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
                    .add(0, e, t.calls);
            }
            OpKey::Memory { bytes } => {
                memory
                    .entry(octave(*bytes))
                    .or_default()
                    .add(*bytes, rate, t.calls);
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
                    .add(*bytes, rate, t.calls);
            }
            OpKey::HostGap | OpKey::Attention { .. } => unreachable!("handled above"),
        }
    }
    Ok(assemble(
        Buckets {
            gemm,
            attention,
            memory,
            collective,
            gaps,
            gap_calls,
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
    gaps: Vec<f64>,
    gap_calls: u64,
}

/// One table per op class with buckets: each bucket's median rate and calls.
fn assemble(b: Buckets, provenance: &TableProvenance) -> RateTables {
    let Buckets {
        gemm,
        attention,
        memory,
        collective,
        mut gaps,
        gap_calls,
    } = b;
    let p = || provenance.clone();
    let mut tables = RateTables::default();
    if !gemm.is_empty() {
        tables.gemm = Some(GemmTable {
            provenance: p(),
            buckets: gemm
                .into_iter()
                .map(|((dtype, m, n, k), mut s)| GemmBucket {
                    dtype,
                    m,
                    n,
                    k,
                    efficiency: median(&mut s.rates),
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
                    }
                })
                .collect(),
        });
    }
    if !gaps.is_empty() {
        tables.host_gap = Some(HostGapTable {
            provenance: p(),
            seconds_per_op: median(&mut gaps),
            count: gap_calls,
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
    into.collective = collective.or(into.collective.take());
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
            let ((kernel, pass, mask, head_dim), kv_len) = attention_point(key)?;
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
}

impl Reproduction {
    /// Whether the worst timing is within [`REPRODUCTION_BOUND`].
    pub fn within_bound(&self) -> bool {
        self.worst_error <= REPRODUCTION_BOUND
    }
}

/// Per op class, how closely `tables` give back the mean time per call of each of
/// `timings` (classes in a fixed order: gemm, attention, memory, collective, host_gap).
pub fn reproduce(timings: &[OpTiming], tables: &RateTables, gpu: &GpuProfile) -> Vec<Reproduction> {
    let mut errors: BTreeMap<&'static str, (Vec<f64>, usize)> = BTreeMap::new();
    for t in timings {
        let entry = errors.entry(t.key.class()).or_default();
        let measured = t.mean_s();
        match table_seconds(tables, gpu, &t.key) {
            Some(p) if measured > 0.0 => entry.0.push((p / measured - 1.0).abs()),
            Some(p) => entry.0.push(if p == 0.0 { 0.0 } else { f64::INFINITY }),
            None => entry.1 += 1,
        }
    }
    ["gemm", "attention", "memory", "collective", "host_gap"]
        .into_iter()
        .filter_map(|class| {
            let (mut e, uncovered) = errors.remove(class)?;
            let worst = e.iter().copied().fold(0.0, f64::max);
            Some(Reproduction {
                class,
                ops: e.len(),
                uncovered,
                median_error: if e.is_empty() { 0.0 } else { median(&mut e) },
                worst_error: worst,
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
