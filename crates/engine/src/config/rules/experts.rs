//! Mixture of experts: routing and expert sizes, and expert parallelism's fit on Megatron-Core's
//! expert grid (expert_tp x ep over the tp x cp x dp ranks of a pipeline stage).

use super::super::{Config, Violation};
use super::{data_parallel, divisors, fmt_list};

/// The ep values that fit `num_experts` and an expert grid of `etp` x ep over `stage_ranks`
/// (tp x cp x dp) ranks, for a hint.
fn fitting_eps(num_experts: u32, etp: u64, stage_ranks: u64) -> Vec<u64> {
    if etp == 0 || stage_ranks % etp != 0 {
        return Vec::new();
    }
    divisors(stage_ranks / etp)
        .into_iter()
        .filter(|&e| u64::from(num_experts) % e == 0)
        .collect()
}

/// An MoE model routes to 1..=num_experts experts of positive size; a dense one has no EP.
pub fn model(cfg: &Config) -> Vec<Violation> {
    let (m, p) = (&cfg.model, &cfg.parallel);
    let mut errs = Vec::new();
    if m.moe_latent_size.is_some() && !m.is_moe() {
        errs.push(Violation::new(
            "model.moe_latent_size",
            "projects the routed tokens of an MoE layer: it needs num_experts > 0",
        ));
    }
    if m.is_moe() {
        if m.moe_router_topk == 0 || m.moe_router_topk > m.num_experts {
            errs.push(Violation::new(
                "model.moe_router_topk",
                format!(
                    "must be in 1..={} (num_experts), got {}",
                    m.num_experts, m.moe_router_topk
                ),
            ));
        }
        if m.moe_ffn_hidden_size == 0 {
            errs.push(Violation::new(
                "model.moe_ffn_hidden_size",
                "must be at least 1 for an MoE model",
            ));
        }
        if m.moe_latent_size == Some(0) {
            errs.push(Violation::new(
                "model.moe_latent_size",
                "must be at least 1 (leave it out for no latent projection)",
            ));
        }
        if m.moe_first_k_dense > m.num_layers {
            errs.push(Violation::new(
                "model.moe_first_k_dense",
                format!(
                    "must be at most num_layers ({}), got {}",
                    m.num_layers, m.moe_first_k_dense
                ),
            ));
        } else if m.moe_first_k_dense == m.num_layers && p.ep > 1 {
            errs.push(
                Violation::new(
                    "model.moe_first_k_dense",
                    format!(
                        "= num_layers ({}) leaves no MoE layer for expert parallelism (ep = {})",
                        m.num_layers, p.ep
                    ),
                )
                .hint("lower moe_first_k_dense, or set parallel.ep = 1"),
            );
        }
        // The hottest expert takes at most every token: a share of num_experts / topk times
        // the uniform one.
        let most = m.num_experts as f64 / m.moe_router_topk.max(1) as f64;
        if (1..=m.num_experts).contains(&m.moe_router_topk) && m.moe_load_imbalance > most {
            errs.push(
                Violation::new(
                    "model.moe_load_imbalance",
                    format!(
                        "must be at most num_experts / moe_router_topk = {} / {} = {most}, got {}",
                        m.num_experts, m.moe_router_topk, m.moe_load_imbalance
                    ),
                )
                .hint("at that value the hottest expert already receives every token"),
            );
        }
        if m.moe_router_force_load_balancing && m.moe_load_imbalance != 1.0 {
            errs.push(
                Violation::new(
                    "model.moe_load_imbalance",
                    format!(
                        "must be 1 with moe_router_force_load_balancing (its routing is exactly balanced), got {}",
                        m.moe_load_imbalance
                    ),
                )
                .hint("leave moe_load_imbalance at 1, or turn the forced balancing off"),
            );
        }
    } else if p.ep > 1 {
        errs.push(
            Violation::new(
                "parallel.ep",
                format!(
                    "expert parallelism needs experts, but model.num_experts = 0 (ep = {})",
                    p.ep
                ),
            )
            .hint("set parallel.ep = 1 for a dense model"),
        );
    }
    errs
}

/// EP divides the experts; expert TP x EP divides TP x CP x DP (Megatron-Core's expert grid,
/// so EP may exceed DP); an MoE model's order passes Megatron-Core's two assertions on that
/// grid.
pub fn expert_parallel(cfg: &Config) -> Vec<Violation> {
    let (m, p) = (&cfg.model, &cfg.parallel);
    let dp = data_parallel(cfg).unwrap_or(0);
    let mut errs = Vec::new();
    if dp > 0 && p.ep > 1 && m.num_experts % p.ep != 0 {
        errs.push(Violation::new(
            "parallel.ep",
            format!(
                "num_experts ({}) must be divisible by ep ({})",
                m.num_experts, p.ep
            ),
        ));
    }
    let etp = p.etp() as u64;
    // The ranks of a pipeline stage, over which Megatron-Core lays the expert grid.
    let stage_ranks = p.tp as u64 * p.cp as u64 * dp;
    let expert_ranks = etp * p.ep as u64;
    if dp == 0 || expert_ranks == 0 {
        return errs;
    }
    if stage_ranks % expert_ranks != 0 {
        let eps = fitting_eps(m.num_experts, etp, stage_ranks);
        let mut v = Violation::new(
            "parallel.expert_tp",
            format!(
                "expert_tp x ep ({etp} x {}) must divide tp x cp x dp ({stage_ranks}): Megatron-Core's expert grid lays expert_tp x ep x expert dp over the ranks of a pipeline stage",
                p.ep
            ),
        );
        if !eps.is_empty() {
            v = v.hint(format!(
                "with expert_tp {etp}, use ep in {{{}}}, or lower expert_tp",
                fmt_list(&eps)
            ));
        }
        errs.push(v);
        return errs;
    }
    if !m.is_moe() || p.pp <= 1 {
        return errs;
    }
    let edp = stage_ranks / expert_ranks;
    // Megatron-Core's two assertions on the expert grid, named together where both fail:
    // "When not using pp-last rank ordering, the data parallel size of the attention and moe
    // layers must be the same", and the two grids' pipeline groups agree.
    let mut broken = Vec::new();
    if !p.order.ends_with("pp") && edp != dp {
        broken.push(format!(
            "does not end in pp, so Megatron-Core needs the expert data-parallel size (tp x cp x dp / (expert_tp x ep) = {edp}) to equal dp ({dp})"
        ));
    }
    if !expert_pipeline_agrees(cfg, dp, edp) {
        broken.push("gives the expert grid (MoE Parallel Folding: tp = expert_tp, cp folded into expert data parallelism) other pipeline groups than the dense grid, which Megatron-Core refuses".to_string());
    }
    if !broken.is_empty() {
        errs.push(
            Violation::new(
                "parallel.order",
                format!("'{}' {}", p.order, broken.join("; and it ")),
            )
            .hint("put pp last in the order (Megatron's tp-cp-ep-dp-pp)"),
        );
    }
    errs
}

/// Megatron-Core's `initialize_model_parallel` builds the dense grid with ep = 1 and the expert
/// grid in the same order with tp = expert_tp, cp = 1 and dp = `edp` (tp x cp x dp / (expert_tp
/// x ep)), and asserts their pipeline groups agree: the axes before pp span as many ranks in
/// both. (An order that does not name each axis once is another rule's; it passes here.)
fn expert_pipeline_agrees(cfg: &Config, dp: u64, edp: u64) -> bool {
    let p = &cfg.parallel;
    let (tp, cp, ep, etp) = (p.tp as u64, p.cp as u64, p.ep as u64, p.etp() as u64);
    let (mut dense, mut expert) = (1u64, 1u64);
    for name in p.order.split('-') {
        let sizes = match name {
            "tp" => (tp, etp),
            "cp" => (cp, 1),
            "ep" => (1, ep),
            "dp" => (dp, edp),
            "pp" => break,
            _ => return true,
        };
        dense *= sizes.0;
        expert *= sizes.1;
    }
    dense == expert
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    fn moe(c: &mut Config) {
        c.model.num_experts = 8;
        c.model.moe_router_topk = 2;
        c.model.moe_ffn_hidden_size = 1024;
    }

    #[test]
    fn routing_picks_at_most_every_expert() {
        assert!(model(&with(moe)).is_empty());
        let v = model(&with(|c| {
            moe(c);
            c.model.moe_router_topk = 9;
        }));
        assert_eq!(fields(&v), ["model.moe_router_topk"]);
    }

    #[test]
    fn a_dense_model_has_no_expert_parallelism() {
        let v = model(&with(|c| c.parallel.ep = 2));
        assert_eq!(fields(&v), ["parallel.ep"]);
    }

    #[test]
    fn ep_divides_dp_and_the_experts() {
        // Default: dp 4.
        assert!(expert_parallel(&with(|c| {
            moe(c);
            c.parallel.ep = 4;
        }))
        .is_empty());
        let v = expert_parallel(&with(|c| {
            moe(c);
            c.model.num_experts = 6;
            c.parallel.ep = 4;
        }));
        assert_eq!(fields(&v), ["parallel.ep"]);
        assert!(v[0].rule.starts_with("num_experts (6)"));
    }

    /// Megatron-Core's expert grid needs only expert_tp x ep | tp x cp x dp: on the default 8
    /// GPUs (tp 2, dp 4), ep 8 with expert_tp 1 (the engine's default) fills the 1 x 8 expert
    /// grid over 2 x 4 ranks (ep above dp); with expert_tp 2, 2 x 8 = 16 does not divide 8,
    /// and the error names expert_tp with the ep values that fit (divisors of 8 / 2 = 4 that
    /// divide 8 experts).
    #[test]
    fn ep_may_exceed_dp_on_the_expert_grid() {
        let folded = |c: &mut Config| {
            moe(c);
            c.parallel.ep = 8;
            c.parallel.expert_tp = Some(1);
        };
        let base = with(folded);
        assert_eq!(data_parallel(&base), Some(4));
        assert!(expert_parallel(&base).is_empty());
        let v = expert_parallel(&with(|c| {
            folded(c);
            c.parallel.expert_tp = Some(2);
        }));
        assert_eq!(fields(&v), ["parallel.expert_tp"]);
        assert!(
            v[0].rule
                .starts_with("expert_tp x ep (2 x 8) must divide tp x cp x dp (8)"),
            "{}",
            v[0].rule
        );
        assert_eq!(
            v[0].hint.as_deref(),
            Some("with expert_tp 2, use ep in {1, 2, 4}, or lower expert_tp")
        );
    }

    /// The MoE model on 16 GPUs with tp 2, cp 1, pp 2 (dp 4).
    fn moe_tp2_pp2_on_16(c: &mut Config) {
        moe(c);
        c.cluster.num_gpus = 16;
        c.parallel.tp = 2;
        c.parallel.cp = 1;
        c.parallel.pp = 2;
    }

    /// Megatron-Core's assertion that the expert grid keeps the pipeline groups: with pp in
    /// the middle of the order and expert_tp 1 under tp 2 (16 GPUs, pp 2, dp 4), the axes
    /// before pp span tp 2 = 2 dense ranks but expert_tp 1 = 1 expert rank; pp last (or
    /// expert_tp = tp) agrees.
    #[test]
    fn the_expert_grid_keeps_the_pipeline_groups() {
        let base = |c: &mut Config| {
            moe_tp2_pp2_on_16(c);
            c.parallel.expert_tp = Some(1);
        };
        let v = expert_parallel(&with(|c| {
            base(c);
            c.parallel.order = "tp-pp-cp-ep-dp".into();
        }));
        assert_eq!(fields(&v), ["parallel.order"]);
        assert!(v[0].rule.contains("pipeline groups"), "{}", v[0].rule);
        assert!(expert_parallel(&with(base)).is_empty());
        assert!(expert_parallel(&with(|c| {
            base(c);
            c.parallel.order = "tp-pp-cp-ep-dp".into();
            c.parallel.expert_tp = Some(2);
        }))
        .is_empty());
    }

    /// Megatron-Core's pp-last assertion: with pp not last, the expert data-parallel size must
    /// equal dp. tp 2 = expert_tp, ep 2, dp 4, pp 2 in tp-cp-ep-pp-dp keeps the engine's pipeline
    /// groups (ep sits inside its dense grid) but gives expert DP 2 x 4 / (2 x 2) = 2, not 4;
    /// ep 1 gives 2 x 4 / 2 = 4 = dp, and pp last always passes.
    #[test]
    fn without_pp_last_expert_dp_equals_dp() {
        let base = |c: &mut Config| {
            moe_tp2_pp2_on_16(c);
            c.parallel.ep = 2;
            c.parallel.expert_tp = Some(2);
            c.parallel.order = "tp-cp-ep-pp-dp".into();
        };
        let v = expert_parallel(&with(base));
        assert_eq!(fields(&v), ["parallel.order"]);
        assert!(v[0].rule.contains("= 2) to equal dp (4)"), "{}", v[0].rule);
        let v = expert_parallel(&with(|c| {
            base(c);
            c.parallel.order = "tp-cp-ep-dp-pp".into();
        }));
        assert!(v.is_empty(), "{v:?}");
        // ep 1: expert DP 2 x 4 / (2 x 1) = 4 = dp.
        let v = expert_parallel(&with(|c| {
            base(c);
            c.parallel.ep = 1;
        }));
        assert!(v.is_empty(), "{v:?}");
    }

    /// Issue 18: 1e300 gave a 2.6e15 s step.
    #[test]
    fn imbalance_is_at_most_experts_over_topk() {
        let v = model(&with(|c| {
            moe(c);
            c.model.moe_load_imbalance = 1e300;
        }));
        assert_eq!(fields(&v), ["model.moe_load_imbalance"]);
        assert!(model(&with(|c| {
            moe(c);
            c.model.moe_load_imbalance = 4.0;
        }))
        .is_empty());
    }

    #[test]
    fn forced_balancing_leaves_no_load_imbalance() {
        let v = model(&with(|c| {
            moe(c);
            c.model.moe_router_force_load_balancing = true;
            c.model.moe_load_imbalance = 1.5;
        }));
        assert_eq!(fields(&v), ["model.moe_load_imbalance"]);
        assert!(v[0].rule.contains("moe_router_force_load_balancing"));
        assert!(model(&with(|c| {
            moe(c);
            c.model.moe_router_force_load_balancing = true;
        }))
        .is_empty());
    }

    /// Issue 18: every layer dense while experts are spread over 8 ranks.
    #[test]
    fn expert_parallelism_needs_a_moe_layer() {
        let v = model(&with(|c| {
            moe(c);
            c.model.moe_first_k_dense = c.model.num_layers;
            c.parallel.ep = 8;
        }));
        assert_eq!(fields(&v), ["model.moe_first_k_dense"]);
    }
}
