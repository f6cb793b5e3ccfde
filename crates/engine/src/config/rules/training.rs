//! The step's own settings Megatron-Core checks together: what selective recomputation
//! reruns, activation offloading, and the optimizer's combinations
//! (megatron/core/transformer/transformer_config.py; megatron/core/optimizer/muon.py).

use super::super::{
    Config, GpuProfile, Optimizer, Precision, Recompute, RecomputeModule, Violation,
};

/// `training.recompute_modules` only with selective recomputation, and each module on a
/// model that has it (Megatron refuses `mla_up_proj` without MLA; an MoE module on a dense
/// model would be silently without effect, so it is refused here too); torchtitan's `per_op`
/// on the block it describes ([`super::per_op`]).
pub fn recompute_modules(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let m = &cfg.model;
    let Some(modules) = &t.recompute_modules else {
        return Vec::new();
    };
    let field = "training.recompute_modules";
    let mut errs = super::per_op::per_op(cfg);
    if t.recompute != Recompute::Selective {
        errs.push(
            Violation::new(
                field,
                format!(
                    "lists what selective recomputation reruns, but training.recompute is {}",
                    t.recompute
                ),
            )
            .hint("set training.recompute = \"selective\", or leave recompute_modules out"),
        );
    }
    for &module in modules {
        let missing = match module {
            RecomputeModule::MlaUpProj if m.mla.is_none() => Some("multi-latent attention"),
            RecomputeModule::Moe | RecomputeModule::MoeAct if !m.is_moe() => Some("MoE layers"),
            RecomputeModule::SharedExperts if m.moe_shared_expert_intermediate_size == 0 => {
                Some("shared experts")
            }
            _ => None,
        };
        if let Some(what) = missing {
            errs.push(Violation::new(
                field,
                format!("{module} recomputes {what}, which this model does not have"),
            ));
        }
    }
    errs
}

/// Activation offloading (Megatron's `--cpu-offloading`): fewer layers than the model has,
/// and, as Megatron-Core requires, no pipeline parallelism and no recomputation; a GPU
/// profile with a host link to time the copies.
pub fn offloading(cfg: &Config, gpu: &GpuProfile) -> Vec<Violation> {
    let t = &cfg.training;
    let n = t.offload_activation_layers;
    if n == 0 {
        return Vec::new();
    }
    let field = "training.offload_activation_layers";
    let mut errs = Vec::new();
    let layers = cfg.model.num_layers;
    if n >= layers {
        errs.push(Violation::new(
            field,
            format!("offloads layers below model.num_layers ({layers}) only, got {n}"),
        ));
    }
    if cfg.parallel.pp > 1 {
        errs.push(Violation::new(
            field,
            format!(
                "needs parallel.pp = 1 (Megatron-Core has no CPU offloading with pipeline parallelism), got pp {}",
                cfg.parallel.pp
            ),
        ));
    }
    if gpu.links.host.is_none() {
        errs.push(Violation::new(
            field,
            format!(
                "the {} profile has no host link (links.host) to time the copies over",
                gpu.name
            ),
        ));
    }
    if t.recompute != Recompute::None {
        errs.push(
            Violation::new(
                field,
                format!(
                    "needs training.recompute = \"none\" (Megatron-Core offloads no recomputed layer), got {}",
                    t.recompute
                ),
            )
            .hint("set training.recompute = \"none\""),
        );
    }
    errs
}

/// CPU optimizer offload (`training.optimizer_offload_fraction`): a share in [0, 1], a GPU
/// profile with a host link to time the gradient and parameter copies over, and an optimizer
/// the CPU runs (Adam: Megatron-Core's HybridDeviceOptimizer and DeepSpeed's CPU Adam; Muon
/// has no CPU step there).
pub fn optimizer_offload(cfg: &Config, gpu: &GpuProfile) -> Vec<Violation> {
    let t = &cfg.training;
    let f = t.optimizer_offload_fraction;
    let field = "training.optimizer_offload_fraction";
    if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
        return vec![Violation::new(
            field,
            format!("must be a share between 0 and 1, got {f}"),
        )];
    }
    if f == 0.0 {
        return Vec::new();
    }
    let mut errs = Vec::new();
    if gpu.links.host.is_none() {
        errs.push(Violation::new(
            field,
            format!(
                "the {} profile has no host link (links.host) to time the copies over",
                gpu.name
            ),
        ));
    }
    if cfg.parallel.fsdp == Some(super::super::Fsdp::Torch) {
        errs.push(Violation::new(
            field,
            "torch FSDP2 offloads through its CPUOffloadPolicy (parameters and gradients too), which is not modelled",
        ));
    }
    if t.optimizer != Optimizer::Adam {
        errs.push(Violation::new(
            field,
            format!(
                "offloads Adam only (Megatron-Core's HybridDeviceOptimizer, DeepSpeed's CPU Adam), got optimizer {}",
                t.optimizer
            ),
        ));
    }
    errs
}

/// Muon as Megatron-Core runs it (megatron/core/optimizer/emerging_optimizers.py): ZeRO-1
/// is its layer-wise distributed optimizer (`dist_muon`, model/layer_wise.rs), which shards
/// the optimizer state by whole parameters and keeps whole gradients and weights, so not
/// ZeRO-2 or 3; not with fp16 loss scaling; LoRA trains only adapters, which parsim does not
/// run under Muon.
pub fn optimizer(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    if t.optimizer != Optimizer::Muon {
        return Vec::new();
    }
    let field = "training.optimizer";
    let mut errs = Vec::new();
    if cfg.parallel.zero >= 2 {
        errs.push(
            Violation::new(
                field,
                format!(
                    "muon shards only its optimizer state (Megatron-Core's layer-wise distributed optimizer keeps whole gradients and weights), got parallel.zero {}",
                    cfg.parallel.zero
                ),
            )
            .hint("set parallel.zero = 1 (dist_muon) or 0"),
        );
    }
    if t.precision == Precision::Fp16 {
        errs.push(Violation::new(
            field,
            "muon does not run with fp16 (Megatron-Core: \"muon with fp16 is not supported\")",
        ));
    }
    if t.mode == super::super::TrainingMode::Lora {
        errs.push(Violation::new(
            field,
            "muon with LoRA is not modelled (adapters are trained with adam)",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::with;
    use super::*;

    #[test]
    fn modules_need_selective_recompute_and_the_model_parts() {
        let v = recompute_modules(&with(|c| {
            c.training.recompute = Recompute::Full;
            c.training.recompute_modules = Some(vec![RecomputeModule::Moe]);
        }));
        // Full recompute, and an MoE module on the dense default model.
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|e| e.field == "training.recompute_modules"));
        assert!(v[0].rule.contains("selective"), "{}", v[0]);
        assert!(v[1].rule.contains("moe"), "{}", v[1]);
        let v = recompute_modules(&with(|c| {
            c.training.recompute_modules = Some(vec![RecomputeModule::MlaUpProj]);
        }));
        assert_eq!(v.len(), 1);
        assert!(v[0].rule.contains("multi-latent"), "{}", v[0]);
        assert!(recompute_modules(&with(|c| {
            c.training.recompute_modules = Some(vec![RecomputeModule::Layernorm]);
        }))
        .is_empty());
    }

    #[test]
    fn offloading_every_layer_pipelines_or_recompute_are_refused() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let v = offloading(
            &with(|c| {
                c.training.offload_activation_layers = c.model.num_layers;
                c.training.recompute = Recompute::None;
            }),
            &gpu,
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "training.offload_activation_layers");
        assert!(v[0].rule.contains("below model.num_layers"), "{}", v[0]);
        let v = offloading(
            &with(|c| {
                c.training.offload_activation_layers = 1;
                c.parallel.pp = 2;
            }),
            &gpu,
        );
        // pp 2 and the default selective recompute.
        assert_eq!(v.len(), 2, "{v:?}");
        // The CPU backend's profile has no host link.
        let cpu = GpuProfile::load("cpu").unwrap();
        let v = offloading(
            &with(|c| {
                c.training.offload_activation_layers = 1;
                c.training.recompute = Recompute::None;
            }),
            &cpu,
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].rule.contains("links.host"), "{}", v[0]);
    }

    #[test]
    fn muon_shards_its_state_only() {
        let v = optimizer(&with(|c| {
            c.training.optimizer = Optimizer::Muon;
            c.parallel.zero = 2;
        }));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "training.optimizer");
        assert!(v[0].rule.contains("parallel.zero 2"), "{}", v[0]);
        for zero in [0, 1] {
            assert!(optimizer(&with(|c| {
                c.training.optimizer = Optimizer::Muon;
                c.parallel.zero = zero;
            }))
            .is_empty());
        }
    }
}
