//! What a caller asks of a run beyond the Plan itself: how many steps, and in which recipe.

use crate::plan::Precision;

/// How long a run lasts and which numeric recipe it uses (the calibration sweep's request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLength {
    /// Steps in all (warm-up included).
    pub steps: u32,
    /// Leading steps left out of the timing.
    pub warmup: u32,
    /// fp32, or the bf16 mixed-precision recipe.
    pub precision: Precision,
}
