//! The one op-cost function: what one call (a GEMM, an attention kernel call, a memory-bound
//! kernel, a collective, the host gap between ops) costs on a GPU profile. The estimate's time
//! model maps every op of the ledger onto [`Call`]s (time.rs) and calibration's op report maps
//! the executor's measured [`OpKey`]s onto them ([`Call::of_key`]); both price them with
//! [`CostModel::cost`], so `calibrate --report` scores measured ops against the model the
//! estimate runs. The profile's measured tables price a call where they cover it; else the
//! analytic models ([`rates`]): GEMMs by the roofline with wave quantisation, a fused attention
//! core at its published kernel's rates (src/attention_rates.rs) or `efficiency.attention`, an
//! unfused one as batched GEMMs, memory-bound kernels over HBM, collectives by NCCL's model or
//! the alpha-beta ring ([`crate::network`]).

pub mod cast;
pub mod host_issue;
pub mod issue;
pub mod rates;

use crate::config::GpuProfile;
use crate::model::CollectiveKind;
use crate::network::{CollectiveGroup, GroupGeometry, Network};
use parsim_plan::op_timing::{MaskKind, OpKey, Pass, PAPER_BACKWARD_FLOPS_PER_FORWARD};
pub use rates::{gemm_peak, OpCost, Rates};

/// How an attention core runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttentionKernel<'a> {
    /// One fused (flash) kernel: at the rates of the profile's measured curves of the
    /// implementation `measured` names (`tables.attention`) where they cover the call; else at
    /// the rates of the published kernel the profile names (`attention_kernel`); else at
    /// `efficiency.attention` of the bf16 peak.
    Fused { measured: Option<&'a str> },
    /// Separate matmuls and softmax: the batched GEMMs they are ([`Rates::unfused_core`]).
    Unfused,
}

/// One attention kernel call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionCall<'a> {
    /// The pass's FLOPs as the ledger counts them: a backward twice its forward. The published
    /// and measured rates are quoted for the FlashAttention papers' count (a backward 2.5
    /// forwards), so a backward runs 1.25 x these FLOPs at them.
    pub flops: f64,
    pub pass: Pass,
    /// The call's length, where its kernel's rate curve is read: the query (and key) length,
    /// the key length of a measured call.
    pub len: u64,
    /// Under the causal mask, or unmasked.
    pub causal: bool,
    pub head_dim: u64,
    /// A causal sliding window of this many keys per query (the FLOPs count only its pairs):
    /// timed at the published kernel's window series where it has them.
    pub window: Option<u64>,
    pub kernel: AttentionKernel<'a>,
}

/// One collective call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectiveCall {
    pub kind: CollectiveKind,
    /// The full buffer: all-reduce's buffer, all-gather's output, reduce-scatter's input,
    /// all-to-all's send buffer, a send's message (as nccl-tests counts a size).
    pub payload_bytes: u64,
    pub group_size: u32,
    pub group: CollectiveGroup,
}

impl CollectiveCall {
    /// A measured collective: its group of its size, placed as the key says
    /// ([`GroupGeometry::of_placement`]); `None` for other keys.
    fn of_key(key: &OpKey) -> Option<CollectiveCall> {
        let &OpKey::Collective {
            op,
            bytes,
            group_size,
            placement,
        } = key
        else {
            return None;
        };
        Some(CollectiveCall {
            kind: op,
            payload_bytes: bytes,
            group_size,
            group: CollectiveGroup::Shape(GroupGeometry::of_placement(placement, group_size)),
        })
    }
}

/// One call, as the cost model prices it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Call<'a> {
    /// `C[m, n] = A[m, k] B[k, n]` at the cost model's GEMM rates.
    Gemm {
        m: u64,
        n: u64,
        k: u64,
    },
    /// `groups` independent `C[m, n] = A[m, k] B[k, n]` in one grouped kernel (a rank's local
    /// experts, [`Rates::grouped_gemm_roofline`]); one group is [`Call::Gemm`].
    GroupedGemm {
        groups: u64,
        m: u64,
        n: u64,
        k: u64,
    },
    Attention(AttentionCall<'a>),
    /// A memory-bound kernel moving `bytes` (read plus written).
    Memory {
        bytes: u64,
    },
    Collective(CollectiveCall),
    /// The host time between two timed ops: the per-call overhead alone.
    HostGap,
}

/// What prices a call: the GPU's rates for the GEMM dtype at hand and the network the
/// collectives' groups run on.
#[derive(Debug, Clone, Copy)]
pub struct CostModel<'a> {
    pub rates: Rates<'a>,
    /// `None` prices no collective (a caller timing compute only).
    pub network: Option<&'a Network>,
}

impl CostModel<'_> {
    /// The cost of one `call`; `None` only for a collective without a network. A call that
    /// does no work (a zero dimension, no FLOPs, no bytes, a group of one) costs nothing, not
    /// even its launch.
    pub fn cost(&self, call: &Call) -> Option<OpCost> {
        let r = &self.rates;
        Some(match *call {
            Call::Gemm { m, n, k } | Call::GroupedGemm { m, n, k, .. }
                if m == 0 || n == 0 || k == 0 =>
            {
                OpCost::default()
            }
            Call::Gemm { m, n, k }
            | Call::GroupedGemm {
                groups: 0 | 1,
                m,
                n,
                k,
            } => r
                .table_gemm(m, n, k)
                .unwrap_or_else(|| r.gemm_roofline(m, n, k)),
            // A profile whose measured GEMM table covers one group's shape was measured on a
            // runner that issues a GEMM per group (parsim's executor loops over its local
            // experts, crates/executor/src/layers/moe.rs): the groups' calls, each with its
            // launch. Else one grouped kernel (Megatron-Core's TEGroupedLinear).
            Call::GroupedGemm { groups, m, n, k } => r
                .table_gemm(m, n, k)
                .map(|one| one.times(groups as f64))
                .unwrap_or_else(|| r.grouped_gemm_roofline(groups, m, n, k)),
            Call::Memory { bytes: 0 } => OpCost::default(),
            Call::Memory { bytes } => r
                .table_memory(bytes)
                .unwrap_or_else(|| r.memory_roofline(bytes)),
            Call::Attention(a) => self.attention(&a),
            Call::Collective(c) => {
                let t =
                    self.network?
                        .collective_time(c.group, c.kind, c.payload_bytes, c.group_size);
                OpCost {
                    device_s: t.wire_s,
                    overhead_s: t.host_gap_s,
                    pipeline_s: t.pipeline_s,
                }
            }
            Call::HostGap => {
                let gpu = r.gpu;
                let gap = gpu.tables.host_gap.as_ref().map(|h| h.seconds_per_op);
                OpCost::new(0.0, gap.unwrap_or(gpu.efficiency.kernel_overhead_s))
            }
        })
    }

    /// One attention call ([`AttentionKernel`] says which rates time it).
    fn attention(&self, a: &AttentionCall) -> OpCost {
        if a.flops.is_nan() || a.flops <= 0.0 {
            return OpCost::default();
        }
        let gpu = self.rates.gpu;
        // FLOPs as the published and measured rates count them.
        let quoted = match a.pass {
            Pass::Forward => a.flops,
            Pass::Backward => a.flops / 2.0 * PAPER_BACKWARD_FLOPS_PER_FORWARD,
        };
        let measured = match a.kernel {
            AttentionKernel::Fused { measured } => measured,
            AttentionKernel::Unfused => {
                let forward = match a.pass {
                    Pass::Forward => a.flops,
                    Pass::Backward => a.flops / 2.0,
                };
                let [f, b] = self.rates.unfused_core(a.len, a.head_dim, forward);
                return match a.pass {
                    Pass::Forward => f,
                    Pass::Backward => b,
                };
            }
        };
        let mask = if a.causal {
            MaskKind::Causal
        } else {
            MaskKind::Full
        };
        let t = &gpu.tables;
        if let Some(rate) =
            measured.and_then(|name| t.attention_flops_per_s(name, a.pass, mask, a.head_dim, a.len))
        {
            return OpCost::new(quoted / rate, t.host_gap_s());
        }
        let published = gpu
            .attention_kernel
            .as_deref()
            .and_then(crate::attention_rates::attention_kernel);
        match published {
            Some(k) => {
                let backward = a.pass == Pass::Backward;
                let rate = k.pass_flops_per_s(a.len, a.causal, a.head_dim, a.window, backward);
                OpCost::new(quoted / rate, gpu.efficiency.kernel_overhead_s)
            }
            None => self.rates.attention_efficiency(a.flops),
        }
    }
}

impl<'k> Call<'k> {
    /// The call a measured op key describes, with the GEMM rates of its dtype (the one
    /// `OpKey` -> call mapping): a GEMM as itself; an attention key as a fused call of its
    /// kernel implementation at its key length, of its FLOPs (FlashAttention's count of its
    /// shape, [`OpKey::work`]); a memory-bound op as its bytes; a collective over a group of
    /// its size placed as it says ([`GroupGeometry::of_placement`]); the host gap as itself.
    /// `None` where no model prices the key: a banded mask (its visited fraction is not in the
    /// key), a GEMM dtype with no peak, and a wait (the schedule's to predict, not a rate's).
    pub fn of_key<'g>(gpu: &'g GpuProfile, key: &'k OpKey) -> Option<(Rates<'g>, Call<'k>)> {
        let bf16 = || Rates::of_dtype(gpu, parsim_plan::DType::Bf16);
        Some(match key {
            OpKey::Gemm { m, n, k, dtype } => (
                Rates::of_dtype(gpu, *dtype)?,
                Call::Gemm {
                    m: *m,
                    n: *n,
                    k: *k,
                },
            ),
            OpKey::Attention { .. } => {
                let ((kernel, pass, mask, head_dim), kv_len) = key.attention_point()?;
                // None for a banded mask.
                let forward_flops = key.attention_forward_flops()?;
                let flops = match pass {
                    Pass::Forward => forward_flops,
                    Pass::Backward => 2.0 * forward_flops,
                };
                let call = AttentionCall {
                    flops,
                    pass,
                    len: kv_len,
                    causal: mask == MaskKind::Causal,
                    head_dim,
                    window: None,
                    kernel: AttentionKernel::Fused {
                        measured: Some(kernel),
                    },
                };
                (bf16()?, Call::Attention(call))
            }
            OpKey::Memory { bytes } => (bf16()?, Call::Memory { bytes: *bytes }),
            OpKey::Collective { .. } => (bf16()?, Call::Collective(CollectiveCall::of_key(key)?)),
            OpKey::HostGap => (bf16()?, Call::HostGap),
            OpKey::Wait => return None,
        })
    }
}

/// The cost of one call of `key` on `gpu` ([`Call::of_key`], then [`CostModel::cost`] over
/// `network`, the profile's links); `None` where [`Call::of_key`] is.
pub fn key_cost(gpu: &GpuProfile, network: &Network, key: &OpKey) -> Option<OpCost> {
    let (rates, call) = Call::of_key(gpu, key)?;
    CostModel {
        rates,
        network: Some(network),
    }
    .cost(&call)
}
