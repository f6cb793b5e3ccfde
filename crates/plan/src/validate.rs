//! `Plan::validate`: the rules a plan keeps before a backend runs it, one function per group
//! (the model's shapes, the sequence split, the training settings, the experts, LoRA, the
//! ranks), checked in that order so the first broken rule is the one named.

use crate::error::PlanError;
use crate::group::GroupKind;
use crate::plan::{
    CpComm, HybridLayer, LoraShape, ModelShape, Parallelism, Plan, RankPlan, RouterShape,
    ScoreFunction,
};

/// Whether `r`'s expert-TP group has the shape MoE Parallel Folding gives it: `etp` ranks,
/// ascending, `r` among them, all of its EP index (place in the EP group) and pipeline rank,
/// meeting its expert-DP group in `r` alone; the block of `etp` consecutive members of its TP
/// group when `etp` divides tp, whole TP groups (of several DP or CP ranks) when tp divides
/// `etp`.
fn expert_tp_group_ok(plan: &Plan, r: &RankPlan) -> bool {
    let (g, tp_group) = (
        r.groups.get(GroupKind::ExpertTp),
        r.groups.get(GroupKind::Tp),
    );
    let (etp, tp) = (plan.parallel.etp as usize, tp_group.len());
    // The EP index is a rank's place in its EP group (the experts it holds), which MoE
    // Parallel Folding need not tie to the dense coordinates.
    let ep_index = |o: &RankPlan| {
        o.groups
            .get(GroupKind::Ep)
            .iter()
            .position(|&y| y == o.rank)
    };
    let same_ep_pp = |x: &u32| {
        plan.ranks
            .get(*x as usize)
            .is_some_and(|o| ep_index(o) == ep_index(r) && o.coords.pp == r.coords.pp)
    };
    let expert_dp = r.groups.get(GroupKind::ExpertDp);
    let shared = g.iter().filter(|x| expert_dp.contains(x)).count();
    let shape = if tp % etp == 0 {
        let lo = (r.coords.tp as usize / etp) * etp;
        tp_group.get(lo..lo + etp) == Some(g)
    } else if etp % tp == 0 {
        tp_group.iter().all(|x| g.contains(x))
    } else {
        true
    };
    g.len() == etp
        && g.windows(2).all(|w| w[0] < w[1])
        && g.contains(&r.rank)
        && g.iter().all(same_ep_pp)
        && shared == 1
        && shape
}

impl Plan {
    /// Checks shapes and divisibility; names the offending quantity.
    pub fn validate(&self) -> Result<(), PlanError> {
        let (m, p) = (&self.model, &self.parallel);
        let t = p.tp as usize;
        check_model_shapes(m, t)?;
        let c = check_sequence_split(m, p, t)?;
        check_training(m, p)?;
        check_hybrid(m, p)?;
        let ep = check_experts(m, p, t, c)?;
        if let Some(l) = &self.lora {
            check_lora(l, m)?;
        }
        self.check_ranks(t, c, ep)
    }

    /// The world size and each rank's number, group sizes and stages.
    fn check_ranks(&self, t: usize, c: usize, ep: usize) -> Result<(), PlanError> {
        let (m, p) = (&self.model, &self.parallel);
        let world = (p.tp * p.cp * p.pp * p.dp) as usize;
        if self.ranks.len() != world {
            return Err(PlanError::RankCount {
                ranks: self.ranks.len(),
                world,
            });
        }
        for (i, r) in self.ranks.iter().enumerate() {
            if r.rank as usize != i {
                return Err(PlanError::RankNumber {
                    index: i,
                    rank: r.rank,
                });
            }
            for kind in GroupKind::ALL {
                let (expected, rule) = group_size(kind, p, t, c, ep);
                let members = r.groups.get(kind).len();
                if members != expected {
                    return Err(PlanError::GroupSize {
                        rank: i,
                        group: kind,
                        members,
                        rule,
                        expected,
                    });
                }
            }
            if m.moe.is_some() && !expert_tp_group_ok(self, r) {
                return Err(PlanError::ExpertTpGroup {
                    rank: i,
                    etp: p.etp,
                });
            }
            for s in &r.stages {
                if self.stages.get(*s as usize).map(|st| st.pp_rank) != Some(r.coords.pp) {
                    return Err(PlanError::ForeignStage { rank: i, stage: *s });
                }
            }
        }
        Ok(())
    }
}

/// The members each rank's `kind` group must have, and the rule that gives them, under `p`
/// with TP `t`, CP `c` and EP `ep`.
fn group_size(
    kind: GroupKind,
    p: &Parallelism,
    t: usize,
    c: usize,
    ep: usize,
) -> (usize, &'static str) {
    let dp = p.dp as usize;
    match kind {
        GroupKind::Tp => (t, "tp"),
        GroupKind::Cp => (c, "cp"),
        GroupKind::Pp => (p.pp as usize, "pp"),
        GroupKind::Dp => (dp, "dp"),
        GroupKind::DpCp => (dp * c, "dp x cp"),
        GroupKind::Ep => (ep, "ep"),
        // The experts' replicas: the ranks with the same slices of the same experts, the
        // tp x cp x dp ranks over etp x ep (Megatron folds CP into expert data parallelism).
        GroupKind::ExpertDp => (
            dp * c * t / (p.etp.max(1) as usize * ep),
            "dp x cp x tp / (expert tp x ep)",
        ),
        GroupKind::ExpertTp => (p.etp as usize, "expert tp"),
    }
}

/// The model's sizes, positions, dropouts and head shapes, and their split over `t`-way TP.
fn check_model_shapes(m: &ModelShape, t: usize) -> Result<(), PlanError> {
    if m.heads == 0 || m.kv_heads == 0 || m.hidden == 0 || m.seq == 0 || m.micro_batch == 0 {
        return Err(PlanError::NonPositiveSizes);
    }
    if m.learned_positions > 0 && m.learned_positions < m.seq {
        return Err(PlanError::PositionsBelowSeq {
            rows: m.learned_positions,
            seq: m.seq,
        });
    }
    if m.mla.is_some() && m.learned_positions > 0 {
        return Err(PlanError::MlaWithLearnedPositions);
    }
    if !(0.0..1.0).contains(&m.hidden_dropout) {
        return Err(PlanError::HiddenDropout {
            p: m.hidden_dropout,
        });
    }
    if !(0.0..1.0).contains(&m.attention_dropout) {
        return Err(PlanError::AttentionDropout {
            p: m.attention_dropout,
        });
    }
    if m.attention_dropout > 0.0 && !m.flash {
        return Err(PlanError::AttentionDropoutWithoutFlash);
    }
    if m.heads % m.kv_heads != 0 {
        return Err(PlanError::HeadsNotMultipleOfKvHeads {
            heads: m.heads,
            kv_heads: m.kv_heads,
        });
    }
    if m.heads % t != 0 || m.kv_heads % t != 0 {
        return Err(PlanError::HeadsNotDivisibleByTp {
            heads: m.heads,
            kv_heads: m.kv_heads,
            tp: t,
        });
    }
    if m.ffn % t != 0 || m.vocab % t != 0 {
        return Err(PlanError::FfnVocabNotDivisibleByTp {
            ffn: m.ffn,
            vocab: m.vocab,
            tp: t,
        });
    }
    if m.head_dim % 2 != 0 {
        return Err(PlanError::OddHeadDim {
            head_dim: m.head_dim,
        });
    }
    check_layer_kinds(m)
}

/// Issue 31's layer kinds: a window or chunk of at least one key, sinks inside the flash
/// attention, a MoE layer pattern of one entry per decoder layer.
fn check_layer_kinds(m: &ModelShape) -> Result<(), PlanError> {
    let a = &m.attention;
    for (field, v) in [("window", a.window), ("chunk", a.chunk)] {
        if v == Some(0) {
            return Err(PlanError::ZeroAttentionSpan { field });
        }
    }
    if a.sinks && !m.flash {
        return Err(PlanError::SinksWithoutFlash);
    }
    if let Some(moe) = &m.moe {
        let n = moe.layer_pattern.len();
        if n > 0 && n != m.num_layers as usize {
            return Err(PlanError::MoeLayerPattern {
                len: n,
                layers: m.num_layers,
            });
        }
    }
    Ok(())
}

/// A hybrid model has one sublayer a decoder layer, its Mamba-2 layers a mixer whose heads and
/// B/C groups split evenly over TP (the groups whole), and no context parallelism over them.
fn check_hybrid(m: &ModelShape, p: &Parallelism) -> Result<(), PlanError> {
    let bad = |field, rule: String| Err(PlanError::Hybrid { field, rule });
    if m.hybrid.is_empty() {
        if m.mamba.is_some() {
            return bad("mamba", "a Mamba-2 mixer needs hybrid layers".into());
        }
        return Ok(());
    }
    if m.hybrid.len() != m.num_layers as usize {
        let (l, n) = (m.hybrid.len(), m.num_layers);
        return bad("hybrid", format!("has {l} layers, num_layers is {n}"));
    }
    if m.hybrid.contains(&HybridLayer::Moe) && m.moe.is_none() {
        return bad("hybrid", "has MoE layers (E) but no MoeShape".into());
    }
    if !m.hybrid.contains(&HybridLayer::Mamba) {
        return Ok(());
    }
    let Some(a) = &m.mamba else {
        return bad("mamba", "the hybrid layers hold Mamba-2 mixers (M)".into());
    };
    let t = p.tp.max(1) as usize;
    let sizes = [
        a.heads,
        a.head_dim,
        a.state,
        a.groups,
        a.conv_kernel,
        a.chunk,
    ];
    if sizes.contains(&0) {
        return bad("mamba", "every size must be positive".into());
    }
    if a.heads % a.groups != 0 || a.groups % t != 0 {
        let (h, g) = (a.heads, a.groups);
        let rule = format!("groups ({g}) must divide heads ({h}) and be divisible by tp ({t})");
        return bad("mamba.groups", rule);
    }
    if p.cp > 1 {
        return bad(
            "mamba",
            "context parallelism over Mamba-2 layers is not run".into(),
        );
    }
    Ok(())
}

/// The sequence's split over context parallelism and TP's sequence shards; returns the CP
/// size.
fn check_sequence_split(m: &ModelShape, p: &Parallelism, t: usize) -> Result<usize, PlanError> {
    let c = p.cp.max(1) as usize;
    if p.cp == 0 {
        return Err(PlanError::ZeroCp);
    }
    if c > 1 {
        let balanced = p.cp_comm.load_balanced();
        let chunks = if balanced { 2 * c } else { c };
        if m.seq % chunks != 0 {
            return Err(PlanError::SeqNotDivisibleByCpChunks {
                seq: m.seq,
                chunks,
                per: if balanced { "2 cp" } else { "cp" },
                cp: c,
            });
        }
        if p.cp_comm == CpComm::A2a && ((m.heads / t) % c != 0 || (m.kv_heads / t) % c != 0) {
            return Err(PlanError::UlyssesHeads {
                heads: m.heads,
                kv_heads: m.kv_heads,
                tp: t,
                cp: c,
            });
        }
        if !m.flash {
            return Err(PlanError::CpWithoutFlash);
        }
    }
    if p.sp && (m.tokens() / c) % t != 0 {
        return Err(PlanError::SpTokensNotDivisible {
            tokens: m.tokens() / c,
            tp: t,
        });
    }
    Ok(c)
}

/// ZeRO's stage, the gradient buckets and the data's vocabulary.
fn check_training(m: &ModelShape, p: &Parallelism) -> Result<(), PlanError> {
    if p.zero > 3 {
        return Err(PlanError::ZeroStage { zero: p.zero });
    }
    if p.grad_bucket_params == Some(0) {
        return Err(PlanError::ZeroGradBucket);
    }
    if m.data_vocab == 0 || m.data_vocab > m.vocab {
        return Err(PlanError::DataVocab {
            data_vocab: m.data_vocab,
            vocab: m.vocab,
        });
    }
    Ok(())
}

/// Expert parallelism and the MoE layer's shapes, router and coefficients; returns the EP
/// size.
fn check_experts(m: &ModelShape, p: &Parallelism, t: usize, c: usize) -> Result<usize, PlanError> {
    // EP lies on Megatron-Core's expert grid over tp x cp x dp, so it need not divide dp (the
    // expert-TP rule below places it).
    if p.ep == 0 {
        return Err(PlanError::ZeroEp);
    }
    let ep = p.ep as usize;
    let Some(moe) = &m.moe else {
        if ep > 1 {
            return Err(PlanError::EpWithoutMoe { ep });
        }
        return Ok(ep);
    };
    if moe.num_experts == 0 || moe.num_experts % ep != 0 {
        return Err(PlanError::ExpertsNotDivisibleByEp {
            num_experts: moe.num_experts,
            ep,
        });
    }
    if moe.top_k == 0 || moe.top_k > moe.num_experts {
        return Err(PlanError::TopK {
            top_k: moe.top_k,
            num_experts: moe.num_experts,
        });
    }
    if moe.ffn == 0 {
        return Err(PlanError::ZeroMoeFfn);
    }
    // Expert tensor parallelism: etp x ep dividing tp x cp x dp (MoE Parallel Folding),
    // with TP's sequence shards.
    let fold = t * c * p.dp as usize;
    if p.etp == 0 || fold % (p.etp as usize * ep) != 0 || (p.tp > 1 && !p.sp) {
        return Err(PlanError::ExpertTp {
            etp: p.etp,
            ep: p.ep,
            fold,
        });
    }
    // Each expert's intermediate size splits over expert TP, the shared experts' over TP.
    if moe.ffn % p.etp as usize != 0 || moe.shared_ffn % t != 0 {
        return Err(PlanError::MoeFfnNotDivisible {
            ffn: moe.ffn,
            shared_ffn: moe.shared_ffn,
            tp: t,
        });
    }
    moe.router.validate(moe.num_experts, moe.top_k)?;
    for (name, v) in [
        ("capacity_factor", moe.capacity_factor),
        ("aux_loss_coeff", moe.aux_loss_coeff),
        ("bias_update_rate", moe.router.bias_update_rate),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(PlanError::MoeCoefficient { name, value: v });
        }
    }
    if moe.router.score == ScoreFunction::Sigmoid && moe.aux_loss_coeff > 0.0 {
        return Err(PlanError::AuxLossWithSigmoid);
    }
    Ok(ep)
}

/// LoRA's rank, scale and targets.
fn check_lora(l: &LoraShape, m: &ModelShape) -> Result<(), PlanError> {
    let bad = |field, rule| Err(PlanError::Lora { field, rule });
    if l.rank == 0 {
        return bad("rank", "must be at least 1");
    }
    if !(l.alpha.is_finite() && l.alpha > 0.0) {
        return bad("alpha", "must be a positive finite number");
    }
    if m.mla.is_some() && l.qkv {
        return bad(
            "qkv",
            "an MLA layer has no fused QKV projection to adapt (the engine counts none)",
        );
    }
    Ok(())
}

impl RouterShape {
    /// Checks the groups and the score function's combinations, naming the rule.
    pub fn validate(&self, num_experts: usize, top_k: usize) -> Result<(), PlanError> {
        let r = self;
        if r.groups > 0 {
            let ok = num_experts % r.groups == 0
                && (1..=r.groups).contains(&r.group_topk)
                && top_k >= r.group_topk
                && top_k <= r.group_topk * (num_experts / r.groups);
            if !ok {
                return Err(PlanError::RouterGroups {
                    groups: r.groups,
                    group_topk: r.group_topk,
                    num_experts,
                    top_k,
                });
            }
        } else if r.group_topk > 0 {
            return Err(PlanError::RouterGroups {
                groups: 0,
                group_topk: r.group_topk,
                num_experts,
                top_k,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::Groups;
    use crate::plan::{AdamConfig, MambaShape, Recompute};

    /// "M*" of hidden 8 with a mixer of 4 heads in 2 groups.
    fn hybrid() -> Plan {
        let model = ModelShape {
            hybrid: vec![HybridLayer::Mamba, HybridLayer::Attention],
            mamba: Some(MambaShape {
                heads: 4,
                head_dim: 2,
                state: 3,
                groups: 2,
                conv_kernel: 3,
                chunk: 2,
            }),
            ..ModelShape::dense(2, 8, 2, 1, 12, 16)
        };
        Plan::single_rank(model, AdamConfig::default(), 1, 1, Recompute::None)
    }

    fn error(p: &Plan) -> String {
        p.validate().expect_err("refused").to_string()
    }

    #[test]
    fn every_group_kind_is_checked_by_size_naming_it() {
        let one = || {
            Plan::single_rank(
                ModelShape::dense(2, 8, 2, 1, 12, 16),
                AdamConfig::default(),
                1,
                1,
                Recompute::None,
            )
        };
        assert!(one().validate().is_ok());
        for kind in GroupKind::ALL {
            // A group the plan does not state, then one of two members for a one-rank world.
            let mut p = one();
            p.ranks[0].groups = Groups::of_every_kind(|k| if k == kind { vec![] } else { vec![0] });
            let want = format!("rank 0: the {kind} group has 0 members, ");
            assert!(error(&p).starts_with(&want), "{}", error(&p));
            p.ranks[0].groups.insert(kind, vec![0, 1]);
            assert!(
                error(&p).contains(" group has 2 members, "),
                "{}",
                error(&p)
            );
            assert!(error(&p).ends_with("(1) expected"), "{}", error(&p));
        }
    }

    #[test]
    fn hybrid_plans_are_checked_by_field() {
        assert!(hybrid().validate().is_ok());
        let mut p = hybrid();
        p.model.hybrid.push(HybridLayer::Mlp);
        assert_eq!(error(&p), "model.hybrid: has 3 layers, num_layers is 2");
        let mut p = hybrid();
        p.model.mamba = None;
        assert!(error(&p).starts_with("model.mamba: "), "{}", error(&p));
        let mut p = hybrid();
        p.model.hybrid[1] = HybridLayer::Moe;
        assert!(error(&p).starts_with("model.hybrid: "), "{}", error(&p));
        let mut p = hybrid();
        if let Some(a) = p.model.mamba.as_mut() {
            a.groups = 3;
        }
        assert!(
            error(&p).starts_with("model.mamba.groups: "),
            "{}",
            error(&p)
        );
        let mut p = hybrid();
        p.model.hybrid.clear();
        assert!(error(&p).starts_with("model.mamba: "), "{}", error(&p));
    }
}
