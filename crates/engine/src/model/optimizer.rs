//! The optimizer's state and its step, from the dtypes of the training weights, the master
//! copy, Adam's two moments (Kingma & Ba 2015) and the gradients: what memory holds per
//! trainable parameter and what the update streams through HBM, one model for both.

use crate::config::{Optimizer, Precision, TrainingConfig};

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

    /// Muon's state on the matrices it updates (megatron/core/optimizer/muon.py wraps it in
    /// the fp16 optimizer, so its parameters are the fp32 master copies and its one
    /// `momentum_buffer` is fp32 as they are): Adam's with one moment.
    pub fn muon(t: &TrainingConfig) -> OptimizerState {
        OptimizerState {
            moments: 1,
            ..OptimizerState::of(t)
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

/// (State bytes held, HBM bytes one step streams) for `updated` trainable parameters of
/// which `muon` are matrices Muon updates (ignored under Adam); the rest take Adam's.
pub fn optimizer_bytes(t: &TrainingConfig, updated: u64, muon: u64) -> (u64, u64) {
    let adam = OptimizerState::of(t);
    if t.optimizer == Optimizer::Adam {
        return (
            updated * adam.state_bytes_per_param(),
            updated * adam.step_bytes_per_param(),
        );
    }
    let mu = OptimizerState::muon(t);
    let muon = muon.min(updated);
    let rest = updated - muon;
    (
        rest * adam.state_bytes_per_param() + muon * mu.state_bytes_per_param(),
        rest * adam.step_bytes_per_param() + muon * mu.step_bytes_per_param(),
    )
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
    fn muon_holds_a_master_copy_and_one_momentum() {
        // Muon's matrices: fp32 master 4 + one fp32 momentum 4 = 8 bytes; its step reads the
        // fp32 gradient 4, reads and writes the master 8 and the momentum 8, writes the bf16
        // weight 2 = 22. The other parameters keep Adam's 12 and 30.
        let t = TrainingConfig {
            optimizer: Optimizer::Muon,
            ..TrainingConfig::default()
        };
        let m = OptimizerState::muon(&t);
        assert_eq!(
            (m.state_bytes_per_param(), m.step_bytes_per_param()),
            (8, 22)
        );
        assert_eq!(
            optimizer_bytes(&t, 100, 60),
            (40 * 12 + 60 * 8, 40 * 30 + 60 * 22)
        );
        // Under Adam the Muon share is ignored.
        let adam = TrainingConfig::default();
        assert_eq!(optimizer_bytes(&adam, 100, 60), (1200, 3000));
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
