//! Op-class timings: what `execute --profile-ops` measures inside each action and what
//! `parsim calibrate` fits rate tables to. One record per distinct op key per rank, summed
//! over the timed steps: the class and its key (GEMM shape, attention shape and kernel,
//! bytes of a memory-bound op, collective and its group), how many calls and their total
//! seconds. Plain data: the executor writes it into the run report and the measurement
//! lines (JSONL), the engine reads it.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// Which pass of an op was timed (attention's backward runs a different kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    Backward,
}

/// The attention mask, as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    Causal,
    Full,
    /// Sliding window or chunked: the kernel visits only part of the key range.
    Banded,
}

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    /// A point-to-point send or receive (pipeline stages, the CP ring).
    SendRecv,
}

/// Where a group's members sit: one host (or NVLink domain), or across the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    IntraNode,
    InterNode,
}

/// An op class and the key its rate depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum OpKey {
    /// `C[m, n] = A[m, k] B[k, n]`, inputs in `dtype`: 2mnk FLOPs per call.
    Gemm {
        m: u64,
        n: u64,
        k: u64,
        dtype: DType,
    },
    /// Scaled dot-product attention over `batch_heads` (micro batch x local query heads)
    /// independent heads, `q_len` queries against `kv_len` keys of width `head_dim`.
    Attention {
        batch_heads: u64,
        q_len: u64,
        kv_len: u64,
        head_dim: u64,
        mask: MaskKind,
        pass: Pass,
        /// The kernel implementation (`flash_mma`, `cpu`, ...): rates are per implementation.
        kernel: String,
    },
    /// A memory-bound op (norm, activation, softmax pieces, casts, the optimizer step):
    /// `bytes` read plus written per call.
    Memory { bytes: u64 },
    /// A collective of `bytes` per rank (the buffer each rank contributes or receives, as
    /// nccl-tests counts it) over `group_size` ranks.
    Collective {
        op: CollectiveKind,
        bytes: u64,
        group_size: u32,
        placement: Placement,
    },
    /// Host time between timed ops inside an action: launches, bookkeeping, waits.
    HostGap,
}

/// The timing of one op key: `calls` calls taking `total_s` seconds together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTiming {
    #[serde(flatten)]
    pub key: OpKey,
    pub calls: u64,
    pub total_s: f64,
}

/// Why an op timing cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpTimingError {
    #[error("`total_s` = {0} must be finite and not negative")]
    BadTime(f64),
    #[error("`calls` must be at least 1")]
    NoCalls,
    #[error("`{field}` must be at least 1")]
    ZeroDimension { field: &'static str },
}

impl OpTiming {
    /// Seconds per call.
    pub fn mean_s(&self) -> f64 {
        self.total_s / self.calls as f64
    }

    /// Checks what a fit divides by: a finite, non-negative time, at least one call and no
    /// zero dimension.
    pub fn validate(&self) -> Result<(), OpTimingError> {
        if !self.total_s.is_finite() || self.total_s < 0.0 {
            return Err(OpTimingError::BadTime(self.total_s));
        }
        if self.calls == 0 {
            return Err(OpTimingError::NoCalls);
        }
        let dims: &[(&'static str, u64)] = match &self.key {
            OpKey::Gemm { m, n, k, .. } => &[("m", *m), ("n", *n), ("k", *k)],
            OpKey::Attention {
                batch_heads,
                q_len,
                kv_len,
                head_dim,
                ..
            } => &[
                ("batch_heads", *batch_heads),
                ("q_len", *q_len),
                ("kv_len", *kv_len),
                ("head_dim", *head_dim),
            ],
            OpKey::Memory { bytes } => &[("bytes", *bytes)],
            OpKey::Collective {
                bytes, group_size, ..
            } => &[("bytes", *bytes), ("group_size", u64::from(*group_size))],
            OpKey::HostGap => &[],
        };
        match dims.iter().find(|(_, v)| *v == 0) {
            Some((field, _)) => Err(OpTimingError::ZeroDimension { field }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_timing_round_trips_through_the_documented_json() {
        let text = r#"{"class":"gemm","m":4096,"n":1024,"k":512,"dtype":"bf16","calls":3,"total_s":0.006}"#;
        let t: OpTiming = serde_json::from_str(text).unwrap();
        assert_eq!(
            t.key,
            OpKey::Gemm {
                m: 4096,
                n: 1024,
                k: 512,
                dtype: DType::Bf16
            }
        );
        assert!((t.mean_s() - 0.002).abs() < 1e-15);
        let back: OpTiming = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn bad_times_calls_and_dimensions_are_refused_by_field() {
        let base = OpTiming {
            key: OpKey::Collective {
                op: CollectiveKind::AllReduce,
                bytes: 1 << 20,
                group_size: 8,
                placement: Placement::IntraNode,
            },
            calls: 2,
            total_s: 1e-3,
        };
        assert_eq!(base.validate(), Ok(()));
        for bad in [-1e-3, f64::NAN, f64::INFINITY] {
            let t = OpTiming {
                total_s: bad,
                ..base.clone()
            };
            assert!(matches!(t.validate(), Err(OpTimingError::BadTime(_))));
        }
        let t = OpTiming {
            calls: 0,
            ..base.clone()
        };
        assert_eq!(t.validate(), Err(OpTimingError::NoCalls));
        let t = OpTiming {
            key: OpKey::Memory { bytes: 0 },
            ..base
        };
        assert_eq!(
            t.validate(),
            Err(OpTimingError::ZeroDimension { field: "bytes" })
        );
    }
}
