//! The optimizer's state and its step, from the dtypes of the training weights, the master
//! copy, Adam's two moments (Kingma & Ba 2015) and the gradients: what memory holds per
//! trainable parameter and what the update streams through HBM, one model for both.

use crate::config::{
    Fp8Recipe, Framework, Optimizer, OptimizerStateDtype, Precision, TrainingConfig,
};

/// Adam with mixed precision (Micikevicius et al. 2018, "Mixed Precision Training"): a master
/// copy beside low-precision weights (none when training in fp32 or without master weights)
/// and two moments in `training.optimizer_state_dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerState {
    /// Bytes of one training weight element.
    pub weight_bytes: u64,
    /// Bytes of one master-weight element: 4 (fp32); 2 for Megatron-Core's precision-aware
    /// optimizer, which keeps only the 16 bits an fp32 master adds to a bf16 weight, or for
    /// DeepSpeed's bf16 copy of its partition; 0 when the weights are fp32 or updated in place.
    pub master_bytes: u64,
    /// The moments' element type.
    pub moment_dtype: OptimizerStateDtype,
    /// Moments per parameter (Adam's first and second).
    pub moments: u64,
    /// Bytes of one gradient element (the accumulation buffer).
    pub grad_bytes: u64,
    /// The master copy is the weight plus its 16 remainder bits, so the step also reads and
    /// writes the weight to rebuild and split it.
    pub remainders: bool,
}

/// Whether Megatron-Core's precision-aware optimizer keeps the fp32 master as remainders:
/// TE's FusedAdam with `store_param_remainders` (Megatron's default, TE 2.1 and later) when
/// TE manages the master, i.e. bf16 weights with no FP8 recipe or delayed scaling
/// (`use_precision_aware_optimizer_no_fp8_or_ds_fp8` in megatron/core/optimizer/
/// optimizer_config.py; `master_param` is int16 in distrib_optimizer.py). The precision-aware
/// optimizer is on when the moments are below fp32.
fn stores_remainders(t: &TrainingConfig) -> bool {
    let bf16_weights = match t.precision {
        Precision::Bf16 => true,
        Precision::Fp8 => {
            t.fp8_recipe.unwrap_or_default() == Fp8Recipe::Delayed && !t.fp8_param_gather
        }
        _ => false,
    };
    t.framework == Framework::MegatronCore
        && t.master_weights
        && t.optimizer_state_dtype() != OptimizerStateDtype::Fp32
        && bf16_weights
}

impl OptimizerState {
    pub fn of(t: &TrainingConfig) -> OptimizerState {
        let remainders = stores_remainders(t);
        let master_bytes = if t.precision == Precision::Fp32 {
            0
        } else if !t.master_weights {
            // DeepSpeed clones its partition in the master dtype (bf16 here:
            // deepspeed/runtime/zero/stage_1_and_2.py, `single_partition_of_fp32_groups`).
            if t.framework == Framework::Deepspeed {
                t.weight_bytes()
            } else {
                0
            }
        } else if remainders {
            2
        } else {
            4
        };
        OptimizerState {
            weight_bytes: t.weight_bytes(),
            master_bytes,
            moment_dtype: t.optimizer_state_dtype(),
            moments: 2,
            grad_bytes: t.grad_dtype.bytes(),
            remainders,
        }
    }

    /// Muon's state on the matrices it updates (megatron/core/optimizer/muon.py wraps it in
    /// the fp16 optimizer, so its parameters are the master copies and its one
    /// `momentum_buffer` is kept as Adam's moments are): Adam's with one moment.
    pub fn muon(t: &TrainingConfig) -> OptimizerState {
        OptimizerState {
            moments: 1,
            ..OptimizerState::of(t)
        }
    }

    /// Optimizer-state bytes of `n` trainable parameters: master copy and moments (12 per
    /// parameter with an fp32 master and fp32 moments, 8 without the master).
    pub fn state_bytes(&self, n: u64) -> u64 {
        n * self.master_bytes + self.moments * self.moment_dtype.moment_bytes(n)
    }

    /// HBM bytes one update of `n` parameters streams: read the gradient, read and write the
    /// copy being updated (the master, or the weight itself) and the moments, then write the
    /// low-precision weight cast from the master (read as well when the master is its
    /// remainder): 30 per parameter for bf16 weights with fp32 gradients, master and moments.
    pub fn step_bytes(&self, n: u64) -> u64 {
        let (updated, cast) = if self.master_bytes > 0 {
            (self.master_bytes, self.weight_bytes)
        } else {
            (self.weight_bytes, 0)
        };
        let rebuilt = if self.remainders {
            self.weight_bytes
        } else {
            0
        };
        n * (self.grad_bytes + 2 * updated + cast + rebuilt)
            + 2 * self.moments * self.moment_dtype.moment_bytes(n)
    }
}

/// (State bytes held, HBM bytes one step streams) for `updated` trainable parameters of
/// which `muon` are matrices Muon updates (ignored under Adam); the rest take Adam's.
pub fn optimizer_bytes(t: &TrainingConfig, updated: u64, muon: u64) -> (u64, u64) {
    let adam = OptimizerState::of(t);
    if t.optimizer == Optimizer::Adam {
        return (adam.state_bytes(updated), adam.step_bytes(updated));
    }
    let mu = OptimizerState::muon(t);
    let muon = muon.min(updated);
    let rest = updated - muon;
    (
        adam.state_bytes(rest) + mu.state_bytes(muon),
        adam.step_bytes(rest) + mu.step_bytes(muon),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;

    /// Weights + gradients + master + moments of one parameter under `f`'s settings.
    fn model_state_bytes(f: impl FnOnce(&mut TrainingConfig)) -> u64 {
        let mut t = TrainingConfig::default();
        f(&mut t);
        let o = OptimizerState::of(&t);
        o.weight_bytes + o.grad_bytes + o.state_bytes(1)
    }

    #[test]
    fn model_state_bytes_per_parameter_as_each_framework_allocates_them() {
        use OptimizerStateDtype::*;
        // Megatron's default: bf16 weight 2 + fp32 main gradient 4 + fp32 master 4 + moments
        // 4 + 4 = 18 (Megatron-LM docs/source/api-guide/dist_optimizer.md: 6 + 12 unsharded).
        assert_eq!(model_state_bytes(|_| {}), 18);
        // Rajbhandari et al. 2020 (ZeRO), Sec. 3.1: 2 + 2 + K = 12, 16 with 16-bit gradients.
        assert_eq!(model_state_bytes(|t| t.grad_dtype = Dtype::Bf16), 16);
        // Megatron's precision-aware optimizer: TE's FusedAdam keeps the fp32 master as the
        // 16 bits a bf16 weight lacks (int16 `master_param`): 2 + 4 + 2 + 2 + 2 = 12 with bf16
        // moments, 2 + 4 + 2 + 1 + 1 = 10 with fp8 ones.
        assert_eq!(
            model_state_bytes(|t| t.optimizer_state_dtype = Some(Bf16)),
            12
        );
        assert_eq!(
            model_state_bytes(|t| t.optimizer_state_dtype = Some(Fp8)),
            10
        );
        // FP8 with current scaling: Megatron manages a whole fp32 master, 2 + 4 + 4 + 1 + 1.
        assert_eq!(
            model_state_bytes(|t| {
                t.precision = Precision::Fp8;
                t.fp8_recipe = Some(Fp8Recipe::Current);
                t.optimizer_state_dtype = Some(Fp8);
            }),
            12
        );
        // fp16 weights have no remainder form: 2 + 4 + 4 + 2 + 2.
        assert_eq!(
            model_state_bytes(|t| {
                t.precision = Precision::Fp16;
                t.optimizer_state_dtype = Some(Fp16);
            }),
            14
        );
        // Pure bf16 without a master copy: FSDP (torch's AdamW on bf16 parameters) 2 + 2 + 0
        // + 2 + 2 = 8; DeepSpeed keeps a bf16 copy of its partition, 2 + 2 + 2 + 2 + 2 = 10.
        let pure = |f: Framework| {
            move |t: &mut TrainingConfig| {
                t.framework = f;
                t.master_weights = false;
                t.grad_dtype = Dtype::Bf16;
            }
        };
        assert_eq!(model_state_bytes(pure(Framework::Fsdp)), 8);
        assert_eq!(model_state_bytes(pure(Framework::Deepspeed)), 10);
    }

    #[test]
    fn int8_moments_carry_one_fp32_absmax_per_block_of_2048() {
        // bitsandbytes' 8-bit AdamW beside an fp32 master (FSDP): 4096 parameters hold the
        // master 4 x 4096 and per moment 4096 bytes + 2 blocks x 4 = 16384 + 2 x 4104; one
        // parameter more opens a third block on each moment.
        let t = TrainingConfig {
            framework: Framework::Fsdp,
            optimizer_state_dtype: Some(OptimizerStateDtype::Int8),
            ..TrainingConfig::default()
        };
        let o = OptimizerState::of(&t);
        assert_eq!(o.state_bytes(4096), 16384 + 2 * 4104);
        assert_eq!(o.state_bytes(4097), 16388 + 2 * (4097 + 12));
        // The step reads the fp32 gradient 4, reads and writes the master 8, writes the bf16
        // weight 2, and reads and writes both moments: 2 x 2 x (4096 + 8).
        assert_eq!(o.step_bytes(4096), 14 * 4096 + 4 * 4104);
    }

    #[test]
    fn the_step_streams_what_the_state_holds() {
        // Megatron with bf16 moments: gradient 4, weight and remainder each read and written
        // (4 + 4), moments 2 x 2 x 2 = 20.
        let t = TrainingConfig {
            optimizer_state_dtype: Some(OptimizerStateDtype::Bf16),
            ..TrainingConfig::default()
        };
        assert_eq!(OptimizerState::of(&t).step_bytes(1), 20);
        // Pure bf16 (FSDP): gradient 2, weight read and written 4, moments 8 = 14.
        let t = TrainingConfig {
            framework: Framework::Fsdp,
            master_weights: false,
            grad_dtype: Dtype::Bf16,
            ..TrainingConfig::default()
        };
        assert_eq!(OptimizerState::of(&t).step_bytes(1), 14);
    }

    #[test]
    fn mixed_precision_adam_holds_12_bytes_and_streams_30() {
        let o = OptimizerState::of(&TrainingConfig::default());
        assert_eq!(o.state_bytes(1), 12);
        assert_eq!(o.step_bytes(1), 30);
    }

    #[test]
    fn fp32_training_has_no_master_copy() {
        let t = TrainingConfig {
            precision: Precision::Fp32,
            ..TrainingConfig::default()
        };
        let o = OptimizerState::of(&t);
        assert_eq!(o.state_bytes(1), 8);
        // Gradient 4, weight read and written 8, moments 16.
        assert_eq!(o.step_bytes(1), 28);
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
        assert_eq!((m.state_bytes(1), m.step_bytes(1)), (8, 22));
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
        assert_eq!(OptimizerState::of(&t).step_bytes(1), 28);
    }
}
