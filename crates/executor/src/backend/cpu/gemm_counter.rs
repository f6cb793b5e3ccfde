//! A rank's GEMM FLOPs and seconds: its device owns the counter, its GEMM kernels add to it,
//! so a step can report the rate its matmuls ran at.

use std::sync::{Arc, Mutex};

/// FLOPs and seconds of the GEMMs of one rank; clones share the count.
#[derive(Debug, Clone, Default)]
pub struct GemmCounter {
    flops_seconds: Arc<Mutex<(f64, f64)>>,
}

impl GemmCounter {
    /// A counter at zero.
    pub fn new() -> GemmCounter {
        GemmCounter::default()
    }

    /// Counts one GEMM of `flops` that took `seconds`.
    pub fn add(&self, flops: f64, seconds: f64) {
        let mut c = self.flops_seconds.lock().unwrap_or_else(|e| e.into_inner());
        c.0 += flops;
        c.1 += seconds;
    }

    /// (FLOPs, seconds) counted so far.
    pub fn get(&self) -> (f64, f64) {
        *self.flops_seconds.lock().unwrap_or_else(|e| e.into_inner())
    }
}
