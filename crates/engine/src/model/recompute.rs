//! What selective recomputation drops and reruns (`training.recompute_modules`, Megatron-Core's
//! `--recompute-modules`, megatron/core/transformer/transformer_layer.py and moe/): a pass
//! over a built layer that marks the saved tensors a module's checkpoint discards
//! ([`super::Saved::selective`]) and the ops it reruns in the backward
//! ([`super::Op::recomputed_by_selective`]). Memory, FLOPs, time and communication then follow
//! from the ledger as for the attention core, the default (`["core_attn"]`, built into the
//! attention op itself, so the default layer is left as built).

use super::op::{Op, TensorRole};
use crate::config::RecomputeModule;

/// Ops of the dense MLP that Megatron's `mlp` checkpoint reruns (the pre-MLP norm is fused
/// into fc1 by Transformer Engine, so it reruns with it; its saved input, the residual, is
/// the checkpoint's input and stays).
const MLP: [&str; 7] = [
    "mlp.norm",
    "mlp.fc1",
    "mlp.fc1_lora",
    "mlp.act",
    "mlp.fc2",
    "mlp.fc2_bias",
    "mlp.fc2_lora",
];

/// Marks what `modules` drop and rerun in one layer's ops (forward order). The backward of
/// a checkpointed part holds what it rebuilds: each output-discarding checkpoint's tensor at
/// the op that reads it, a whole submodule's rebuilt set at its last op (the first whose
/// backward runs), added to that op's backward scratch.
pub fn apply_modules(ops: &mut [Op], modules: &[RecomputeModule]) {
    if modules == [RecomputeModule::CoreAttn] {
        return;
    }
    let has = |m: RecomputeModule| modules.contains(&m);
    let is_moe = ops.iter().any(|o| o.name == "moe.router");
    let is_mla = ops.iter().any(|o| o.name == "attn.kv_down");
    if !has(RecomputeModule::CoreAttn) {
        for o in ops.iter_mut().filter(|o| o.name == "attn.core") {
            o.recomputed_by_selective = false;
            for s in &mut o.saved {
                s.selective = false;
            }
        }
    }
    if has(RecomputeModule::MoeAct) {
        // The experts' activation output, fc2's saved input, is rebuilt from fc1's output;
        // so is the clamped copy a clamped GLU keeps (the checkpoint runs it without grad).
        rerun(ops, &["moe.experts.act_clamp", "moe.experts.act"]);
        discard_output(ops, &["moe.experts.act_clamp"], &[TensorRole::Input]);
        discard_output(
            ops,
            &["moe.experts.fc2", "moe.experts.fc2_lora"],
            &[TensorRole::Input],
        );
    }
    if has(RecomputeModule::Layernorm) {
        // Transformer Engine fuses the input norm into the QKV projection and a dense layer's
        // pre-MLP norm into fc1 (no separate module to checkpoint); MLA's input norm and an MoE
        // layer's pre-MLP norm are separate (the router reads the normed input).
        if is_mla {
            rerun(ops, &["attn.norm"]);
            discard_output(
                ops,
                &["attn.q_down", "attn.q", "attn.kv_down"],
                &[TensorRole::Input],
            );
        }
        if is_moe {
            rerun(ops, &["mlp.norm"]);
            discard_output(ops, &["moe.router"], &[TensorRole::Input]);
        }
    }
    if has(RecomputeModule::MlaUpProj) && is_mla {
        // The up-projections and RoPE rerun; the attention core's Q, K, V are rebuilt.
        rerun(ops, &["attn.q_up", "attn.kv_up", "attn.rotary"]);
        discard_output(
            ops,
            &["attn.core"],
            &[TensorRole::Query, TensorRole::Key, TensorRole::Value],
        );
    }
    if has(RecomputeModule::Mlp) && !is_moe {
        checkpoint(ops, |o| MLP.contains(&o.name), |o| o.name == "mlp.norm");
    }
    if has(RecomputeModule::Moe) && is_moe {
        // The whole MoE block from the normed input, which the router's saved input holds.
        checkpoint(
            ops,
            |o| o.name.starts_with("moe."),
            |o| o.name == "moe.router",
        );
    } else if has(RecomputeModule::SharedExperts) {
        checkpoint(ops, |o| o.name.starts_with("moe.shared."), |_| false);
    }
}

/// Marks the ops named `names` as rerun.
fn rerun(ops: &mut [Op], names: &[&str]) {
    for o in ops.iter_mut().filter(|o| names.contains(&o.name)) {
        o.recomputed_by_selective = true;
    }
}

/// An output-discarding checkpoint: the tensors of `roles` the ops `names` saved are dropped
/// and rebuilt before each op's backward, which holds them.
fn discard_output(ops: &mut [Op], names: &[&str], roles: &[TensorRole]) {
    for o in ops.iter_mut().filter(|o| names.contains(&o.name)) {
        let mut rebuilt = 0;
        for s in o.saved.iter_mut().filter(|s| roles.contains(&s.role)) {
            if !s.selective {
                s.selective = true;
                rebuilt += s.bytes;
            }
        }
        o.backward_scratch_bytes += rebuilt;
    }
}

/// A submodule checkpoint: the ops `inside` rerun and drop what they saved, but for the
/// checkpoint's input (the tensors of the op `keeps_input` marks, role `Input`); their
/// rebuilt set is held from the backward of the last of them.
fn checkpoint(ops: &mut [Op], inside: impl Fn(&Op) -> bool, keeps_input: impl Fn(&Op) -> bool) {
    let mut rebuilt = 0;
    let mut last = None;
    for (i, o) in ops.iter_mut().enumerate().filter(|(_, o)| inside(o)) {
        o.recomputed_by_selective = true;
        let keep = keeps_input(o);
        for s in o.saved.iter_mut() {
            let checkpoint_input = keep && s.role == TensorRole::Input;
            if !s.selective && !checkpoint_input {
                s.selective = true;
                rebuilt += s.bytes;
            }
        }
        last = Some(i);
    }
    if let Some(i) = last {
        ops[i].backward_scratch_bytes += rebuilt;
    }
}
