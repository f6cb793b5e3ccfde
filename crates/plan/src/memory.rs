//! Bytes by category, as a run reports them and the engine predicts them.

use serde::{Deserialize, Serialize};

/// Bytes per category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.buffers
    }
}
