//! The rates one call runs at on a GPU profile: the GEMM roofline with wave quantisation,
//! batched GEMMs, HBM streaming and the fused-attention efficiency (the analytic models), and
//! the profile's measured tables (`[tables]`, config/tables.rs) where they cover a call.
//! [`super::CostModel::cost`] chooses between them; nothing else prices a call.

use crate::config::GpuProfile;
use parsim_plan::dtype::DType;
use std::ops::Add;

/// Reduction depth of one k-loop iteration of a tensor-core GEMM tile (a 64-deep slice of
/// bf16 operands), the unit stream-K scheduling shares out.
const STREAM_K_ITERATION_DEPTH: u64 = 64;

/// What one call costs, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpCost {
    /// Time on the device (a collective's latency included).
    pub device_s: f64,
    /// The per-call overhead: the launch (`efficiency.kernel_overhead_s`), or the measured host
    /// gap where a table priced the call.
    pub overhead_s: f64,
    /// Of `device_s`, NCCL's chunk pipeline inside a node, which a copy-engine transfer does
    /// not pay (0 where NCCL's model did not price the call).
    pub pipeline_s: f64,
}

impl OpCost {
    /// `device_s` seconds on the device after `overhead_s` of launch.
    #[inline]
    pub fn new(device_s: f64, overhead_s: f64) -> OpCost {
        OpCost {
            device_s,
            overhead_s,
            pipeline_s: 0.0,
        }
    }

    /// Device time plus overhead: what the call adds to a step.
    #[inline]
    pub fn total_s(&self) -> f64 {
        self.device_s + self.overhead_s
    }

    /// `k` calls of this one.
    pub fn times(self, k: f64) -> OpCost {
        OpCost {
            device_s: k * self.device_s,
            overhead_s: k * self.overhead_s,
            pipeline_s: k * self.pipeline_s,
        }
    }
}

impl Add for OpCost {
    type Output = OpCost;
    #[inline]
    fn add(self, o: OpCost) -> OpCost {
        OpCost {
            device_s: self.device_s + o.device_s,
            overhead_s: self.overhead_s + o.overhead_s,
            pipeline_s: self.pipeline_s + o.pipeline_s,
        }
    }
}

/// The dense peak a GEMM of `dtype` runs against, with the profile field it comes from; `None`
/// for dtypes no GEMM runs in.
pub fn gemm_peak(gpu: &GpuProfile, dtype: DType) -> Option<(f64, &'static str)> {
    match dtype {
        DType::Bf16 => Some((gpu.peak_flops.bf16, "peak_flops.bf16")),
        DType::F32 => Some((gpu.peak_flops.fp32, "peak_flops.fp32")),
        DType::U8 => None,
    }
}

/// The rates one op runs at: matmul peak for its dtype and the profile's efficiencies.
#[derive(Debug, Clone, Copy)]
pub struct Rates<'a> {
    pub gpu: &'a GpuProfile,
    /// Dense peak FLOP/s for the training dtype.
    pub peak_flops: f64,
    /// Bytes of one GEMM operand element.
    pub element_bytes: u64,
    /// Fraction of `peak_flops` a large, well-shaped GEMM of the training dtype reaches
    /// ([`GpuProfile::matmul_efficiency_for`]).
    pub matmul_efficiency: f64,
}

impl<'a> Rates<'a> {
    /// The rates of GEMMs whose operands are `dtype` (a measured op's key names it): its dense
    /// peak at `efficiency.matmul`; `None` for a dtype no GEMM runs in.
    pub fn of_dtype(gpu: &'a GpuProfile, dtype: DType) -> Option<Rates<'a>> {
        let (peak_flops, _) = gemm_peak(gpu, dtype)?;
        Some(Rates {
            gpu,
            peak_flops,
            element_bytes: dtype.size_bytes(),
            matmul_efficiency: gpu.efficiency.matmul,
        })
    }
}

impl Rates<'_> {
    /// An [m x k] . [k x n] GEMM by the roofline: the slower of compute (at the matmul
    /// efficiency, divided by the wave-quantisation efficiency of its output tiles) and memory
    /// (operands and result over HBM at [`Self::gemm_stream_bytes_per_s`]), after the kernel
    /// overhead: [`Self::grouped_gemm_roofline`] of one group.
    pub fn gemm_roofline(&self, m: u64, n: u64, k: u64) -> OpCost {
        self.grouped_gemm_roofline(1, m, n, k)
    }

    /// `groups` independent [m x k] . [k x n] GEMMs in one grouped kernel (Megatron-Core's
    /// `TEGroupedLinear` over a rank's local experts, megatron/core/extensions/
    /// transformer_engine.py; DeepGEMM's `m_grouped_gemm_*_contiguous`, each group its own
    /// weight): their output tiles share the waves, and each group streams its own [k x n]
    /// operand, so a group of few rows is bound by its weight's bytes where one dense GEMM
    /// of the same total rows reads the weight once. The slower of compute and memory, after
    /// one kernel overhead; one group is the dense GEMM. Each group's last row tile is
    /// partly empty: the groups' row tiles over the dense GEMM's (`padding`) are computed
    /// for nothing.
    pub fn grouped_gemm_roofline(&self, groups: u64, m: u64, n: u64, k: u64) -> OpCost {
        let groups = groups.max(1);
        let tiles = groups.saturating_mul(self.output_tiles(m, n));
        let wave_efficiency = self.wave_efficiency(tiles, k);
        let tile_m = u64::from(self.gpu.gemm.tile_m.max(1));
        let padding = (groups.saturating_mul(m.div_ceil(tile_m))) as f64
            / groups.saturating_mul(m).div_ceil(tile_m).max(1) as f64;
        let flops = groups as f64 * 2.0 * m as f64 * n as f64 * k as f64;
        let e = &self.gpu.efficiency;
        let compute =
            padding * flops / (self.peak_flops * self.matmul_efficiency * wave_efficiency);
        let bytes = groups as f64 * (m * k + k * n + m * n) as f64 * self.element_bytes as f64;
        let memory = bytes / self.gemm_stream_bytes_per_s();
        OpCost::new(compute.max(memory), e.kernel_overhead_s)
    }

    /// The HBM rate a GEMM streams its operands at: the profile's measured share for
    /// memory-bound GEMMs (`gemm.operand_stream_fraction`), else `efficiency.memory_bound`.
    pub fn gemm_stream_bytes_per_s(&self) -> f64 {
        let g = self.gpu;
        let share = g
            .gemm
            .operand_stream_fraction
            .unwrap_or(g.efficiency.memory_bound);
        g.hbm_bytes_per_s * share
    }

    /// The GEMM dtype a measured table is keyed by: f32 for 4-byte operands, bf16 for 2-byte
    /// ones at the bf16 peak; `None` (no table) for FP8 and FP4 recipes.
    fn table_dtype(&self) -> Option<(DType, f64)> {
        let peak = &self.gpu.peak_flops;
        match self.element_bytes {
            4 => Some((DType::F32, peak.fp32)),
            2 if self.peak_flops == peak.bf16 => Some((DType::Bf16, peak.bf16)),
            _ => None,
        }
    }

    /// An [m x k] . [k x n] GEMM at its measured bucket's efficiency of the dtype's peak, after
    /// the measured host gap, when the profile's GEMM table covers it.
    pub fn table_gemm(&self, m: u64, n: u64, k: u64) -> Option<OpCost> {
        let (dtype, peak) = self.table_dtype()?;
        let t = &self.gpu.tables;
        let e = t.gemm_efficiency(dtype, m, n, k)?;
        Some(OpCost::new(
            2.0 * m as f64 * n as f64 * k as f64 / (peak * e),
            t.host_gap_s(),
        ))
    }

    /// Output tiles of an [m x n] GEMM result.
    fn output_tiles(&self, m: u64, n: u64) -> u64 {
        let g = &self.gpu.gemm;
        m.div_ceil(g.tile_m.max(1) as u64) * n.div_ceil(g.tile_n.max(1) as u64)
    }

    /// Fraction of the SMs' time doing work when `tiles` output tiles of reduction depth `k`
    /// run in waves of one tile per SM: a last, partial wave costs a full one. With stream-K
    /// scheduling (`gemm.stream_k`; Osama et al. 2023, "Stream-K: Work-centric Parallel
    /// Decomposition for Dense Matrix-Matrix Multiplication on the GPU") the SMs share the
    /// tiles' k-loop iterations instead, so only the last round of iterations is partial.
    fn wave_efficiency(&self, tiles: u64, k: u64) -> f64 {
        let sms = self.gpu.gemm.sms.max(1) as u64;
        let work = if self.gpu.gemm.stream_k {
            tiles.saturating_mul(k.div_ceil(STREAM_K_ITERATION_DEPTH).max(1))
        } else {
            tiles
        };
        let rounds = work.div_ceil(sms).max(1);
        work as f64 / (rounds as f64 * sms as f64)
    }

    /// `batch` independent [m x k] . [k x n] GEMMs in one batched call (cuBLAS's
    /// strided-batched GEMM, as an unfused attention core runs QK^T and PV): the batch's output
    /// tiles share the waves, each GEMM runs at `efficiency.matmul`, and at most at the bf16
    /// rate (FP8 recipes cast the linear layers, not the attention core). The HBM traffic of
    /// the s x s operands is the caller's to add.
    fn batched_gemm(&self, batch: f64, m: u64, n: u64, k: u64) -> OpCost {
        if batch.is_nan() || batch <= 0.0 || m == 0 || n == 0 || k == 0 {
            return OpCost::default();
        }
        let tiles = (batch.ceil() as u64).saturating_mul(self.output_tiles(m, n));
        let flops = batch * 2.0 * m as f64 * n as f64 * k as f64;
        let e = &self.gpu.efficiency;
        let peak = self.peak_flops.min(self.gpu.peak_flops.bf16);
        OpCost::new(
            flops / (peak * e.matmul * self.wave_efficiency(tiles, k)),
            e.kernel_overhead_s,
        )
    }

    /// An unfused attention core's (forward, backward) GEMMs, from first principles instead of
    /// a fitted attention efficiency: per head, forward QK^T ([s x d] . [d x s]) and PV
    /// ([s x s] . [s x d]); backward dP = dO V^T (s x s x d) and dV = P^T dO, dQ = dS K,
    /// dK = dS^T Q (s x d x s each). The heads x micro batch count is the forward's FLOPs over
    /// one head's 4 s^2 d.
    pub fn unfused_core(&self, seq_len: u64, head_dim: u64, forward_flops: f64) -> [OpCost; 2] {
        let (s, d) = (seq_len.max(1), head_dim.max(1));
        let heads = forward_flops / (4.0 * s as f64 * s as f64 * d as f64);
        let scores = self.batched_gemm(heads, s, s, d);
        let by_v = self.batched_gemm(heads, s, d, s);
        [scores + by_v, scores + by_v.times(3.0)]
    }

    /// [`Self::unfused_core`] in seconds: (forward, backward).
    pub fn unfused_core_s(&self, seq_len: u64, head_dim: u64, forward_flops: f64) -> (f64, f64) {
        let [f, b] = self.unfused_core(seq_len, head_dim, forward_flops);
        (f.total_s(), b.total_s())
    }

    /// `bytes` streamed through HBM once at `efficiency.memory_bound`, after the kernel
    /// overhead.
    pub fn memory_roofline(&self, bytes: u64) -> OpCost {
        let e = &self.gpu.efficiency;
        OpCost::new(
            bytes as f64 / (self.gpu.hbm_bytes_per_s * e.memory_bound),
            e.kernel_overhead_s,
        )
    }

    /// `bytes` at the measured rate of the profile's memory table, after the measured host
    /// gap, when the table covers that size.
    pub fn table_memory(&self, bytes: u64) -> Option<OpCost> {
        let t = &self.gpu.tables;
        let rate = t.memory_bytes_per_s(bytes)?;
        Some(OpCost::new(bytes as f64 / rate, t.host_gap_s()))
    }

    /// Attention-core FLOPs at the fused kernel's efficiency, after the kernel overhead. The
    /// core runs at most at the bf16 rate: FP8 training (Transformer Engine's recipe) casts
    /// the linear layers' GEMMs, not the attention kernel.
    pub fn attention_efficiency(&self, flops: f64) -> OpCost {
        let e = &self.gpu.efficiency;
        let peak = self.peak_flops.min(self.gpu.peak_flops.bf16);
        OpCost::new(flops / (peak * e.attention), e.kernel_overhead_s)
    }
}
