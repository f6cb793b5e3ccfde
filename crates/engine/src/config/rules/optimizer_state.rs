//! The optimizer's precision as each framework runs it: master weights off (pure-bf16
//! training) and the moments' dtype. Combinations no framework runs are refused by field,
//! with the framework's own rule (its file named in the message).

use super::super::{
    Config, Dtype, Framework, Optimizer, OptimizerStateDtype, Precision, Violation,
};

/// `training.master_weights = false`: bf16 weights updated in place, as torch's AdamW on bf16
/// parameters (FSDP) or DeepSpeed's `bf16_master_weights_and_grads` (ZeRO 1-3,
/// deepspeed/runtime/config.py) run it; the gradients are bf16 then. Megatron-Core always
/// keeps a master copy (`--main-params-dtype` takes fp32 or fp16, megatron/training/
/// arguments.py).
pub fn master_weights(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    if t.master_weights {
        return Vec::new();
    }
    let field = "training.master_weights";
    let pure_bf16 = "false is pure-bf16 training (bf16 weights updated without an fp32 master copy), so needs precision bf16";
    let grads = "without a master copy the gradients are the weights' bf16 (torch's param.grad; DeepSpeed's bf16_master_weights_and_grads)";
    let mut errs: Vec<Violation> = [
        (t.precision != Precision::Bf16)
            .then(|| Violation::new(field, format!("{pure_bf16}, got {}", t.precision))),
        (t.grad_dtype != Dtype::Bf16).then(|| {
            Violation::new(
                field,
                format!("{grads}, got training.grad_dtype {}", t.grad_dtype),
            )
            .hint("set training.grad_dtype = \"bf16\" (--grad-dtype bf16)")
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    match t.framework {
        Framework::MegatronCore => errs.push(
            Violation::new(
                field,
                "Megatron-Core always keeps a master copy (--main-params-dtype takes fp32 or fp16, megatron/training/arguments.py)",
            )
            .hint("keep the master weights and lower the moments (training.optimizer_state_dtype, the precision-aware optimizer), or set training.framework = \"fsdp\" or \"deepspeed\""),
        ),
        Framework::Deepspeed if cfg.parallel.zero == 0 => errs.push(
            Violation::new(
                field,
                "DeepSpeed runs bf16_master_weights_and_grads with ZeRO stage 1, 2 or 3 only (deepspeed/runtime/config.py), got parallel.zero 0",
            )
            .hint("set parallel.zero = 1, 2 or 3"),
        ),
        _ => {}
    }
    errs
}

/// `training.optimizer_state_dtype` where the framework stores its moments so:
/// - Megatron-Core: fp32, fp16, bf16 or fp8 (`--exp-avg-dtype`, `--exp-avg-sq-dtype`), below
///   fp32 through the precision-aware optimizer, which needs the distributed optimizer and
///   Adam (megatron/core/optimizer/optimizer_config.py);
/// - DeepSpeed: bf16 (`bf16_optimizer_states`) only with bf16 master weights, fp32 beside
///   them only with CPU offload (deepspeed/runtime/config.py, docs of the bf16 section);
/// - FSDP (torch): AdamW's moments in the parameters' dtype (fp32 beside the fp32 master,
///   bf16 without it), or int8 with bitsandbytes' 8-bit AdamW.
pub fn state_dtype(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let d = t.optimizer_state_dtype();
    let field = "training.optimizer_state_dtype";
    let refuse = |rule: String, hint: &str| vec![Violation::new(field, rule).hint(hint)];
    match t.framework {
        Framework::MegatronCore => {
            if d == OptimizerStateDtype::Int8 {
                return refuse(
                    "Megatron-Core's --exp-avg-dtype and --exp-avg-sq-dtype take fp32, fp16, bf16 or fp8 (megatron/training/arguments.py); bitsandbytes' int8 states are not among them".into(),
                    "use fp8 (TE's FusedAdam), or training.framework = \"fsdp\"",
                );
            }
            let mut errs = Vec::new();
            if d != OptimizerStateDtype::Fp32 && cfg.parallel.zero == 0 {
                errs.extend(refuse(
                    format!("{d} moments are Megatron-Core's precision-aware optimizer, which runs only with the distributed optimizer (megatron/core/optimizer/optimizer_config.py), got parallel.zero 0"),
                    "set parallel.zero = 1 (--use-distributed-optimizer)",
                ));
            }
            if d != OptimizerStateDtype::Fp32 && t.optimizer != Optimizer::Adam {
                errs.extend(refuse(
                    format!("{d} moments are Megatron-Core's precision-aware optimizer, which runs only with adam (megatron/core/optimizer/optimizer_config.py), got optimizer {}", t.optimizer),
                    "leave optimizer_state_dtype out, or set training.optimizer = \"adam\"",
                ));
            }
            errs
        }
        Framework::Deepspeed => match d {
            OptimizerStateDtype::Fp32 if !t.master_weights => refuse(
                "DeepSpeed keeps fp32 optimizer states beside bf16 master weights only with CPU offload (deepspeed/runtime/base_optimizer.py), which parsim does not model".into(),
                "use bf16 (bf16_optimizer_states), or keep the master weights",
            ),
            OptimizerStateDtype::Fp32 => Vec::new(),
            OptimizerStateDtype::Bf16 if t.master_weights => refuse(
                "DeepSpeed's bf16_optimizer_states requires bf16_master_weights_and_grads (deepspeed/runtime/config.py)".into(),
                "set training.master_weights = false (with training.grad_dtype = \"bf16\")",
            ),
            OptimizerStateDtype::Bf16 => Vec::new(),
            other => refuse(
                format!("DeepSpeed keeps its optimizer states in fp32 or bf16 (bf16_optimizer_states), got {other}"),
                "use fp32 or bf16",
            ),
        },
        Framework::Fsdp => match d {
            OptimizerStateDtype::Fp32 if !t.master_weights => refuse(
                "torch's AdamW keeps its moments in the parameters' dtype, bf16 without master weights".into(),
                "use bf16 (or leave optimizer_state_dtype out), or int8 (bitsandbytes)",
            ),
            OptimizerStateDtype::Bf16 if t.master_weights => refuse(
                "torch's AdamW keeps its moments in the parameters' dtype, fp32 beside the fp32 master weights".into(),
                "set training.master_weights = false (with training.grad_dtype = \"bf16\") for bf16 moments",
            ),
            OptimizerStateDtype::Fp16 | OptimizerStateDtype::Fp8 => refuse(
                format!("{d} moments are Megatron-Core's precision-aware optimizer (TE's FusedAdam); torch's optimizers keep the parameters' dtype, or int8 with bitsandbytes"),
                "use the parameters' dtype (leave it out) or int8, or training.framework = \"megatron-core\"",
            ),
            _ => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    fn pure_bf16(framework: Framework) -> Config {
        with(|c| {
            c.training.framework = framework;
            c.training.master_weights = false;
            c.training.grad_dtype = Dtype::Bf16;
            c.parallel.zero = 1;
        })
    }

    #[test]
    fn master_weights_off_is_pure_bf16_training_outside_megatron() {
        // FSDP and DeepSpeed run it (bf16 moments by default); Megatron-Core has no such mode.
        for f in [Framework::Fsdp, Framework::Deepspeed] {
            let c = pure_bf16(f);
            assert!(master_weights(&c).is_empty(), "{f:?}");
            assert!(state_dtype(&c).is_empty(), "{f:?}");
            assert_eq!(
                c.training.optimizer_state_dtype(),
                OptimizerStateDtype::Bf16
            );
        }
        let v = master_weights(&pure_bf16(Framework::MegatronCore));
        assert_eq!(fields(&v), ["training.master_weights"]);
        assert!(v[0].rule.contains("--main-params-dtype"), "{}", v[0]);
        // fp32 training has no master copy to leave out; fp32 gradients are not bf16 ones;
        // DeepSpeed needs ZeRO.
        let mut c = pure_bf16(Framework::Deepspeed);
        c.training.precision = Precision::Fp32;
        c.training.grad_dtype = Dtype::Fp32;
        c.parallel.zero = 0;
        let v = master_weights(&c);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].rule.contains("precision bf16, got fp32"), "{}", v[0]);
        assert!(v[1].rule.contains("grad_dtype fp32"), "{}", v[1]);
        assert!(v[2].rule.contains("parallel.zero 0"), "{}", v[2]);
    }

    #[test]
    fn each_framework_stores_the_moments_it_runs() {
        let state = |f: Framework, master: bool, d: OptimizerStateDtype| {
            let mut c = pure_bf16(f);
            c.training.master_weights = master;
            c.training.optimizer_state_dtype = Some(d);
            state_dtype(&c).len()
        };
        use OptimizerStateDtype::*;
        // Megatron-Core: everything but int8, with its master copy.
        for d in [Fp32, Bf16, Fp16, Fp8] {
            assert_eq!(state(Framework::MegatronCore, true, d), 0, "{d}");
        }
        assert_eq!(state(Framework::MegatronCore, true, Int8), 1);
        // DeepSpeed: fp32 with a master, bf16 without; nothing narrower.
        assert_eq!(state(Framework::Deepspeed, true, Fp32), 0);
        assert_eq!(state(Framework::Deepspeed, false, Fp32), 1);
        assert_eq!(state(Framework::Deepspeed, true, Bf16), 1);
        assert_eq!(state(Framework::Deepspeed, false, Fp8), 1);
        // FSDP: the parameters' dtype, or bitsandbytes' int8 either way.
        assert_eq!(state(Framework::Fsdp, true, Bf16), 1);
        assert_eq!(state(Framework::Fsdp, false, Fp32), 1);
        assert_eq!(state(Framework::Fsdp, true, Fp8), 1);
        assert_eq!(state(Framework::Fsdp, true, Int8), 0);
        assert_eq!(state(Framework::Fsdp, false, Int8), 0);
    }

    #[test]
    fn megatrons_precision_aware_optimizer_needs_the_distributed_optimizer_and_adam() {
        let v = state_dtype(&with(|c| {
            c.training.optimizer_state_dtype = Some(OptimizerStateDtype::Bf16);
            c.training.optimizer = Optimizer::Muon;
            c.parallel.zero = 0;
        }));
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].rule.contains("distributed optimizer"), "{}", v[0]);
        assert!(v[1].rule.contains("only with adam"), "{}", v[1]);
    }
}
