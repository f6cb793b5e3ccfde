//! Precision and hardware: FP8 needs FP8 tensor cores; a learned position embedding covers
//! the sequence.

use super::super::{Config, Dtype, GpuProfile, PositionEmbedding, Precision, Violation};

/// FP8 training needs a GPU with FP8 tensor cores.
pub fn hardware(cfg: &Config, gpu: &GpuProfile) -> Vec<Violation> {
    let t = &cfg.training;
    let mut errs = Vec::new();
    if t.precision == Precision::Fp8 && gpu.peak_flops.fp8.is_none() {
        errs.push(
            Violation::new(
                "training.precision",
                format!("fp8 needs FP8 tensor cores, which {} lacks", gpu.name),
            )
            .hint("use bf16, or an H100/H200/B200/MI300X profile"),
        );
    }
    errs
}

/// Gradient buffers are fp32 or bf16 (Megatron's --grad-reduce-in-bf16); the optimizer and
/// the communication model have no fp16 or fp8 gradient path.
pub fn gradients(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    if matches!(t.grad_dtype, Dtype::Fp32 | Dtype::Bf16) {
        return Vec::new();
    }
    vec![Violation::new(
        "training.grad_dtype",
        format!("must be fp32 or bf16, got {}", t.grad_dtype.as_str()),
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
    }
}
