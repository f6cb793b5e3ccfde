//! Measured rate tables in a GPU profile (`[tables]`): GEMM efficiency by shape bucket, an
//! attention rate curve per kernel implementation, the memory-bound HBM rate and collective
//! bus bandwidth by message size, and the host gap per op, each with its provenance (date,
//! device, driver, software). The time model uses a table where it covers an op and the
//! analytic model elsewhere: curves interpolate in log-log space between their points and
//! cover exactly the range their keys span, never extrapolating beyond it.

use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{CollectiveKind, MaskKind, Pass, Placement};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a table's figures were measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableProvenance {
    /// When (UTC date).
    pub date: String,
    /// The device as its driver names it ("NVIDIA H100 80GB HBM3", a CPU model).
    pub device: String,
    /// Driver (and its version), or "none" on the CPU.
    pub driver: String,
    /// The software that ran the ops (parsim's version and libraries, a benchmark).
    pub software: String,
}

/// A GEMM shape bucket: every `m x n x k` GEMM of `dtype` whose dimensions lie in the same
/// power-of-two octaves as (`m`, `n`, `k`) ([`octave`]) runs at `efficiency` of the dense peak
/// of its dtype (`peak_flops.bf16`, or `peak_flops.fp32` for f32).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmBucket {
    pub dtype: DType,
    /// Lower bounds of the bucket's octaves (powers of two).
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Achieved FLOP/s over the dtype's dense peak (the median of the bucket's timings).
    pub efficiency: f64,
    /// Timed calls behind the figure.
    pub count: u64,
}

/// GEMM efficiency by shape bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmTable {
    pub provenance: TableProvenance,
    pub buckets: Vec<GemmBucket>,
}

/// One attention rate curve of a kernel implementation: FLOP/s against sequence length (the
/// key length of the call) for one pass, mask and head dimension. FLOPs are counted as the
/// FlashAttention papers count them: forward 4 s^2 d per head (halved under a causal mask),
/// backward 2.5 times the forward's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionCurve {
    pub pass: Pass,
    pub mask: MaskKind,
    pub head_dim: u64,
    /// Strictly increasing.
    pub seq_len: Vec<u64>,
    pub flops_per_s: Vec<f64>,
    /// Timed calls behind each point.
    pub count: Vec<u64>,
}

/// The attention curves of one kernel implementation (parsim's `flash_mma`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionTable {
    pub provenance: TableProvenance,
    pub curves: Vec<AttentionCurve>,
}

/// Memory-bound ops: bytes moved per second against bytes moved per call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryTable {
    pub provenance: TableProvenance,
    /// Strictly increasing.
    pub bytes: Vec<u64>,
    pub bytes_per_s: Vec<f64>,
    pub count: Vec<u64>,
}

/// One collective's bus bandwidth (nccl-tests' busbw: the ring factor times bytes over
/// seconds) against its message size, for one group size and placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveCurve {
    pub op: CollectiveKind,
    pub group_size: u32,
    pub placement: Placement,
    /// Bytes per rank as nccl-tests counts them; strictly increasing.
    pub bytes: Vec<u64>,
    pub bus_bytes_per_s: Vec<f64>,
    pub count: Vec<u64>,
    /// The share of the link's bandwidth this op's timings ran at, every size together (bus
    /// bytes over seconds less the link's latency per call): a call of this op, group size and
    /// placement outside `bytes` is timed on the alpha-beta ring at it. Each kind moves its
    /// bytes its own way (on parsim's CPU backend a send hands over its buffer, an all-gather
    /// copies in and out, a reduce-scatter copies and then sums), so the link's one
    /// efficiency, all kinds together, is the wrong rate for any one of them. Absent: the
    /// link's efficiency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_efficiency: Option<f64>,
}

/// Collective bus bandwidth by message size, per collective, group size and placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveTable {
    pub provenance: TableProvenance,
    /// Seconds per call spent synchronising that the curves' timings leave out: parsim's CPU
    /// backend records the time a member waits for its peers apart (the `wait` op class), and
    /// a member that arrives first sleeps and must be woken, a fixed cost per call whatever
    /// its bytes (measured by `execute --calibrate` with two threads exchanging one element,
    /// `parsim_executor::backend::cpu::rendezvous`). Absent (NCCL timings hold it): 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_s: Option<f64>,
    pub curves: Vec<CollectiveCurve>,
}

/// The host's time between timed ops (launches, bookkeeping), per op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostGapTable {
    pub provenance: TableProvenance,
    /// Median seconds per gap.
    pub seconds_per_op: f64,
    pub count: u64,
}

/// A profile's measured tables; every one optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateTables {
    /// The kernel implementation (a key of `attention`) that times fused attention when the
    /// configuration names none (`training.attention_kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm: Option<GemmTable>,
    /// Keyed by kernel implementation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attention: BTreeMap<String, AttentionTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<CollectiveTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_gap: Option<HostGapTable>,
}

/// The power-of-two octave holding `x`: the largest power of two at most `x` (1 for 0).
pub fn octave(x: u64) -> u64 {
    if x <= 1 {
        1
    } else {
        1u64 << (63 - x.leading_zeros())
    }
}

/// Interpolates `values` at `x` in log-log space between `keys` (strictly increasing);
/// `None` outside `[keys[0], keys[last]]`: a table never extrapolates.
pub fn interpolate_log<K: TableKey>(keys: &[K], values: &[f64], x: f64) -> Option<f64> {
    let (first, last) = (keys.first()?.as_f64(), keys.last()?.as_f64());
    if !(x >= first && x <= last) || keys.len() != values.len() {
        return None;
    }
    let i = keys.iter().position(|k| k.as_f64() >= x)?;
    if keys[i].as_f64() == x || i == 0 {
        return Some(values[i]);
    }
    let (x0, x1) = (keys[i - 1].as_f64().ln(), keys[i].as_f64().ln());
    let (y0, y1) = (values[i - 1].ln(), values[i].ln());
    let t = (x.ln() - x0) / (x1 - x0);
    Some((y0 + t * (y1 - y0)).exp())
}

/// A table's key (bytes, sequence length) read as a float where it is interpolated: the
/// tables keep integer keys, and reading them in place spares the estimate an allocation per
/// lookup (every timed op looks up at least one table).
pub trait TableKey: Copy {
    fn as_f64(self) -> f64;
}

impl TableKey for u64 {
    fn as_f64(self) -> f64 {
        self as f64
    }
}

impl TableKey for f64 {
    fn as_f64(self) -> f64 {
        self
    }
}

/// A table needs at least one point: `Err((field, rule))` when it has none.
fn require_points(field: &str, points: usize) -> Result<(), (String, String)> {
    if points == 0 {
        return Err((field.to_string(), "a table needs at least one point".into()));
    }
    Ok(())
}

/// Checks one curve: at least one point, as many values and counts as keys, keys strictly
/// increasing and positive, values positive and finite. `Err((field, rule))`.
fn check_curve(
    field: &str,
    key_name: &str,
    value_name: &str,
    keys: &[u64],
    values: &[f64],
    counts: &[u64],
) -> Result<(), (String, String)> {
    let at = |name: &str| format!("{field}.{name}");
    require_points(&at(key_name), keys.len())?;
    if values.len() != keys.len() || counts.len() != keys.len() {
        return Err((
            field.to_string(),
            format!(
                "`{key_name}`, `{value_name}` and `count` must have the same length (got {}, {} and {})",
                keys.len(),
                values.len(),
                counts.len()
            ),
        ));
    }
    if let Some(w) = keys.windows(2).find(|w| w[1] <= w[0]) {
        return Err((
            at(key_name),
            format!(
                "keys must be strictly increasing (got {} after {})",
                w[1], w[0]
            ),
        ));
    }
    if keys[0] == 0 {
        return Err((at(key_name), "keys must be positive (got 0)".into()));
    }
    if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err((
            at(value_name),
            format!("rates must be positive finite numbers (got {v})"),
        ));
    }
    Ok(())
}

fn check_provenance(field: &str, p: &TableProvenance) -> Result<(), (String, String)> {
    for (name, v) in [
        ("date", &p.date),
        ("device", &p.device),
        ("driver", &p.driver),
        ("software", &p.software),
    ] {
        if v.trim().is_empty() {
            return Err((
                format!("{field}.provenance.{name}"),
                "must say where the table's figures come from (empty)".into(),
            ));
        }
    }
    Ok(())
}

impl RateTables {
    /// Whether no table is given.
    pub fn is_empty(&self) -> bool {
        *self == RateTables::default()
    }

    /// Checks every table; `Err((field, rule))` names the first bad one.
    pub fn check(&self) -> Result<(), (String, String)> {
        if let Some(g) = &self.gemm {
            check_provenance("tables.gemm", &g.provenance)?;
            require_points("tables.gemm.buckets", g.buckets.len())?;
            for (i, b) in g.buckets.iter().enumerate() {
                let f = format!("tables.gemm.buckets[{i}]");
                for (name, v) in [("m", b.m), ("n", b.n), ("k", b.k)] {
                    if v == 0 || octave(v) != v {
                        return Err((
                            format!("{f}.{name}"),
                            format!(
                                "must be a power of two, the lower bound of its octave (got {v})"
                            ),
                        ));
                    }
                }
                if !(b.efficiency.is_finite() && b.efficiency > 0.0 && b.efficiency <= 1.0) {
                    return Err((
                        format!("{f}.efficiency"),
                        format!(
                            "must be a fraction of the dense peak in (0, 1] (got {})",
                            b.efficiency
                        ),
                    ));
                }
                let dup = g.buckets[..i]
                    .iter()
                    .any(|o| (o.dtype, o.m, o.n, o.k) == (b.dtype, b.m, b.n, b.k));
                if dup {
                    return Err((f, "the bucket is given twice".into()));
                }
            }
        }
        for (name, t) in &self.attention {
            let f = format!("tables.attention.{name}");
            check_provenance(&f, &t.provenance)?;
            require_points(&format!("{f}.curves"), t.curves.len())?;
            for (i, c) in t.curves.iter().enumerate() {
                let cf = format!("{f}.curves[{i}]");
                check_curve(
                    &cf,
                    "seq_len",
                    "flops_per_s",
                    &c.seq_len,
                    &c.flops_per_s,
                    &c.count,
                )?;
                if c.head_dim == 0 {
                    return Err((format!("{cf}.head_dim"), "must be positive".into()));
                }
                let dup = t.curves[..i]
                    .iter()
                    .any(|o| (o.pass, o.mask, o.head_dim) == (c.pass, c.mask, c.head_dim));
                if dup {
                    return Err((cf, "pass, mask and head_dim are given twice".into()));
                }
            }
        }
        if let Some(k) = &self.attention_kernel {
            if !self.attention.contains_key(k) {
                return Err((
                    "tables.attention_kernel".into(),
                    format!(
                        "{k:?} has no table in tables.attention (known: {})",
                        self.attention_kernels().join(", ")
                    ),
                ));
            }
        }
        if let Some(m) = &self.memory {
            check_provenance("tables.memory", &m.provenance)?;
            check_curve(
                "tables.memory",
                "bytes",
                "bytes_per_s",
                &m.bytes,
                &m.bytes_per_s,
                &m.count,
            )?;
        }
        if let Some(c) = &self.collective {
            check_collective(c)?;
        }
        if let Some(s) = self.collective.as_ref().and_then(|c| c.rendezvous_s) {
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return Err((
                    "tables.collective.rendezvous_s".into(),
                    format!("must be a finite number of seconds in [0, 1] (got {s})"),
                ));
            }
        }
        if let Some(h) = &self.host_gap {
            check_provenance("tables.host_gap", &h.provenance)?;
            let s = h.seconds_per_op;
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return Err((
                    "tables.host_gap.seconds_per_op".into(),
                    format!("must be a finite number of seconds in [0, 1] (got {s})"),
                ));
            }
        }
        Ok(())
    }

    /// The kernel implementations with an attention table.
    pub fn attention_kernels(&self) -> Vec<String> {
        self.attention.keys().cloned().collect()
    }

    /// The efficiency of an `m x n x k` GEMM of `dtype` when a bucket covers it.
    ///
    /// Where no bucket holds (m, n, k), the bucket of its transpose (n, m, k) does: `C = A B`
    /// and `C^T = B^T A^T` are one GEMM with the operands swapped (how a row-major caller drives
    /// a column-major BLAS), the same FLOPs over the same bytes. A framework computes a weight
    /// gradient in either orientation (the CPU executor's SwiGLU fc1 `dW` is `dY^T X`, the
    /// estimate's `X^T dY`), and without this the one it did not time fell to the roofline.
    pub fn gemm_efficiency(&self, dtype: DType, m: u64, n: u64, k: u64) -> Option<f64> {
        let buckets = &self.gemm.as_ref()?.buckets;
        let find = |m: u64, n: u64| {
            let key = (dtype, octave(m), octave(n), octave(k));
            buckets
                .iter()
                .find(|b| (b.dtype, b.m, b.n, b.k) == key)
                .map(|b| b.efficiency)
        };
        find(m, n).or_else(|| find(n, m))
    }

    /// FLOP/s of kernel `kernel`'s `pass` at `seq_len`, when its curve for the mask and head
    /// dimension covers that length.
    pub fn attention_flops_per_s(
        &self,
        kernel: &str,
        pass: Pass,
        mask: MaskKind,
        head_dim: u64,
        seq_len: u64,
    ) -> Option<f64> {
        let c = self
            .attention
            .get(kernel)?
            .curves
            .iter()
            .find(|c| (c.pass, c.mask, c.head_dim) == (pass, mask, head_dim))?;
        interpolate_log(&c.seq_len, &c.flops_per_s, seq_len as f64)
    }

    /// Bytes per second of a memory-bound op moving `bytes`, when the table covers it.
    pub fn memory_bytes_per_s(&self, bytes: u64) -> Option<f64> {
        let m = self.memory.as_ref()?;
        interpolate_log(&m.bytes, &m.bytes_per_s, bytes as f64)
    }

    /// Bus bandwidth of `op` over `group_size` ranks placed `placement` at `bytes`, when
    /// the table covers it.
    pub fn collective_bus_bytes_per_s(
        &self,
        op: CollectiveKind,
        group_size: u32,
        placement: Placement,
        bytes: u64,
    ) -> Option<f64> {
        let c = self
            .collective
            .as_ref()?
            .curves
            .iter()
            .find(|c| (c.op, c.group_size, c.placement) == (op, group_size, placement))?;
        interpolate_log(&c.bytes, &c.bus_bytes_per_s, bytes as f64)
    }

    /// The measured share of the link's bandwidth of `op` over `group_size` ranks placed
    /// `placement` ([`CollectiveCurve::link_efficiency`]), for a call outside its curve.
    pub fn collective_link_efficiency(
        &self,
        op: CollectiveKind,
        group_size: u32,
        placement: Placement,
    ) -> Option<f64> {
        self.collective
            .as_ref()?
            .curves
            .iter()
            .find(|c| (c.op, c.group_size, c.placement) == (op, group_size, placement))?
            .link_efficiency
    }

    /// Seconds added per table-timed op: the measured host gap, or 0 without a host-gap table.
    pub fn host_gap_s(&self) -> f64 {
        self.host_gap.as_ref().map_or(0.0, |h| h.seconds_per_op)
    }

    /// Seconds of synchronisation added per table-timed collective (`rendezvous_s`), 0 where
    /// the table's timings hold it.
    pub fn collective_rendezvous_s(&self) -> f64 {
        self.collective
            .as_ref()
            .and_then(|c| c.rendezvous_s)
            .unwrap_or(0.0)
    }
}

/// Checks the collective table's curves; `Err((field, rule))` names the first bad one.
fn check_collective(c: &CollectiveTable) -> Result<(), (String, String)> {
    check_provenance("tables.collective", &c.provenance)?;
    require_points("tables.collective.curves", c.curves.len())?;
    for (i, cv) in c.curves.iter().enumerate() {
        let cf = format!("tables.collective.curves[{i}]");
        check_curve(
            &cf,
            "bytes",
            "bus_bytes_per_s",
            &cv.bytes,
            &cv.bus_bytes_per_s,
            &cv.count,
        )?;
        if cv.group_size < 2 {
            return Err((
                format!("{cf}.group_size"),
                format!(
                    "a collective needs at least 2 ranks (got {})",
                    cv.group_size
                ),
            ));
        }
        if let Some(e) = cv.link_efficiency {
            if !(e.is_finite() && e > 0.0 && e <= 1.0) {
                return Err((
                    format!("{cf}.link_efficiency"),
                    format!("must be a share of the link's bandwidth in (0, 1] (got {e})"),
                ));
            }
        }
        let dup = c.curves[..i]
            .iter()
            .any(|o| (o.op, o.group_size, o.placement) == (cv.op, cv.group_size, cv.placement));
        if dup {
            return Err((cf, "op, group_size and placement are given twice".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a power law y = c x^p, log-log interpolation between two points is exact.
    #[test]
    fn log_interpolation_is_exact_on_a_power_law() {
        let f = |x: f64| 3.0 * x.powf(0.7);
        let keys = [1024.0, 16384.0];
        let values = [f(1024.0), f(16384.0)];
        for x in [1024.0, 2000.0, 4096.0, 16384.0] {
            let y = interpolate_log(&keys, &values, x).unwrap();
            assert!((y / f(x) - 1.0).abs() < 1e-12, "{x}: {y} vs {}", f(x));
        }
        assert_eq!(interpolate_log(&keys, &values, 1023.0), None);
        assert_eq!(interpolate_log(&keys, &values, 16385.0), None);
        assert_eq!(interpolate_log(&[5.0], &[2.0], 5.0), Some(2.0));
        assert_eq!(interpolate_log(&[5.0], &[2.0], 6.0), None);
    }

    #[test]
    fn octaves_are_the_largest_power_of_two_below() {
        assert_eq!(octave(1), 1);
        assert_eq!(octave(4096), 4096);
        assert_eq!(octave(5632), 4096);
        assert_eq!(octave(8191), 4096);
        assert_eq!(octave(8192), 8192);
    }

    /// nccl-tests' PERFORMANCE.md: all-reduce over 8 ranks moves 2 x 7/8 of the buffer.
    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(CollectiveKind::AllReduce.bus_factor(8), 1.75);
        assert_eq!(CollectiveKind::AllGather.bus_factor(4), 0.75);
        assert_eq!(CollectiveKind::SendRecv.bus_factor(2), 1.0);
    }
}
