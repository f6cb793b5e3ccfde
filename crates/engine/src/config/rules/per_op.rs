//! torchtitan's per-op selective checkpointing (`training.recompute_modules = ["per_op"]`,
//! src/model/per_op.rs) on the layer its save list describes: llama3's transformer block as
//! torchtitan builds it (torchtitan/models/llama3/model/model.py; parallelize.py's
//! `apply_tp`), whose matmuls are wq, wk, wv, wo, w1, w3, w2 in that order.

use super::super::{
    Activation, Config, Framework, Precision, RecomputeModule, TrainingMode, Violation,
};

/// Each way the configuration leaves llama3's block, naming the field.
pub fn per_op(cfg: &Config) -> Vec<Violation> {
    let (m, t, p) = (&cfg.model, &cfg.training, &cfg.parallel);
    let Some(modules) = t
        .recompute_modules
        .as_ref()
        .filter(|ms| ms.contains(&RecomputeModule::PerOp))
    else {
        return Vec::new();
    };
    let block = "torchtitan's per-op checkpointing (recompute_modules [\"per_op\"]) is modelled on llama3's block";
    let needs: [(bool, &str, String); 15] = [
        (
            modules.len() > 1,
            "training.recompute_modules",
            "per_op is a whole-layer policy: list it alone".into(),
        ),
        (
            t.framework != Framework::Fsdp,
            "training.framework",
            format!(
                "torchtitan runs it on FSDP2 (\"fsdp\"), got {}",
                t.framework.name()
            ),
        ),
        (
            m.is_moe(),
            "model.num_experts",
            format!("{block}: dense layers only"),
        ),
        (
            m.mla.is_some(),
            "model.mla",
            format!("{block}: no multi-latent attention"),
        ),
        (
            m.hybrid_layer_pattern.is_some(),
            "model.hybrid_layer_pattern",
            format!("{block}: no hybrid layers"),
        ),
        (
            m.activation != Activation::Swiglu,
            "model.activation",
            format!("{block}: SwiGLU (w1, w3, w2), got {}", m.activation),
        ),
        (
            m.add_bias_linear || m.add_qkv_bias || m.qk_layernorm,
            "model.add_bias_linear",
            format!("{block}: no linear biases (addmm is not on the save list) and no QK norm"),
        ),
        (
            m.window_size.is_some() || m.attention_chunk_size.is_some() || m.attention_sinks,
            "model.window_size",
            format!("{block}: full causal attention (no window, chunks or sinks)"),
        ),
        (
            m.mtp_num_layers > 0,
            "model.mtp_num_layers",
            format!("{block}: no multi-token prediction layers"),
        ),
        (
            t.mode == TrainingMode::Lora,
            "training.mode",
            format!("{block}: full training (LoRA's adapters are not on the save list)"),
        ),
        (
            m.hidden_dropout > 0.0 || m.attention_dropout > 0.0,
            "model.hidden_dropout",
            format!("{block}: no dropout"),
        ),
        (
            !t.flash_attention,
            "training.flash_attention",
            format!("{block}: a fused SDPA kernel"),
        ),
        (
            p.cp > 1,
            "parallel.cp",
            format!("{block}: context parallelism's exchanges are not modelled under it"),
        ),
        (
            matches!(
                t.precision,
                Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
            ),
            "training.precision",
            format!(
                "{block}: low-precision GEMMs (_scaled_mm) are not on the save list, got {}",
                t.precision
            ),
        ),
        (
            p.tp > 1 && !p.sp,
            "parallel.sp",
            format!("{block}: torchtitan's TP is sequence-parallel (apply_tp)"),
        ),
    ];
    needs
        .into_iter()
        .filter(|(broken, _, _)| *broken)
        .map(|(_, field, rule)| Violation::new(field, rule))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    fn per_op_on(f: impl FnOnce(&mut Config)) -> Vec<Violation> {
        per_op(&with(|c| {
            c.training.framework = Framework::Fsdp;
            c.training.recompute = crate::config::Recompute::Selective;
            c.training.recompute_modules = Some(vec![RecomputeModule::PerOp]);
            c.model.activation = Activation::Swiglu;
            f(c);
        }))
    }

    #[test]
    fn per_op_is_llama3s_block_on_fsdp() {
        assert!(per_op_on(|_| {}).is_empty(), "{:?}", per_op_on(|_| {}));
        let v = per_op_on(|c| {
            c.training.framework = Framework::MegatronCore;
            c.model.add_bias_linear = true;
            c.parallel.cp = 2;
            c.training.precision = Precision::Fp8;
            c.model.mtp_num_layers = 1;
        });
        assert_eq!(
            fields(&v),
            [
                "training.framework",
                "model.add_bias_linear",
                "model.mtp_num_layers",
                "parallel.cp",
                "training.precision"
            ]
        );
    }
}
