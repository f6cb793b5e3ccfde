//! Transformer Engine's quantise kernels priced as the calls they are: each kernel of a cast
//! (src/model/cast_kernels.rs: which kernels run and the bytes each moves) as a streaming
//! kernel with its launch ([`kernel_s`]).

use super::{OpCost, Rates};
pub use crate::model::cast_kernels::{CastInput, CastPass, Scaling};

impl CastPass {
    /// Seconds of the pass's kernels at `rates`, each with its launch ([`kernel_s`]).
    pub fn seconds(&self, rates: &Rates) -> f64 {
        self.kernels().map(|bytes| kernel_s(rates, bytes)).sum()
    }
}

/// Seconds of one cast kernel moving `bytes`: the profile's measured memory table where it
/// covers the size; else the bytes at the share of HBM bandwidth a streaming kernel measures
/// on the GPU (`gemm.operand_stream_fraction`: DeepGEMM's memory-bound GEMMs, 0.796 on the
/// GH100 die; a TE cast is the same pure read-then-write stream, and runs near it), with the
/// launch. Without a measured share, `efficiency.memory_bound` ([`Rates::memory_roofline`]).
/// The fitted elementwise share (0.29 on H100) is not used: it is far below what any
/// streaming kernel measures, a missing mechanism in disguise (docs/accuracy.md).
pub fn kernel_s(rates: &Rates, bytes: u64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    let cost = rates.table_memory(bytes).unwrap_or_else(|| {
        OpCost::new(
            bytes as f64 / rates.gemm_stream_bytes_per_s(),
            rates.gpu.efficiency.kernel_overhead_s,
        )
    });
    cost.total_s()
}
