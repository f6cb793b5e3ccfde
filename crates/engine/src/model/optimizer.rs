//! The optimizer's state and its step, from the dtypes of the training weights, the master
//! copy, Adam's two moments (Kingma & Ba 2015) and the gradients: what memory holds per
//! trainable parameter and what the update streams through HBM, one model for both.

use crate::config::{Precision, TrainingConfig};

/// Adam with mixed precision (Micikevicius et al. 2018, "Mixed Precision Training"): an fp32
/// master copy beside low-precision weights (none when training in fp32) and two fp32 moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerState {
    /// Bytes of one training weight element.
    pub weight_bytes: u64,
    /// Bytes of one master-weight element (0 when the weights themselves are fp32).
    pub master_bytes: u64,
    /// Bytes of one element of each moment.
    pub moment_bytes: u64,
    /// Moments per parameter (Adam's first and second).
    pub moments: u64,
    /// Bytes of one gradient element (the accumulation buffer).
    pub grad_bytes: u64,
}

impl OptimizerState {
    pub fn of(t: &TrainingConfig) -> OptimizerState {
        OptimizerState {
            weight_bytes: t.weight_bytes(),
            master_bytes: if t.precision == Precision::Fp32 { 0 } else { 4 },
            moment_bytes: 4,
            moments: 2,
            grad_bytes: t.grad_dtype.bytes(),
        }
    }

    /// Optimizer-state bytes per trainable parameter: master copy and moments (12 with a
    /// master copy, 8 without).
    pub fn state_bytes_per_param(&self) -> u64 {
        self.master_bytes + self.moments * self.moment_bytes
    }

    /// HBM bytes one update streams per parameter: read the gradient, read and write the fp32
    /// copy being updated (the master, or the fp32 weight itself) and both moments, then
    /// write the low-precision weight cast from the master (30 for bf16 weights with fp32
    /// gradients).
    pub fn step_bytes_per_param(&self) -> u64 {
        let updated = if self.master_bytes > 0 {
            self.master_bytes
        } else {
            self.weight_bytes
        };
        let cast = if self.master_bytes > 0 {
            self.weight_bytes
        } else {
            0
        };
        self.grad_bytes + 2 * updated + 2 * self.moments * self.moment_bytes + cast
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;

    #[test]
    fn mixed_precision_adam_holds_12_bytes_and_streams_30() {
        let o = OptimizerState::of(&TrainingConfig::default());
        assert_eq!(o.state_bytes_per_param(), 12);
        assert_eq!(o.step_bytes_per_param(), 30);
    }

    #[test]
    fn fp32_training_has_no_master_copy() {
        let t = TrainingConfig {
            precision: Precision::Fp32,
            ..TrainingConfig::default()
        };
        let o = OptimizerState::of(&t);
        assert_eq!(o.state_bytes_per_param(), 8);
        // Gradient 4, weight read and written 8, moments 16.
        assert_eq!(o.step_bytes_per_param(), 28);
    }

    #[test]
    fn bf16_gradients_are_read_in_two_bytes() {
        let t = TrainingConfig {
            grad_dtype: Dtype::Bf16,
            ..TrainingConfig::default()
        };
        assert_eq!(OptimizerState::of(&t).step_bytes_per_param(), 28);
    }
}
