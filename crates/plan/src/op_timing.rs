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
    /// Host time between timed ops inside an action: launches, bookkeeping, waits. Its
    /// `calls` are the timed ops the gaps fall between (an action with none counts one), so
    /// its mean is seconds per op.
    HostGap,
    /// Time blocked inside a collective or a receive waiting for the other ranks to arrive
    /// (pipeline bubbles, stage imbalance, skew), kept apart from the collective's own time,
    /// which starts when the last member arrives. The time model predicts it from the
    /// schedule, not from a rate: no table is fitted to it. Measured where the backend can
    /// see it (the CPU backend's barriers and mailboxes); `calls` are the waits.
    Wait,
}

/// An attention rate curve: kernel implementation, pass, mask and head dimension.
pub type AttentionCurveKey<'a> = (&'a str, Pass, MaskKind, u64);

/// The op classes, in the order reports list them: [`OpKey::class`]'s names, which are also
/// the `class` tags of the JSON records.
pub const OP_CLASSES: [&str; 6] = [
    "gemm",
    "attention",
    "memory",
    "collective",
    "host_gap",
    "wait",
];

impl CollectiveKind {
    /// The name as the JSON records spell it (`all_reduce`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::SendRecv => "send_recv",
        }
    }

    /// The bus factor of this collective over `n` ranks: nccl-tests' bus-bandwidth factor (its
    /// PERFORMANCE.md; seconds = factor x bytes / bus bandwidth), which is also the bytes each
    /// rank sends on the wire per payload byte with ring algorithms (Thakur et al. 2005):
    /// all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n; broadcast and
    /// send/receive 1. The one factor of the volume model, the time model and the rate tables.
    pub fn bus_factor(self, n: u32) -> f64 {
        let n = n.max(1) as f64;
        match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::AllGather
            | CollectiveKind::ReduceScatter
            | CollectiveKind::AllToAll => (n - 1.0) / n,
            CollectiveKind::Broadcast | CollectiveKind::SendRecv => 1.0,
        }
    }
}

/// FLOPs the FlashAttention papers count for a backward pass, per forward FLOP: five
/// matmuls (dV, dP, dQ, dK and the recomputed scores) against the forward's two.
pub const PAPER_BACKWARD_FLOPS_PER_FORWARD: f64 = 2.5;

/// What an op class's rate counts: the work of [`OpKey::work`] per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateUnit {
    /// FLOP/s (GEMMs, attention).
    Flops,
    /// Bytes moved per second (memory-bound ops).
    Bytes,
    /// nccl-tests' bus bytes per second (collectives).
    BusBytes,
}

impl OpKey {
    /// The key's class, one of [`OP_CLASSES`] (its `class` tag in the JSON records).
    pub fn class(&self) -> &'static str {
        let i = match self {
            OpKey::Gemm { .. } => 0,
            OpKey::Attention { .. } => 1,
            OpKey::Memory { .. } => 2,
            OpKey::Collective { .. } => 3,
            OpKey::HostGap => 4,
            OpKey::Wait => 5,
        };
        OP_CLASSES[i]
    }

    /// The first dimension of the key that is zero (an op that does no work: an expert that
    /// got no tokens), which a rate cannot be taken from; `None` for the host gap.
    pub fn zero_dimension(&self) -> Option<&'static str> {
        let dims: &[(&'static str, u64)] = match self {
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
            OpKey::HostGap | OpKey::Wait => &[],
        };
        dims.iter().find(|(_, v)| *v == 0).map(|(field, _)| *field)
    }

    /// The unit the class's rate counts in ([`OpKey::work`]; the host gap has none).
    pub fn rate_unit(&self) -> Option<RateUnit> {
        match self {
            OpKey::Gemm { .. } | OpKey::Attention { .. } => Some(RateUnit::Flops),
            OpKey::Memory { .. } => Some(RateUnit::Bytes),
            OpKey::Collective { .. } => Some(RateUnit::BusBytes),
            OpKey::HostGap | OpKey::Wait => None,
        }
    }

    /// Where an attention key sits in the rate tables: its curve (kernel implementation,
    /// pass, mask, head dimension) and its key length along it; `None` for other classes.
    pub fn attention_point(&self) -> Option<(AttentionCurveKey<'_>, u64)> {
        match self {
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

    /// An attention key's forward FLOPs as the FlashAttention papers count them, whatever its
    /// pass: 4 x heads x q x kv x d, halved under a causal mask. `None` for other keys and for
    /// a banded mask, whose visited fraction the key does not give.
    pub fn attention_forward_flops(&self) -> Option<f64> {
        let OpKey::Attention {
            batch_heads,
            q_len,
            kv_len,
            head_dim,
            mask,
            ..
        } = self
        else {
            return None;
        };
        let full = 4.0 * (*batch_heads * *q_len) as f64 * (*kv_len * *head_dim) as f64;
        match mask {
            MaskKind::Full => Some(full),
            MaskKind::Causal => Some(full / 2.0),
            MaskKind::Banded => None,
        }
    }

    /// The work of one call, in the unit its rate counts ([`RateUnit`]): a GEMM's 2mnk FLOPs;
    /// attention's FLOPs as the FlashAttention papers count them (forward 4 x heads x q x kv
    /// x d, halved under a causal mask; backward 2.5 times that); a memory-bound op's bytes;
    /// a collective's bus bytes (its bytes times [`CollectiveKind::bus_factor`]). `None` for the host gap and
    /// for a banded mask, whose visited fraction the key does not give. The rate tables are
    /// fitted in these counts and the `execute --profile-ops` summary reports rates in them.
    pub fn work(&self) -> Option<(f64, RateUnit)> {
        match self {
            OpKey::Gemm { m, n, k, .. } => Some((
                2.0 * (*m as f64) * (*n as f64) * (*k as f64),
                RateUnit::Flops,
            )),
            OpKey::Attention { pass, .. } => {
                let forward = self.attention_forward_flops()?;
                let flops = match pass {
                    Pass::Forward => forward,
                    Pass::Backward => forward * PAPER_BACKWARD_FLOPS_PER_FORWARD,
                };
                Some((flops, RateUnit::Flops))
            }
            OpKey::Memory { bytes } => Some((*bytes as f64, RateUnit::Bytes)),
            OpKey::Collective {
                op,
                bytes,
                group_size,
                ..
            } => Some((
                op.bus_factor(*group_size) * *bytes as f64,
                RateUnit::BusBytes,
            )),
            OpKey::HostGap | OpKey::Wait => None,
        }
    }
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

    /// The rate the calls ran at: [`OpKey::work`] per second of their mean time; `None` where
    /// the work is unknown or the calls took no time.
    pub fn rate(&self) -> Option<f64> {
        let (work, _) = self.key.work()?;
        let s = self.mean_s();
        (s > 0.0).then(|| work / s)
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
        match self.key.zero_dimension() {
            Some(field) => Err(OpTimingError::ZeroDimension { field }),
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

    /// Rates by hand: a 4 x 5 x 6 GEMM is 2 x 120 = 240 FLOPs; causal self-attention over
    /// 3 heads of 4 positions at d = 8 is 4 x 3 x 4 x 4 x 8 / 2 = 768 FLOPs forward
    /// (FlashAttention-2's count) and 2.5 x that backward; an all-reduce over 4 ranks moves
    /// 2 x 3/4 of its 1000 bytes on the bus (nccl-tests' PERFORMANCE.md).
    #[test]
    fn work_and_rate_follow_the_published_counts() {
        let gemm = OpKey::Gemm {
            m: 4,
            n: 5,
            k: 6,
            dtype: DType::F32,
        };
        assert_eq!(gemm.work(), Some((240.0, RateUnit::Flops)));
        let attention = |pass| OpKey::Attention {
            batch_heads: 3,
            q_len: 4,
            kv_len: 4,
            head_dim: 8,
            mask: MaskKind::Causal,
            pass,
            kernel: "cpu".into(),
        };
        assert_eq!(attention(Pass::Forward).work().unwrap().0, 768.0);
        assert_eq!(attention(Pass::Backward).work().unwrap().0, 1920.0);
        let all_reduce = OpKey::Collective {
            op: CollectiveKind::AllReduce,
            bytes: 1000,
            group_size: 4,
            placement: Placement::IntraNode,
        };
        assert_eq!(all_reduce.work(), Some((1500.0, RateUnit::BusBytes)));
        assert_eq!(
            OpKey::Memory { bytes: 64 }.work(),
            Some((64.0, RateUnit::Bytes))
        );
        assert_eq!(OpKey::HostGap.work(), None);
        // Two calls of 240 FLOPs in 2 s: 240 FLOP/s; no time, no rate.
        let t = OpTiming {
            key: gemm,
            calls: 2,
            total_s: 2.0,
        };
        assert_eq!(t.rate(), Some(240.0));
        assert_eq!(OpTiming { total_s: 0.0, ..t }.rate(), None);
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

    /// A key's class and a collective's name are what its JSON record spells, and a class's
    /// rate unit is the unit of its work wherever the work is known.
    #[test]
    fn class_names_and_units_follow_the_records() {
        let ops = [
            CollectiveKind::AllReduce,
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::AllToAll,
            CollectiveKind::Broadcast,
            CollectiveKind::SendRecv,
        ];
        let mut keys = vec![
            OpKey::Gemm {
                m: 2,
                n: 3,
                k: 4,
                dtype: DType::Bf16,
            },
            OpKey::Attention {
                batch_heads: 2,
                q_len: 8,
                kv_len: 8,
                head_dim: 4,
                mask: MaskKind::Causal,
                pass: Pass::Backward,
                kernel: "cpu".into(),
            },
            OpKey::Memory { bytes: 64 },
            OpKey::HostGap,
            OpKey::Wait,
        ];
        for op in ops {
            let json = serde_json::to_value(op).unwrap();
            assert_eq!(json, op.as_str(), "{op:?}");
            keys.push(OpKey::Collective {
                op,
                bytes: 100,
                group_size: 4,
                placement: Placement::InterNode,
            });
        }
        for k in &keys {
            let json = serde_json::to_value(k).unwrap();
            assert_eq!(json["class"], k.class(), "{k:?}");
            assert!(OP_CLASSES.contains(&k.class()));
            if let Some((_, unit)) = k.work() {
                assert_eq!(Some(unit), k.rate_unit(), "{k:?}");
            }
        }
        assert_eq!(OpKey::HostGap.rate_unit(), None);
    }
}
