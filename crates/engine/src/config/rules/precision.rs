//! Precision and hardware: a precision needs tensor cores that run it; a learned position
//! embedding covers the sequence.

use super::super::{Config, Dtype, GpuProfile, PositionEmbedding, Precision, Registry, Violation};

/// A precision runs only on tensor cores that run it (the profile's `precisions`: FP8 from
/// Hopper and CDNA 3, MXFP8 on Blackwell and CDNA 4, NVFP4 on Blackwell); an FP8 recipe
/// applies to FP8 only.
pub fn hardware(cfg: &Config, gpu: &GpuProfile) -> Vec<Violation> {
    let t = &cfg.training;
    let mut errs = Vec::new();
    if !gpu.runs(t.precision) {
        let runs: Vec<&str> = gpu.precisions_run().iter().map(|p| p.as_str()).collect();
        let block_scaled = matches!(t.precision, Precision::Mxfp8 | Precision::Nvfp4);
        let fallback = if block_scaled {
            "fp8 (with training.fp8_recipe) or bf16"
        } else {
            "bf16"
        };
        errs.push(
            Violation::new(
                "training.precision",
                format!(
                    "{p} needs {cores}, which {gpu} lacks (its profile runs {runs})",
                    p = t.precision,
                    cores = if block_scaled {
                        format!("block-scaled {} tensor cores", t.precision)
                    } else {
                        format!("{} tensor cores", t.precision.as_str().to_uppercase())
                    },
                    gpu = gpu.name,
                    runs = runs.join(", ")
                ),
            )
            .hint(format!(
                "use {fallback}, or a profile that runs {}: {}",
                t.precision,
                Registry::shipped().running(t.precision).join(", ")
            )),
        );
    }
    if t.fp8_recipe.is_some() && t.precision != Precision::Fp8 {
        errs.push(
            Violation::new(
                "training.fp8_recipe",
                format!(
                    "applies to precision fp8 only, got precision {}",
                    t.precision
                ),
            )
            .hint("leave it out, or set training.precision = \"fp8\" (mxfp8 and nvfp4 are recipes of their own)"),
        );
    }
    errs.extend(recipe_settings(cfg));
    let m = &gpu.runtime_memory;
    if t.eager_module_loading && m.is_stated() && m.cuda_context_eager_bytes.is_none() {
        errs.push(
            Violation::new(
                "training.eager_module_loading",
                format!(
                    "{} states no CUDA context under eager module loading \
                     (runtime_memory.cuda_context_eager_bytes)",
                    gpu.name
                ),
            )
            .hint("leave it out (lazy loading), or add the measured figure to the profile"),
        );
    }
    errs
}

/// The recipe's own settings: a low-precision parameter gather needs a low-precision weight
/// format (fp8, mxfp8, or nvfp4: Megatron's `--fp4-param-gather`); bf16 layers need a low-precision recipe other than delayed scaling (Megatron runs
/// delayed scaling in one outer FP8 context, so no layer can leave it) and must leave
/// layers in it.
fn recipe_settings(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let mut errs = Vec::new();
    if t.fp8_param_gather
        && !matches!(
            t.precision,
            Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
        )
    {
        errs.push(
            Violation::new(
                "training.fp8_param_gather",
                format!(
                    "gathers weights in a low-precision format, so needs precision fp8, mxfp8 \
                     or nvfp4, got {}",
                    t.precision
                ),
            )
            .hint("leave it out, or set training.precision = \"fp8\", \"mxfp8\" or \"nvfp4\""),
        );
    }
    let set = t.bf16_layers_at_start.is_some() || t.bf16_layers_at_end.is_some();
    let low = matches!(
        t.precision,
        Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
    );
    if set && !low {
        errs.push(Violation::new(
            "training.bf16_layers_at_start",
            format!(
                "keeps layers in bf16 under a low-precision recipe (fp8, mxfp8, nvfp4), got precision {}",
                t.precision
            ),
        ));
    } else if set
        && t.precision == Precision::Fp8
        && t.fp8_recipe.unwrap_or_default() == super::super::Fp8Recipe::Delayed
    {
        errs.push(
            Violation::new(
                "training.bf16_layers_at_start",
                "bf16 layers are not available with delayed scaling (Megatron runs it in one FP8 context over all layers)",
            )
            .hint("set training.fp8_recipe = \"current\" or \"blockwise\""),
        );
    }
    let (start, end) = t.bf16_layers();
    if low && start.saturating_add(end) > cfg.model.num_layers {
        errs.push(Violation::new(
            "training.bf16_layers_at_start",
            format!(
                "bf16 layers at the start ({start}) and end ({end}) exceed model.num_layers ({})",
                cfg.model.num_layers
            ),
        ));
    }
    errs
}

/// Gradient buffers are fp32 or bf16 (Megatron's --grad-reduce-in-bf16), or fp16 under fp16
/// training, where DeepSpeed's fp16 optimizers keep and reduce them in the parameters' dtype
/// (`FP16_Optimizer`, ZeRO's `ipg_buffer`); there is no fp8 gradient path.
pub fn gradients(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let fp16_grads = t.grad_dtype == Dtype::Fp16 && t.precision == Precision::Fp16;
    if matches!(t.grad_dtype, Dtype::Fp32 | Dtype::Bf16) || fp16_grads {
        return Vec::new();
    }
    vec![Violation::new(
        "training.grad_dtype",
        format!(
            "must be fp32 or bf16 (or fp16 under precision fp16), got {}",
            t.grad_dtype.as_str()
        ),
    )
    .hint("fp32 (the default) or bf16 (Megatron's --grad-reduce-in-bf16)")]
}

/// A learned position embedding has no position beyond max_position_embeddings (rotary
/// positions extrapolate, with a warning).
pub fn positions(cfg: &Config) -> Vec<Violation> {
    let (m, t) = (&cfg.model, &cfg.training);
    let mut errs = Vec::new();
    if m.position_embedding == PositionEmbedding::Learned
        && t.seq_length > m.max_position_embeddings
    {
        errs.push(Violation::new(
            "training.seq_length",
            format!(
                "{} exceeds model.max_position_embeddings ({}) of the learned position embedding",
                t.seq_length, m.max_position_embeddings
            ),
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn fp8_needs_fp8_tensor_cores() {
        let a100 = GpuProfile::load("a100-80g").unwrap();
        let h100 = GpuProfile::load("h100-sxm").unwrap();
        let fp8 = with(|c| c.training.precision = Precision::Fp8);
        assert_eq!(fields(&hardware(&fp8, &a100)), ["training.precision"]);
        assert!(hardware(&fp8, &h100).is_empty());
    }

    /// NVFP4 on an H100 is refused by field (no FP4 tensor cores), as is MXFP8; both pass on
    /// GB200. An FP8 recipe without FP8 is refused by its own field.
    #[test]
    fn block_scaled_recipes_need_blackwell_and_recipes_need_fp8() {
        let h100 = GpuProfile::load("h100-sxm").unwrap();
        let gb200 = GpuProfile::load("gb200").unwrap();
        for p in [Precision::Nvfp4, Precision::Mxfp8] {
            let c = with(|c| c.training.precision = p);
            let v = hardware(&c, &h100);
            assert_eq!(fields(&v), ["training.precision"], "{p}");
            assert!(v[0].rule.contains("h100-sxm lacks"), "{}", v[0]);
            assert!(hardware(&c, &gb200).is_empty(), "{p}");
        }
        let recipe =
            with(|c| c.training.fp8_recipe = Some(super::super::super::Fp8Recipe::Blockwise));
        assert_eq!(fields(&hardware(&recipe, &h100)), ["training.fp8_recipe"]);
        let fp8 = with(|c| {
            c.training.precision = Precision::Fp8;
            c.training.fp8_recipe = Some(super::super::super::Fp8Recipe::Blockwise);
        });
        assert!(hardware(&fp8, &h100).is_empty());
    }

    #[test]
    fn learned_positions_cover_the_sequence() {
        let v = positions(&with(|c| {
            c.model.position_embedding = PositionEmbedding::Learned;
            c.model.max_position_embeddings = 2048;
        }));
        assert_eq!(fields(&v), ["training.seq_length"]);
        // Rotary positions extrapolate: a warning, not an error.
        assert!(positions(&with(|c| c.model.max_position_embeddings = 2048)).is_empty());
    }

    /// Issue 18: fp8 and fp16 gradient buffers were accepted although no path models them.
    #[test]
    fn gradients_are_fp32_or_bf16() {
        for d in [Dtype::Fp8, Dtype::Fp16] {
            let v = gradients(&with(|c| c.training.grad_dtype = d));
            assert_eq!(fields(&v), ["training.grad_dtype"]);
        }
        assert!(gradients(&with(|c| c.training.grad_dtype = Dtype::Bf16)).is_empty());
        // fp16 training keeps fp16 gradients where the framework does (DeepSpeed's fp16
        // optimizers, Megatron without --accumulate-allreduce-grads-in-fp32).
        assert!(gradients(&with(|c| {
            c.training.precision = Precision::Fp16;
            c.training.grad_dtype = Dtype::Fp16;
        }))
        .is_empty());
    }
}
