//! The mixture-of-experts block (Shazeer et al. 2017; Megatron-Core's MoE): a top-k router,
//! routed experts split over the EP group and dispatched/combined by all-to-all, optional
//! shared experts, the load imbalance of the hottest rank, and the projections of a latent MoE
//! ([`super::moe_latent`]).

use super::dims::Dims;
use super::mlp::{activation_op, fc1_width, mlp_body, mlp_norm};
use super::moe_latent::{project_down, project_up};
use super::moe_lora::expert_adapter;
use super::norm::dropout;
use super::op::{
    Collective, CollectiveKind, Flops, Op, OpKind, ParamClass, Params, Phase, TensorRole,
};
use crate::config::{Activation, Framework, LoraTarget, ModelConfig, Precision, TrainingConfig};
use crate::layout::GroupKind;

/// Tokens of the hottest EP rank over a uniform share. A rank hosts E/ep experts; with the
/// hottest expert at `imbalance` times its share and the others at theirs, the rank's load is
/// 1 + (imbalance - 1) / (E / ep).
pub fn rank_load_factor(imbalance: f64, experts: u64, ep: u64) -> f64 {
    let local = (experts / ep).max(1) as f64;
    1.0 + (imbalance - 1.0) / local
}

/// The imbalance whose hottest EP rank receives `rank_load` times a uniform share: the
/// inverse of [`rank_load_factor`], 1 + (rank_load - 1) x E / ep. This is how a measured
/// hottest rank (`parsim execute`'s `moe_load`) becomes a `moe_load_imbalance`.
pub fn imbalance_of_rank_load(rank_load: f64, experts: u64, ep: u64) -> f64 {
    let local = (experts / ep.max(1)).max(1) as f64;
    1.0 + (rank_load - 1.0) * local
}

/// Tokens the hottest EP rank can receive under an expert capacity (Megatron's
/// `--moe-expert-capacity-factor`): each of its E/ep experts takes at most
/// ceil(factor x local x k / E) tokens from each of the ep source ranks; `None` without one.
pub fn capacity_limit(factor: f64, local: u64, k: u64, experts: u64, ep: u64) -> Option<u64> {
    if factor.is_nan() || factor <= 0.0 || experts == 0 {
        return None;
    }
    // A source sends an expert at most its own local x k assignments: a larger capacity (a
    // huge factor) limits nothing, so it is that many. The product is formed in u128; one
    // past u64 is no limit on any row count either.
    let assignments = u128::from(local) * u128::from(k);
    let per_source = (factor * assignments as f64 / experts as f64).ceil();
    let per_source = if per_source < assignments as f64 {
        per_source as u128
    } else {
        assignments
    };
    let ep = u128::from(ep.max(1));
    let limit = (u128::from(experts) / ep) * ep * per_source;
    Some(u64::try_from(limit).unwrap_or(u64::MAX))
}

/// The rows of the hottest EP rank's MoE layer: what it receives and what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutedRows {
    /// Rows its experts receive (the kept assignments sent to it).
    pub hot: u64,
    /// Assignments of its own tokens the capacity keeps: the rows it dispatches, holds and
    /// combines.
    pub kept: u64,
}

/// The hottest EP rank's rows for `local` routed tokens. A source keeps its n x k assignments
/// less the dropped share: `moe_dropped_fraction` when given (a learned router crowding a few
/// experts drops far more than a balanced one), else a balanced router's, what the capacity
/// lets through (Lepikhin et al. 2020, sec. 2.2); never more than the capacity takes. The
/// hottest rank receives the kept share times [`rank_load_factor`] (the imbalance is that of
/// the kept assignments), at most the capacity of its experts.
pub fn routed_rows(m: &ModelConfig, local: u64, ep: u64) -> RoutedRows {
    let e = m.num_experts as u64;
    let k = m.moe_router_topk as u64;
    let routed = local * k;
    let cap = capacity_limit(m.moe_capacity_factor, local, k, e, ep);
    let limit = |rows: u64| cap.map_or(rows, |c| rows.min(c));
    let kept = match m.moe_dropped_fraction {
        Some(f) => limit((routed as f64 * (1.0 - f)).ceil() as u64),
        None => limit(routed),
    };
    let hot = limit((kept as f64 * rank_load_factor(m.moe_load_imbalance, e, ep)).ceil() as u64);
    RoutedRows { hot, kept }
}

/// Appends the MoE block (norm, router, dispatch, experts, combine, shared experts, dropout).
pub fn moe_block(ops: &mut Vec<Op>, m: &ModelConfig, tr: &TrainingConfig, d: &Dims) {
    mlp_norm(ops, m, d);
    let e = m.num_experts as u64;
    let k = m.moe_router_topk as u64;
    let trainable = !d.lora;
    // Megatron-Core routes the sequence-parallel shard of tokens on every rank.
    let local = d.n_sp;
    let routed = local * k;
    let RoutedRows { hot, kept } = routed_rows(m, local, d.ep);
    // The width of the routed tokens: the latent one in a latent MoE, else the hidden size.
    let width = m.moe_latent_size.unwrap_or(d.h);

    // Shared experts (DeepSeekMoE) on every token; their input is the router's saved input.
    // Their ops come before the router's: the executor runs their backward once the routed
    // experts' and the router's are done (their gradient bucket opens there), so in the
    // backward walk the routed experts' saved tensors are freed by then.
    if m.moe_shared_expert_intermediate_size > 0 {
        let names = [
            "moe.shared.fc1",
            "moe.shared.act",
            "moe.shared.fc2",
            "moe.shared.fc2_bias",
            "moe.shared.fc1_lora",
            "moe.shared.fc2_lora",
        ];
        mlp_body(
            ops,
            names,
            m.moe_shared_expert_intermediate_size,
            m,
            tr,
            d,
            false,
        );
    }

    let mut router = Op::new(
        "moe.router",
        OpKind::Matmul {
            m: local,
            n: e,
            k: d.h,
        },
    );
    router.params = Some(Params {
        total: d.h * e,
        rank: d.h * e,
        class: ParamClass::TpReplicated,
        trainable,
    });
    router.model_flops = Flops::matmul(2.0 * (d.tokens * d.h * e) as f64, trainable);
    router.rank_flops = Flops::matmul(2.0 * (local * d.h * e) as f64, trainable);
    // Input (the normed hidden state, also the dispatch input), fp32 logits for the softmax,
    // and the chosen probabilities (fp32) and expert indices (int64).
    ops.push(
        router
            .save(TensorRole::Input, local * d.h * d.act)
            .save(TensorRole::Logits, local * e * 4)
            .save(TensorRole::Routing, routed * (4 + 8)),
    );
    ops.push(Op::new(
        "moe.router.topk",
        OpKind::MemoryBound {
            bytes: routing_bytes(local, e, k, m.moe_aux_loss_coeff > 0.0),
        },
    ));
    if m.moe_router_linear_bias {
        let mut bias = Op::new("moe.router_linear_bias", OpKind::MemoryBound { bytes: 0 });
        bias.params = Some(Params {
            total: e,
            rank: e,
            class: ParamClass::TpReplicated,
            trainable,
        });
        ops.push(bias);
    }
    if m.moe_router_bias {
        let mut bias = Op::new("moe.router_bias", OpKind::MemoryBound { bytes: 0 });
        bias.params = Some(Params {
            total: e,
            rank: e,
            class: ParamClass::TpReplicated,
            trainable: false,
        });
        ops.push(bias);
    }

    let a2a = |phase, bytes| Collective {
        kind: CollectiveKind::AllToAll,
        group: GroupKind::Ep,
        group_size: d.ep as u32,
        phase,
        payload_bytes: bytes,
        count: 1,
    };
    project_down(ops, m, local, d);
    let tokens_bytes = kept * width * d.act;
    let (gather, scatter) = expert_tp_collectives(d, hot, width);
    // Dispatch: permute the kept top-k copies of each token, all-to-all them to their experts,
    // all-gather the received rows over expert TP (its backward reduce-scatters their
    // gradients before the all-to-all back).
    ops.push(
        Op::new(
            "moe.dispatch",
            OpKind::MemoryBound {
                bytes: 2 * tokens_bytes,
            },
        )
        .comm(a2a(Phase::Forward, tokens_bytes))
        .comm(a2a(Phase::Backward, tokens_bytes))
        .comm(gather(Phase::Forward))
        .comm(scatter(Phase::Backward))
        .temp(2 * tokens_bytes),
    );

    routed_experts(ops, m, tr, d, (hot, width));

    // Combine: reduce-scatter the experts' outputs over expert TP, all-to-all back, unpermute,
    // weight by the router probabilities (the expert outputs are saved for the probabilities'
    // gradient, unless the experts' activation applied them); the backward all-gathers the
    // output gradients after the all-to-all.
    let expert_outputs = if probs_in_activation(tr) {
        0
    } else {
        tokens_bytes
    };
    ops.push(
        Op::new(
            "moe.combine",
            OpKind::MemoryBound {
                bytes: 2 * tokens_bytes,
            },
        )
        .comm(a2a(Phase::Forward, tokens_bytes))
        .comm(a2a(Phase::Backward, tokens_bytes))
        .comm(scatter(Phase::Forward))
        .comm(gather(Phase::Backward))
        .save(TensorRole::ExpertOutputs, expert_outputs)
        .temp(2 * tokens_bytes),
    );
    project_up(ops, m, local, d);

    ops.push(dropout("mlp.dropout", d.n_sp, d.h, d.hidden_dropout));
}

/// Whether the router's probabilities weight the experts' activation rather than the combine,
/// as Megatron-Core's grouped experts do (megatron/core/transformer/moe/experts.py,
/// `TEGroupedMLP.forward`: `weighted_bias_swiglu_impl` and its kin take the permuted probs,
/// and the token dispatcher's `unpermute` gets none), so the combine keeps no expert outputs
/// and the activation keeps the probabilities (fp32) beside its input. parsim's executor
/// weights the combine and runs no low-precision recipe, so a Megatron-Core run under a
/// recipe (Transformer Engine's) takes this path and a bf16 one keeps the executor's.
pub fn probs_in_activation(tr: &TrainingConfig) -> bool {
    tr.framework == Framework::MegatronCore
        && matches!(
            tr.precision,
            Precision::Fp8 | Precision::Mxfp8 | Precision::Nvfp4
        )
}

/// HBM bytes of the routing after the gating GEMM, forward, for `tokens` tokens over
/// `experts` experts choosing `k` (Megatron-Core's `TopKRouter.routing`,
/// megatron/core/transformer/moe/router.py, through moe_utils.py's
/// `topk_routing_with_score_function` and `compute_routing_scores_for_aux_loss`, unfused):
/// the score function (softmax or sigmoid) reads and writes the fp32 [tokens x experts]
/// scores (8 bytes an element); top-k reads them (4) and writes the k probabilities (fp32)
/// and indices (int64); the routing probabilities and the routing map are scattered into
/// dense [tokens x experts] fp32 and bool tensors (5). With an auxiliary loss, its scores
/// are the score function again (8) and the switch loss reads them once more to sum them
/// over the tokens (4).
pub fn routing_bytes(tokens: u64, experts: u64, k: u64, aux_loss: bool) -> u64 {
    let dense = tokens * experts;
    let aux = if aux_loss { 12 * dense } else { 0 };
    (8 + 4 + 5) * dense + tokens * k * (4 + 8) + aux
}

/// The expert-TP all-gather and reduce-scatter around the experts (Megatron-Core's
/// `MoEAlltoAllTokenDispatcher`, megatron/core/transformer/moe/token_dispatcher.py: "AG(TP)"
/// of the received rows after the EP all-to-all in `dispatch_postprocess`, "RS(TP)" of the
/// experts' outputs before it in `combine_preprocess`, over the expert-TP group). Each moves
/// the gathered rows, the `hot` rows of each of the etp members (`hot` x etp x `width`, the
/// routed tokens' width), as the engine's other all-gathers count their output and
/// reduce-scatters their input. With expert_tp 1 the group has one member and [`Op::comm`]
/// drops them.
fn expert_tp_collectives(
    d: &Dims,
    hot: u64,
    width: u64,
) -> (impl Fn(Phase) -> Collective, impl Fn(Phase) -> Collective) {
    let payload_bytes = hot * d.etp * width * d.act;
    let group_size = d.etp as u32;
    let coll = move |kind, phase| Collective {
        kind,
        group: GroupKind::ExpertTp,
        group_size,
        phase,
        payload_bytes,
        count: 1,
    };
    (
        move |phase| coll(CollectiveKind::AllGather, phase),
        move |phase| coll(CollectiveKind::ReduceScatter, phase),
    )
}

/// Appends the rank's routed experts (E/ep, each split over expert TP) on the `hot` rows it
/// receives, tokens of `h` features (the latent width in a latent MoE), with their LoRA
/// adapters under LoRA.
fn routed_experts(
    ops: &mut Vec<Op>,
    m: &ModelConfig,
    tr: &TrainingConfig,
    d: &Dims,
    (hot, h): (u64, u64),
) {
    let e = m.num_experts as u64;
    let k = m.moe_router_topk as u64;
    let f = m.moe_ffn_hidden_size;
    let trainable = !d.lora;
    // Routed experts on this rank: E/ep experts, each split over expert TP.
    let width = fc1_width(m.activation, f);
    let local_experts = e / d.ep;
    let expert = |name, rows: u64, i: u64, o: u64, split_out: bool| {
        let (ri, ro) = if split_out {
            (i, o.div_ceil(d.etp))
        } else {
            (i.div_ceil(d.etp), o)
        };
        let mut op = Op::new(
            name,
            OpKind::Matmul {
                m: rows,
                n: ro,
                k: ri,
            },
        );
        // With linear biases (Megatron's --add-bias-linear) each expert's fc1 has a bias split
        // as its output features, its fc2 one whole on every expert-TP rank.
        let bias = u64::from(m.add_bias_linear);
        op.params = Some(Params {
            total: e * (i * o + bias * o),
            rank: local_experts * (ri * ro + bias * ro),
            class: ParamClass::Expert,
            trainable,
        });
        op.model_flops = Flops::matmul(2.0 * (d.tokens * k) as f64 * (i * o) as f64, trainable);
        op.rank_flops = Flops::matmul(2.0 * rows as f64 * (ri * ro) as f64, trainable);
        // One grouped GEMM over the local experts (Megatron-Core's TEGroupedLinear), each
        // expert its own weight and its share of the rows.
        op.grouped(local_experts)
            .save(TensorRole::Input, d.saved_input_bytes(rows, ri, false))
    };
    // With expert TP the received tokens are all-gathered over the expert-TP group, so each
    // expert slice sees the tokens of every member (Megatron-Core's all-to-all dispatcher).
    let rows = hot * d.etp;
    let lora = |t: LoraTarget| (d.lora && tr.lora.targets.contains(&t)).then_some(tr.lora.rank);
    let shape = (e, local_experts, k);
    ops.push(expert("moe.experts.fc1", rows, h, width, true));
    if let Some(r) = lora(LoraTarget::Fc1) {
        let dims = (rows, h, width, true);
        ops.push(expert_adapter("moe.experts.fc1_lora", dims, r, shape, d));
    }
    // Megatron-Core's unfused expert path runs these as kernels of their own.
    let megatron = tr.framework == Framework::MegatronCore && !tr.fused_grouped_mlp;
    if let (true, Some(_), Activation::Swiglu) = (megatron, m.activation_clamp, m.activation) {
        ops.push(activation_clamp(
            "moe.experts.act_clamp",
            rows,
            width.div_ceil(d.etp),
            d,
        ));
    }
    let act = activation_op("moe.experts.act", rows, width.div_ceil(d.etp), d);
    ops.push(if probs_in_activation(tr) {
        act.save(TensorRole::Routing, rows * 4)
    } else {
        act
    });
    // The experts' backward holds the output-gradient rows received by the combine's
    // all-to-all and the input-gradient rows gathered for the dispatch's (2 x rows x h, as
    // Megatron-Core's grouped GEMM over the local experts) beside an expert's own gradients.
    let mut fc2 = expert("moe.experts.fc2", rows, f, h, false);
    fc2.backward_scratch_bytes = 2 * rows * h * d.act;
    ops.push(fc2);
    if megatron && m.add_bias_linear {
        ops.push(expert_output_bias(rows, h, d));
    }
    if let Some(r) = lora(LoraTarget::Fc2) {
        let dims = (rows, f, h, false);
        ops.push(expert_adapter("moe.experts.fc2_lora", dims, r, shape, d));
    }
}

/// The clamp on a gated activation's inputs as Megatron-Core runs it (megatron/core/fusions/
/// fused_bias_geglu.py, `weighted_bias_quick_geglu_impl`, GPT-OSS's `activation_func_clamp_value`):
/// before the fused activation, the gate and linear halves are clamped by two elementwise
/// kernels and concatenated again by a third, over `rows` rows of `width` (both halves).
/// Forward they move 4 x width an element row (each clamp reads and writes its half, the
/// concatenation reads and writes both); backward 5 x width (each clamp's backward reads the
/// gradient and its input and writes a gradient, the split's backward concatenates the two).
/// The op's bytes are a third of those 9 x width, as the ledger's backward moves twice an
/// op's forward bytes (time.rs), so the two passes sum to the kernels' traffic. The fused
/// activation keeps the concatenated copy for its backward (`ctx.save_for_backward`).
fn activation_clamp(name: &'static str, rows: u64, width: u64, d: &Dims) -> Op {
    let bytes = rows * width * d.act;
    Op::new(name, OpKind::MemoryBound { bytes: 3 * bytes }).save(TensorRole::Input, bytes)
}

/// The routed experts' fc2 bias as Megatron-Core adds it (megatron/core/transformer/moe/
/// experts.py, `TEGroupedMLP._apply_bias`, from "Enable bias in expert mlp", 2025-09 until the
/// packed path of 2026-08): fc2 skips its bias, then per local expert its bias times each
/// row's routing probability is added to the expert's rows (`t + b * p`), the rows are
/// concatenated and cast back to the activations' dtype, all unfused. Per element of the
/// [rows x h] output, with b * p in the probabilities' dtype (2 or 4 bytes, [`Dims::probs`]):
/// forward, the product written, the sum read and written, the concatenation read and written
/// and, for fp32 probabilities, the cast to bf16 (12 or 28 bytes for bf16 activations); backward, the
/// cast's and the sum's gradient casts (fp32 only), the product's two gradients (each a
/// product written and summed: 6 x the probabilities' bytes) and the split's concatenation of
/// the row gradients (16 or 40 bytes). As for [`activation_clamp`], the op's bytes are a third
/// of the two passes' sum.
fn expert_output_bias(rows: u64, h: u64, d: &Dims) -> Op {
    let (a, p) = (d.act, d.probs);
    let fwd = p + (a + 2 * p) + 2 * p + if p == a { 0 } else { p + a };
    let bwd = if p == a { 0 } else { 2 * (a + p) } + 6 * p + 2 * a;
    let bytes = rows * h * (fwd + bwd) / 3;
    Op::new("moe.experts.fc2_bias", OpKind::MemoryBound { bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Layer, Resolved};
    use crate::model::op::{Op, OpKind};
    use crate::model::Ledger;

    /// Rows of the expert fc1 matmul of the hottest rank: 8 experts over ep 2 (4 a rank),
    /// top-2, 32 tokens a rank, the hottest expert at twice its share.
    fn expert_rows(capacity_factor: f64) -> u64 {
        expert_rows_tp(capacity_factor, 1)
    }

    /// [`expert_rows`] with tp = expert_tp = `tp` (and SP), on 2 tp GPUs.
    fn expert_rows_tp(capacity_factor: f64, tp: u32) -> u64 {
        match expert_op(capacity_factor, tp, "moe.experts.fc1").0.kind {
            OpKind::Matmul { m, .. } => m,
            k => panic!("{k:?}"),
        }
    }

    /// The op `name` of the MoE block of the model of [`expert_rows_tp`], with the
    /// activations' bytes per element.
    fn expert_op(capacity_factor: f64, tp: u32, name: &str) -> (Op, u64) {
        let v = serde_json::json!({
            "model": {
                "num_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
                "num_query_groups": 4, "ffn_hidden_size": 128, "vocab_size": 128,
                "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 64,
                "moe_load_imbalance": 2.0, "moe_capacity_factor": capacity_factor
            },
            "cluster": {"gpu": "cpu", "num_gpus": 2 * tp, "gpus_per_node": 8},
            "parallel": {"tp": tp, "sp": tp > 1, "expert_tp": tp, "pp": 1, "ep": 2},
            "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 16}
        });
        let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
        let r = Resolved::new(cfg).expect("validates");
        let ledger = Ledger::build(&r);
        let act = ledger.dims.act;
        let op = ledger
            .moe
            .expect("moe block")
            .ops
            .into_iter()
            .find(|o| o.name == name)
            .expect("op");
        (op, act)
    }

    /// The MoE block's ops of [`expert_op`]'s model (SwiGLU) in LoRA mode on fc1 and fc2,
    /// rank 4, with tp = expert_tp = 2 and SP.
    fn lora_ops() -> Vec<Op> {
        let v = serde_json::json!({
            "model": {
                "num_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
                "num_query_groups": 4, "ffn_hidden_size": 128, "vocab_size": 128,
                "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 64,
                "activation": "swiglu"
            },
            "cluster": {"gpu": "cpu", "num_gpus": 4, "gpus_per_node": 8},
            "parallel": {"tp": 2, "sp": true, "expert_tp": 2, "pp": 1, "ep": 2},
            "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 16,
                         "mode": "lora", "lora": {"rank": 4, "targets": ["fc1", "fc2"]}}
        });
        let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
        let r = Resolved::new(cfg).expect("validates");
        Ledger::build(&r).moe.expect("moe block").ops
    }

    /// The MoE block of a GPT-OSS-120B layer (hidden 2880, 128 experts of FFN 2880 with
    /// SwiGLU, top-4) on an H100 SXM at sequence 4096, micro batch 1, EP 8, bf16.
    fn gpt_oss_block() -> (Vec<Op>, crate::config::GpuProfile) {
        gpt_oss_block_with(serde_json::json!({}), serde_json::json!({}))
    }

    /// [`gpt_oss_block`] with `parallel` and `training` fields over its own.
    fn gpt_oss_block_with(
        parallel: serde_json::Value,
        training: serde_json::Value,
    ) -> (Vec<Op>, crate::config::GpuProfile) {
        let mut v = serde_json::json!({
            "model": {"preset": "gpt-oss-120b"},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
            "parallel": {"tp": 1, "pp": 1, "ep": 8},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}
        });
        for (section, over) in [("parallel", parallel), ("training", training)] {
            for (k, x) in over.as_object().expect("an object") {
                v[section][k] = x.clone();
            }
        }
        let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
        let r = Resolved::new(cfg).expect("validates");
        let gpu = (*r.gpu).clone();
        (Ledger::build(&r).moe.expect("moe block").ops, gpu)
    }

    #[test]
    fn the_moe_blocks_grouped_expert_gemm_and_routing_by_hand() {
        let (ops, gpu) = gpt_oss_block();
        let rates = crate::time::Rates {
            gpu: &gpu,
            peak_flops: gpu.peak_flops.bf16,
            element_bytes: 2,
            matmul_efficiency: gpu.efficiency.matmul,
        };
        let op = |name: &str| ops.iter().find(|o| o.name == name).expect(name);
        let (e, ovh) = (&gpu.efficiency, gpu.efficiency.kernel_overhead_s);
        // 4096 tokens x top-4 = 16384 rows reach the rank's 128 / 8 = 16 experts: 1024 rows
        // each. fc1 forward: 16 x [1024 x 2880] . [2880 x 5760]: 543.6 GFLOP over 16 x 8 x 23
        // = 2944 tiles of 2880 / 64 = 45 k-iterations on 132 SMs (stream-K: 132480 units in
        // 1004 rounds); memory: 16 x (1024 x 2880 + 2880 x 5760 + 1024 x 5760) bf16 elements
        // at the operand stream share of HBM. The slower of the two, after one launch.
        let fc1 = op("moe.experts.fc1");
        assert_eq!(fc1.gemm_groups, 16);
        let flops = 16.0 * 2.0 * 1024.0 * 2880.0 * 5760.0;
        let compute = flops / (989.4e12 * e.matmul * 132480.0 / (1004.0 * 132.0));
        let stream = gpu.hbm_bytes_per_s * gpu.gemm.operand_stream_fraction.unwrap();
        let memory = 16.0 * (1024.0 * 2880.0 + 2880.0 * 5760.0 + 1024.0 * 5760.0) * 2.0 / stream;
        let (fwd, _, _) = rates.op_s(fc1);
        let by_hand = compute.max(memory) + ovh;
        assert!((fwd / by_hand - 1.0).abs() < 1e-9, "{fwd} vs {by_hand}");
        // The routing: 4096 x 128 scores, 17 bytes an element (score function 8, top-k 4,
        // scattered probabilities and map 5) and 4096 x 4 chosen (12 bytes each); no aux loss.
        let routing = op("moe.router.topk");
        let bytes = 17 * 4096 * 128 + 4096 * 4 * 12;
        assert_eq!(routing.kind, OpKind::MemoryBound { bytes });
        let (fwd, bwd, _) = rates.op_s(routing);
        let hbm = gpu.hbm_bytes_per_s * e.memory_bound;
        assert!((fwd - (bytes as f64 / hbm + ovh)).abs() < 1e-15);
        assert!((bwd - (2.0 * bytes as f64 / hbm + ovh)).abs() < 1e-15);
    }

    /// GPT-OSS's clamped GLU and expert biases as Megatron-Core runs them, counted kernel by
    /// kernel (megatron/core/fusions/fused_bias_geglu.py, moe/experts.py `_apply_bias`): the
    /// rank's 16384 rows of 2 x 2880 (clamp) and of 2880 (fc2's bias), bf16 activations.
    #[test]
    fn gpt_oss_clamp_and_expert_bias_move_their_kernels_bytes() {
        let bytes = |ops: &[Op], name: &str| match ops.iter().find(|o| o.name == name) {
            Some(Op {
                kind: OpKind::MemoryBound { bytes },
                ..
            }) => Some(*bytes),
            _ => None,
        };
        let (rows, w, h) = (16384u64, 5760u64, 2880u64);
        // Clamp: forward two clamps over the halves (read and write w) and the concatenation
        // (read and write w); backward two clamp backwards (gradient, input, output: 1.5 w)
        // and the split's concatenation (2 w): 9 w elements of 2 bytes over both passes, the
        // forward a third of them.
        let clamp_total = rows * (2 * w + 2 * w + 3 * w + 2 * w) * 2;
        // fc2's bias with bf16 probabilities (the all-to-all dispatcher): forward b * p
        // written (2), t + b * p (2 + 2 read, 2 written), the concatenation (2 + 2); backward
        // the two product gradients (each 2 + 2 written and read, then 2 summed) and the
        // split's concatenation (2 + 2).
        let bias_total = rows * h * ((2 + 6 + 4) + (6 + 6 + 4));
        let (ops, _) = gpt_oss_block();
        assert_eq!(bytes(&ops, "moe.experts.act_clamp"), Some(clamp_total / 3));
        assert_eq!(bytes(&ops, "moe.experts.fc2_bias"), Some(bias_total / 3));
        // The flex dispatcher hands the experts fp32 probabilities: b * p, the sum and the
        // concatenation in fp32, a cast back forward (4 + 10 + 8 + 6); backward the casts of
        // the output's and the rows' gradients (6 + 6), the product gradients in fp32 (12 +
        // 12) and the concatenation (4).
        let flex = serde_json::json!({"moe_token_dispatcher": "flex",
                                      "moe_flex_dispatcher_backend": "deepep"});
        let (ops, _) = gpt_oss_block_with(flex, serde_json::json!({}));
        let fp32_total = rows * h * ((4 + 10 + 8 + 6) + (6 + 6 + 24 + 4));
        assert_eq!(bytes(&ops, "moe.experts.fc2_bias"), Some(fp32_total / 3));
        // Another framework's experts are not Megatron-Core's unfused kernels.
        let fsdp = serde_json::json!({"framework": "fsdp"});
        let (ops, _) = gpt_oss_block_with(serde_json::json!({}), fsdp);
        assert_eq!(bytes(&ops, "moe.experts.act_clamp"), None);
        assert_eq!(bytes(&ops, "moe.experts.fc2_bias"), None);
    }

    #[test]
    fn lora_puts_an_adapter_on_every_routed_experts_fc1_and_fc2() {
        // NeMo's LoRA wraps each expert's linear_fc1/linear_fc2 (one adapter per expert): with
        // 8 experts, rank 4, hidden 64 and SwiGLU's fc1 of 2 x 64 = 128 rows, fc1's adapters
        // hold 8 x (64 x 4 + 4 x 128) = 6144 elements and fc2's 8 x (64 x 4 + 4 x 64) = 4096.
        // A rank holds 4 experts (EP 2), split over expert TP 2 as the dense adapters: fc1's A
        // whole and B halved, 4 x (256 + 256) = 2048; fc2's A halved and B whole,
        // 4 x (128 + 256) = 1536.
        let ops = lora_ops();
        let params = |name: &str| {
            ops.iter()
                .find(|o| o.name == name)
                .and_then(|o| o.params)
                .unwrap_or_else(|| panic!("{name}"))
        };
        let fc1 = params("moe.experts.fc1_lora");
        let fc2 = params("moe.experts.fc2_lora");
        assert_eq!((fc1.total, fc1.rank), (6144, 2048));
        assert_eq!((fc2.total, fc2.rank), (4096, 1536));
        for p in [fc1, fc2] {
            assert!(p.trainable && p.class == ParamClass::Expert);
        }
        // The base experts and the router stay frozen.
        for name in ["moe.experts.fc1", "moe.experts.fc2", "moe.router"] {
            assert!(!params(name).trainable, "{name}");
        }
    }

    #[test]
    fn a_capacity_below_one_drops_a_balanced_routers_assignments() {
        // 32 tokens x top-2 = 64 assignments a rank; a factor of 0.5 lets each of the 8
        // experts take ceil(0.5 x 32 x 2 / 8) = 4 of a source's, so 8 x 4 = 32 are kept: the
        // combine saves 32 expert-output rows of hidden 64 (Lepikhin et al. 2020, sec. 2.2).
        let (combine, act) = expert_op(0.5, 1, "moe.combine");
        let saved: u64 = combine.saved.iter().map(|s| s.bytes).sum();
        assert_eq!(saved, 32 * 64 * act);
        // Without a binding capacity all 64 are.
        let (combine, act) = expert_op(1.0, 1, "moe.combine");
        let saved: u64 = combine.saved.iter().map(|s| s.bytes).sum();
        assert_eq!(saved, 64 * 64 * act);
    }

    #[test]
    fn the_experts_backward_holds_the_gradient_rows_both_ways() {
        // The hottest rank's 80 rows (see below) of hidden 64: the output-gradient rows from
        // the combine's all-to-all and the input-gradient rows for the dispatch's, 2 x 80 x 64
        // elements, with the executor's expert loop (executor/src/model/moe.rs, `moe_bwd`:
        // `drecv` and `dback` live across it).
        let (fc2, act) = expert_op(0.0, 1, "moe.experts.fc2");
        assert_eq!(fc2.backward_scratch_bytes, 2 * 80 * 64 * act);
        // A capacity of 1.0 caps the rows at 64 (see below), and the held rows with them.
        let (fc2, act) = expert_op(1.0, 1, "moe.experts.fc2");
        assert_eq!(fc2.backward_scratch_bytes, 2 * 64 * 64 * act);
    }

    #[test]
    fn a_capacity_factor_caps_the_hottest_ranks_tokens() {
        // Uniform share: 32 tokens x top-2 = 64 routed rows a rank. The hottest expert at 2x
        // its share makes the rank's load 1 + (2 - 1) / 4 = 1.25, i.e. 80 rows. A capacity of
        // ceil(1.0 x 32 x 2 / 8) = 8 tokens per expert per source rank lets the rank's 4
        // experts take 4 x 2 sources x 8 = 64 rows; a factor of 1.5 (12 each: 96) does not bind.
        assert_eq!(expert_rows(0.0), 80);
        assert_eq!(expert_rows(1.0), 64);
        assert_eq!(expert_rows(1.5), 80);
        assert_eq!(capacity_limit(1.0, 32, 2, 8, 2), Some(64));
        assert_eq!(capacity_limit(0.0, 32, 2, 8, 2), None);
    }

    #[test]
    fn a_dropped_fraction_sets_the_rows_sent_and_the_imbalance_applies_to_the_kept_ones() {
        // 32 tokens x top-2 = 64 assignments a rank, 8 experts over EP 2, capacity 1.0 (8 a
        // source per expert: at most 64 rows). A learned router that drops half of them
        // (Lepikhin et al. 2020, sec. 2.2: what the capacity turns away is neither sent nor
        // combined) keeps ceil(64 x 0.5) = 32 rows a rank; the hottest expert at twice the kept
        // share makes its rank 1 + (2 - 1) / 4 = 1.25 x 32 = 40 rows, within the cap.
        let mut m = ModelConfig {
            num_experts: 8,
            moe_router_topk: 2,
            moe_load_imbalance: 2.0,
            moe_capacity_factor: 1.0,
            moe_dropped_fraction: Some(0.5),
            ..ModelConfig::default()
        };
        assert_eq!(routed_rows(&m, 32, 2), RoutedRows { hot: 40, kept: 32 });
        // A third dropped: ceil(64 x 2/3) = 43 kept, 1.25 x 43 = 53.75 -> 54 received.
        m.moe_dropped_fraction = Some(1.0 / 3.0);
        assert_eq!(routed_rows(&m, 32, 2), RoutedRows { hot: 54, kept: 43 });
        // Without the field, a balanced router's: nothing dropped at 1.0, and the hottest rank
        // capped at 64 (80 uncapped), as `a_capacity_factor_caps_the_hottest_ranks_tokens`.
        m.moe_dropped_fraction = None;
        assert_eq!(routed_rows(&m, 32, 2), RoutedRows { hot: 64, kept: 64 });
        // At 0.5 the capacity keeps 32 of a source's 64, and caps the hottest rank at 32.
        m.moe_capacity_factor = 0.5;
        assert_eq!(routed_rows(&m, 32, 2), RoutedRows { hot: 32, kept: 32 });
    }

    #[test]
    fn the_imbalance_of_a_rank_load_inverts_the_rank_load_factor() {
        // 8 experts over EP 2: 4 a rank; the hottest expert at 2x makes the rank 1.25x
        // (docs/engine.md, MoE load), and 1.25x back gives 2.
        assert_eq!(rank_load_factor(2.0, 8, 2), 1.25);
        assert_eq!(imbalance_of_rank_load(1.25, 8, 2), 2.0);
        assert_eq!(imbalance_of_rank_load(1.0, 8, 4), 1.0);
    }

    #[test]
    fn expert_tensor_parallelism_gathers_the_received_tokens() {
        // TP 2 + SP, expert-TP 2: a rank routes its 16-token sequence shard (16 x 2 = 32 rows,
        // x 1.25 for the hottest expert = 40), and Megatron-Core's all-to-all dispatcher
        // all-gathers the received rows over the expert-TP group, so each expert slice runs
        // the 80 rows of the whole microbatch, as without TP.
        assert_eq!(expert_rows_tp(0.0, 2), 80);
    }

    /// A capacity factor of 2^53 (its per-source product overflowed u64) lets every
    /// assignment through, as no capacity does: the hottest rank's rows are the same.
    #[test]
    fn a_huge_capacity_factor_limits_nothing() {
        assert_eq!(expert_rows(9_007_199_254_740_992.0), expert_rows(0.0));
        // Every expert takes a source's every assignment: experts x tokens x k rows.
        let most = capacity_limit(f64::MAX, u64::from(u32::MAX), 1 << 16, 1 << 16, 1);
        assert_eq!(most, Some((1 << 32) * u64::from(u32::MAX)));
        // Past 2^64 rows no row count reaches the limit: u64::MAX stands for it.
        let most = capacity_limit(f64::MAX, 1 << 40, 1 << 16, 1 << 16, 1);
        assert_eq!(most, Some(u64::MAX));
    }
}
