//! The rank's layout: which blocks a rank holds and what each holds, built from the Plan with
//! the [`Builder`] of [`super::blocks`] (each layer file adds its own tensors: biases, LoRA
//! adapters, learned positions).

use super::blocks::{
    fc1_rows, seg, BlockKind, BlockLayout, Builder, RankDims, DENSE_SPACE, EXPERT_SPACE,
    FROZEN_EXPERT_SPACE, FROZEN_SPACE, SPACES,
};
use parsim_plan::plan::{Activation, HybridLayer, LoraShape, MlaShape, Norm, Plan, RankPlan};

/// The blocks laid out so far, each in its space, back to back.
struct Layout<'p> {
    plan: &'p Plan,
    /// LoRA with adapters on the routed experts.
    routed_lora: bool,
    blocks: Vec<BlockLayout>,
    next: [usize; SPACES],
}

impl Layout<'_> {
    /// Appends block `kind` of stage `stage`, its tensors laid out by `fill`, to its space.
    fn emit(&mut self, kind: BlockKind, stage: u32, fill: &dyn Fn(&mut Builder)) {
        let mut b = Builder::new();
        fill(&mut b);
        let (tensors, len) = b.finish();
        let space = match kind {
            // Under LoRA the routed experts are frozen, in a space of their own; with their
            // own adapters those make up the experts block (the base then in its own block).
            BlockKind::Experts(_) if self.plan.lora.is_none() || self.routed_lora => EXPERT_SPACE,
            BlockKind::Experts(_) | BlockKind::FrozenExperts(_) => FROZEN_EXPERT_SPACE,
            BlockKind::Adapters(_) => DENSE_SPACE,
            _ if self.plan.lora.is_some() => FROZEN_SPACE,
            _ => DENSE_SPACE,
        };
        let next = &mut self.next[space];
        self.blocks.push(BlockLayout {
            kind,
            stage,
            space,
            range: *next..*next + len,
            tensors,
        });
        *next += len;
    }
}

/// The blocks of a rank holding `stages`, in execution order, laid out back to back (each in
/// its space); an MoE layer's experts block follows its layer block (past its adapters block
/// under LoRA; with expert adapters its frozen-experts block follows it). `ep_rank` holds experts ep_rank E/ep .. (ep_rank + 1) E/ep.
pub fn rank_layout(plan: &Plan, rp: &RankPlan, ep_rank: u32) -> Vec<BlockLayout> {
    let (m, stages) = (&plan.model, &rp.stages);
    let rd = RankDims::new(plan, rp);
    let (h, std) = (rd.h, m.init_std);
    let mut out = Layout {
        plan,
        routed_lora: super::moe_lora::routed(plan),
        blocks: Vec::new(),
        next: [0usize; SPACES],
    };
    let embedding = |b: &mut Builder| embedding_block(b, plan, &rd);
    let holds_embedding = stages.iter().any(|&s| plan.stages[s as usize].embedding);
    for &s in stages {
        let st = &plan.stages[s as usize];
        if st.embedding {
            out.emit(BlockKind::Embedding, s, &embedding);
        }
        // The layers, then on the last stage the output and the MTP modules (Megatron's
        // default placement), each as its input block, its transformer layer and its norm;
        // the embedding's copy right after the output when this rank lacks the embedding.
        let mut items: Vec<BlockKind> = st.layers.clone().map(BlockKind::Layer).collect();
        if st.output {
            items.push(BlockKind::Output);
            if m.mtp_layers > 0 && !holds_embedding {
                items.push(BlockKind::MtpEmbedding);
            }
            for k in 0..m.mtp_layers {
                let l = m.num_layers + k;
                items.extend([
                    BlockKind::MtpIn(k),
                    BlockKind::Layer(l),
                    BlockKind::MtpOut(k),
                ]);
            }
        }
        for item in items {
            match item {
                BlockKind::Layer(l) => layer_blocks(&mut out, l, s, &rd, ep_rank),
                BlockKind::Output => out.emit(item, s, &|b| {
                    output_block(b, m.norm, m.tied_embeddings, &rd, std)
                }),
                BlockKind::MtpIn(k) => out.emit(item, s, &|b| mtp_in_block(b, m.norm, k, &rd, std)),
                BlockKind::MtpEmbedding => out.emit(item, s, &embedding),
                BlockKind::MtpOut(k) => out.emit(item, s, &|b| {
                    b.norm(&format!("mtp.{k}.final_norm"), m.norm, h)
                }),
                _ => {}
            }
        }
    }
    if m.tied_embeddings {
        super::embedding_group::alias_local_tied_output(&mut out.blocks);
    }
    out.blocks
}

/// The word embedding's rows of this rank (vocabulary-parallel), and the learned positions.
fn embedding_block(b: &mut Builder, plan: &Plan, rd: &RankDims) {
    let (m, h, r) = (&plan.model, rd.h, rd.tp_rank);
    let std = m.init_std;
    b.push(
        rd.v_r,
        h,
        vec![seg(
            "embedding.weight".into(),
            h,
            r * rd.v_r..(r + 1) * rd.v_r,
            0..h,
            std,
        )],
        false,
    );
    super::positions::push_table(b, m.learned_positions, h, std);
}

/// Layer `l`'s blocks on stage `s`: the layer, under LoRA its adapters, and for an MoE layer
/// its experts (under LoRA with expert adapters, those then the frozen experts).
fn layer_blocks(out: &mut Layout, l: u32, s: u32, rd: &RankDims, ep_rank: u32) {
    let plan = out.plan;
    let m = &plan.model;
    let (h, std) = (rd.h, m.init_std);
    out.emit(BlockKind::Layer(l), s, &|b| layer_block(b, plan, l, rd));
    if let Some(lora) = &plan.lora {
        // An MoE layer's fc1/fc2 adapters here are its shared experts' (the routed
        // experts' lie in its experts block).
        let (lora, ffn) = match (m.is_moe_layer(l), &m.moe) {
            (true, Some(moe)) => {
                let shared = moe.shared_ffn > 0;
                let only_shared = LoraShape {
                    fc1: lora.fc1 && shared,
                    fc2: lora.fc2 && shared,
                    ..*lora
                };
                (only_shared, moe.shared_ffn)
            }
            _ => (*lora, m.ffn),
        };
        out.emit(BlockKind::Adapters(l), s, &|b| {
            super::lora::push_adapters(b, &lora, rd, m.heads * rd.dv, ffn, l, std)
        });
    }
    let (true, Some(moe)) = (m.is_moe_layer(l), &m.moe) else {
        return;
    };
    let local_experts = || {
        let per = moe.num_experts / plan.parallel.ep.max(1) as usize;
        ep_rank as usize * per..(ep_rank as usize + 1) * per
    };
    let experts = |b: &mut Builder| {
        for e in local_experts() {
            let q = format!("layers.{l}.experts.{e}");
            let et = (rd.et, rd.et_rank);
            expert_mlp(b, m.activation, &q, moe.ffn, et, h, std);
            if m.bias_linear {
                super::bias::mlp_biases(b, m.activation, &q, (moe.ffn, h), et, std, false);
            }
        }
    };
    match (out.routed_lora, &plan.lora) {
        (true, Some(lora)) => {
            out.emit(BlockKind::Experts(l), s, &|b| {
                for e in local_experts() {
                    let q = format!("layers.{l}.experts.{e}");
                    let act = m.activation;
                    super::moe_lora::push(b, lora, rd, &q, act, moe.ffn, std);
                }
            });
            out.emit(BlockKind::FrozenExperts(l), s, &experts);
        }
        _ => out.emit(BlockKind::Experts(l), s, &experts),
    }
}

/// Layer `l`'s own block: its norms, attention (QKV or MLA) and output projection, then its
/// MLP, or for an MoE layer its router and shared experts; linear biases; MLA's up-projections.
fn layer_block(b: &mut Builder, plan: &Plan, l: u32, rd: &RankDims) {
    let m = &plan.model;
    let (h, d, r, std) = (rd.h, rd.d, rd.tp_rank, m.init_std);
    let p = format!("layers.{l}");
    // A hybrid model's layer holds one sublayer: a Mamba-2 mixer, attention alone, or the
    // MLP (or MoE) alone, whose tensors keep their indices after three empty ones.
    let kind = m.hybrid_layer(l);
    if kind == Some(HybridLayer::Mamba) {
        return super::mamba::push_block(b, plan, l, rd);
    }
    let mut dropped = Builder::new();
    let ab = if matches!(kind, Some(HybridLayer::Mlp | HybridLayer::Moe)) {
        for _ in 0..3 {
            b.push(0, h, Vec::new(), false);
        }
        &mut dropped
    } else {
        &mut *b
    };
    ab.norm(&format!("{p}.attn_norm"), m.norm, h);
    let (qa, kg) = (rd.a_r * d, rd.g_r * d);
    if let Some(a) = &m.mla {
        mla_down(ab, a, &p, rd, std);
    } else {
        ab.push(
            rd.qkv_r(),
            h,
            vec![
                seg(format!("{p}.wq"), h, r * qa..(r + 1) * qa, 0..h, std),
                seg(format!("{p}.wk"), h, r * kg..(r + 1) * kg, 0..h, std),
                seg(format!("{p}.wv"), h, r * kg..(r + 1) * kg, 0..h, std),
            ],
            false,
        );
    }
    let ov = rd.a_r * rd.dv;
    ab.push(
        h,
        ov,
        vec![seg(
            format!("{p}.wo"),
            m.heads * rd.dv,
            0..h,
            r * ov..(r + 1) * ov,
            std,
        )],
        false,
    );
    if kind == Some(HybridLayer::Attention) {
        return;
    }
    b.norm(&format!("{p}.mlp_norm"), m.norm, h);
    if let (true, Some(moe)) = (m.is_moe_layer(l), &m.moe) {
        // The router, replicated: hidden -> experts. Its gradient is a partial
        // sum over TP: each TP rank routes its own sequence shard.
        let e = moe.num_experts;
        let sharded = plan.parallel.moe_routes_sp_shard();
        b.push(
            e,
            h,
            vec![seg(format!("{p}.router"), h, 0..e, 0..h, std)],
            sharded,
        );
        if moe.shared_ffn > 0 {
            let q = format!("{p}.shared_experts");
            let tp = (rd.t, rd.tp_rank);
            expert_mlp(b, m.activation, &q, moe.shared_ffn, tp, h, std);
        }
        super::bias::push(b, m, l, &p, rd, std);
        super::modern::push(b, plan, l, &p, rd);
        if let Some(a) = &m.mla {
            mla_up(b, m.norm, a, &p, rd, std);
        }
        return;
    }
    let f = rd.f_r;
    let fc1 = match m.activation {
        Activation::Swiglu => vec![
            seg(format!("{p}.w_gate"), h, r * f..(r + 1) * f, 0..h, std),
            seg(format!("{p}.w_up"), h, r * f..(r + 1) * f, 0..h, std),
        ],
        Activation::Gelu => {
            vec![seg(format!("{p}.w_fc1"), h, r * f..(r + 1) * f, 0..h, std)]
        }
    };
    b.push(rd.fc1_r, h, fc1, false);
    b.push(
        h,
        f,
        vec![seg(
            format!("{p}.w_down"),
            m.ffn,
            0..h,
            r * f..(r + 1) * f,
            std,
        )],
        false,
    );
    super::bias::push(b, m, l, &p, rd, std);
    super::modern::push(b, plan, l, &p, rd);
    if let Some(a) = &m.mla {
        mla_up(b, m.norm, a, &p, rd, std);
    }
}

/// The final norm and this rank's vocabulary rows of the output layer. Tied embeddings: the
/// output weight is a copy of the word embedding (same global tensor, so it starts equal), kept
/// equal by the embedding group.
fn output_block(b: &mut Builder, norm: Norm, tied: bool, rd: &RankDims, std: f32) {
    let (h, r) = (rd.h, rd.tp_rank);
    let name = if tied {
        "embedding.weight"
    } else {
        "output.weight"
    };
    b.norm("final_norm", norm, h);
    b.push(
        rd.v_r,
        h,
        vec![seg(name.into(), h, r * rd.v_r..(r + 1) * rd.v_r, 0..h, std)],
        false,
    );
}

/// MTP module k's input block: `enorm` and `hnorm` (on the sequence-sharded stream, as the
/// layers' norms), then the column-parallel `eh_proj` [h, 2h] (Megatron's layout: the
/// embedding's columns, then the hidden states'), this rank's h/t output rows held as two
/// tensors, one per input half.
fn mtp_in_block(b: &mut Builder, norm: Norm, k: u32, rd: &RankDims, std: f32) {
    let (h, r) = (rd.h, rd.tp_rank);
    let hr = h / rd.t;
    b.norm(&format!("mtp.{k}.enorm"), norm, h);
    b.norm(&format!("mtp.{k}.hnorm"), norm, h);
    let name = format!("mtp.{k}.eh_proj");
    for cols in [0..h, h..2 * h] {
        let rows = r * hr..(r + 1) * hr;
        b.push(
            hr,
            h,
            vec![seg(name.clone(), 2 * h, rows, cols, std)],
            false,
        );
    }
}

/// An expert's (or the shared experts') MLP `{q}.fc1` [w1, h] and `{q}.fc2` [h, f] of
/// intermediate size `f`, split over `(t, r)` (size, rank) as the dense MLP (the routed
/// experts over expert TP, Megatron's `--expert-tensor-parallel-size`; the shared ones over
/// TP): this rank's fc1 rows (under SwiGLU the gate rows then the up rows of its slice) and fc2
/// columns.
fn expert_mlp(
    b: &mut Builder,
    act: Activation,
    q: &str,
    f: usize,
    (t, r): (usize, usize),
    h: usize,
    std: f32,
) {
    let fr = f / t;
    let own = r * fr..(r + 1) * fr;
    let (w1, segs) = fc1_rows(act, format!("{q}.fc1"), h, f, (t, r), std);
    b.push(w1, h, segs, false);
    b.push(
        h,
        fr,
        vec![seg(format!("{q}.fc2"), f, 0..h, own, std)],
        false,
    );
}

/// MLA's down-projections, replicated over TP (as Megatron): the query's `{p}.wq_down`
/// [q_lora_rank, h] and the key/value latent's `{p}.wkv_down` [kv_lora_rank + qk_rope, h]
/// (the latent then the shared rotary key), fused in one tensor (one input, one GEMM). Their
/// gradients are whole on every TP rank: the latents' gradients are all-reduced over TP.
/// Without a query latent (q_lora_rank = 0, DeepSeek-V2-Lite) the query rows are the plain
/// column-parallel projection of this rank's heads, `{p}.wq_nope` then `{p}.wq_rope`.
fn mla_down(b: &mut Builder, a: &MlaShape, p: &str, rd: &RankDims, std: f32) {
    let h = rd.h;
    let kvr = a.kv_lora_rank + a.qk_rope;
    let mut segs = if a.q_lora_rank > 0 {
        vec![seg(format!("{p}.wq_down"), h, 0..a.q_lora_rank, 0..h, std)]
    } else {
        let (r, ar) = (rd.tp_rank, rd.a_r);
        let rows = |w: usize| r * ar * w..(r + 1) * ar * w;
        vec![
            seg(format!("{p}.wq_nope"), h, rows(a.qk_nope), 0..h, std),
            seg(format!("{p}.wq_rope"), h, rows(a.qk_rope), 0..h, std),
        ]
    };
    segs.push(seg(format!("{p}.wkv_down"), h, 0..kvr, 0..h, std));
    b.push(mla_down_rows(a, rd.a_r), h, segs, false);
}

/// Rows of the fused down-projection: the query latent (or, without one, this rank's `a_r`
/// query heads) then the key/value latent and the shared rotary key.
pub fn mla_down_rows(a: &MlaShape, a_r: usize) -> usize {
    mla_q_rows(a, a_r) + a.kv_lora_rank + a.qk_rope
}

/// The query's rows of the fused down-projection: the latent, or this rank's query heads.
pub fn mla_q_rows(a: &MlaShape, a_r: usize) -> usize {
    if a.q_lora_rank > 0 {
        a.q_lora_rank
    } else {
        a_r * a.qk()
    }
}

/// Number of tensors [`mla_up`] appends at the end of a layer block: the query's norm and
/// up-projection (only with a query latent), the key/value latent's.
pub fn mla_up_tensors(a: &MlaShape) -> usize {
    if a.q_lora_rank > 0 {
        4
    } else {
        2
    }
}

/// MLA's norms and up-projections, appended at the end of the layer block: with a query
/// latent, `q_norm` [q_lora_rank] and the query up-projection of this rank's heads, no-rotary
/// rows then rotary rows; `kv_norm` [kv_lora_rank]; the key (no-rotary) then value
/// up-projections of this rank's heads. The norms act on the latents (whole on every TP rank):
/// no SP partial sums.
fn mla_up(b: &mut Builder, norm: Norm, a: &MlaShape, p: &str, rd: &RankDims, std: f32) {
    let (qr, kvr, r, ar) = (a.q_lora_rank, a.kv_lora_rank, rd.tp_rank, rd.a_r);
    let rows = |w: usize| r * ar * w..(r + 1) * ar * w;
    if qr > 0 {
        b.norm_of(&format!("{p}.q_norm"), norm, qr, false);
        b.push(
            ar * a.qk(),
            qr,
            vec![
                seg(format!("{p}.wq_up_nope"), qr, rows(a.qk_nope), 0..qr, std),
                seg(format!("{p}.wq_up_rope"), qr, rows(a.qk_rope), 0..qr, std),
            ],
            false,
        );
    }
    b.norm_of(&format!("{p}.kv_norm"), norm, kvr, false);
    b.push(
        ar * (a.qk_nope + a.v),
        kvr,
        vec![
            seg(format!("{p}.wk_up"), kvr, rows(a.qk_nope), 0..kvr, std),
            seg(format!("{p}.wv_up"), kvr, rows(a.v), 0..kvr, std),
        ],
        false,
    );
}
