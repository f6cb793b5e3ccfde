//! The MoE token dispatcher and its EP overlap, as Megatron-Core checks them
//! (megatron/core/transformer/transformer_config.py, `__post_init__`), plus the combinations
//! parsim times the dispatcher for.

use super::super::{Config, Precision, Recompute, RecomputeModule, TokenDispatcher, Violation};

/// `parallel.moe_token_dispatcher` where parsim can time it, and
/// `parallel.overlap_moe_expert_parallel_comm` where Megatron-Core runs it.
pub fn token_dispatcher(cfg: &Config) -> Vec<Violation> {
    let (p, t, m) = (&cfg.parallel, &cfg.training, &cfg.model);
    let mut errs = Vec::new();
    if p.etp() > 1 && p.moe_token_dispatcher != TokenDispatcher::AllToAll {
        errs.push(Violation::new(
            "parallel.moe_token_dispatcher",
            format!(
                "{} is timed over the EP group alone; with expert_tp {} it spans expert TP x EP, which is modelled for alltoall only",
                p.moe_token_dispatcher,
                p.etp()
            ),
        ));
    }
    if t.fused_grouped_mlp {
        let field = "training.fused_grouped_mlp";
        if !m.is_moe() || t.framework != super::super::Framework::MegatronCore {
            errs.push(Violation::new(
                field,
                "is Megatron-Core's fused expert MLP: it needs an MoE model under megatron-core",
            ));
        }
        if p.etp() > 1 {
            errs.push(Violation::new(
                field,
                format!("Megatron-Core fuses the experts only without expert TP (experts.py, _is_fused_impl_supported); expert_tp is {}", p.etp()),
            ));
        }
    }
    if !p.overlap_moe_expert_parallel_comm {
        return errs;
    }
    let field = "parallel.overlap_moe_expert_parallel_comm";
    let mut refuse = |rule: String| errs.push(Violation::new(field, rule));
    if !m.is_moe() || p.ep <= 1 {
        refuse("hides the EP dispatch and combine: it needs an MoE model and ep > 1".into());
    }
    if p.moe_token_dispatcher == TokenDispatcher::AllGather {
        refuse("runs with the alltoall or flex token dispatcher, not allgather".into());
    }
    if t.recompute == Recompute::Full {
        refuse("Megatron-Core refuses it with full recomputation".into());
    }
    let moe_rerun = t
        .recompute_modules
        .as_ref()
        .is_some_and(|ms| ms.contains(&RecomputeModule::Moe));
    if t.recompute == Recompute::Selective && moe_rerun {
        refuse("Megatron-Core refuses it with 'moe' in recompute_modules".into());
    }
    if matches!(t.precision, Precision::Fp32) {
        refuse("Megatron-Core runs it only for a bf16 or fp16 model".into());
    }
    if m.mtp_num_layers > 1 {
        refuse(format!(
            "Megatron-Core runs it with at most one MTP layer, got {}",
            m.mtp_num_layers
        ));
    }
    errs
}

/// With pipelining, the EP overlap needs virtual stages (Megatron-Core: "If enabling EP A2A
/// overlap, virtual_pipeline_model_parallel_size must be specified when
/// pipeline_model_parallel_size > 1"). A rule of the pipeline split.
pub fn overlap_split(cfg: &Config) -> Vec<Violation> {
    let p = &cfg.parallel;
    if p.overlap_moe_expert_parallel_comm && p.pp > 1 && p.vpp <= 1 {
        return vec![Violation::new(
            "parallel.overlap_moe_expert_parallel_comm",
            format!(
                "with pp {} it needs virtual stages (vpp > 1), as Megatron-Core asserts",
                p.pp
            ),
        )
        .hint("set parallel.vpp, or turn the overlap off")];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::super::super::Config;
    use super::*;

    fn fields(c: &Config) -> Vec<String> {
        token_dispatcher(c)
            .into_iter()
            .chain(overlap_split(c))
            .map(|v| v.to_string())
            .collect()
    }

    fn moe() -> Config {
        let mut c = Config::default();
        c.model.num_experts = 8;
        c.model.moe_router_topk = 2;
        c.model.moe_ffn_hidden_size = 1024;
        c.parallel.ep = 2;
        c
    }

    /// Megatron-Core's refusals of the EP overlap, each named: full recomputation, the
    /// allgather dispatcher, pipelining without virtual stages; a valid one passes.
    #[test]
    fn the_ep_overlap_is_refused_where_megatron_refuses_it() {
        let mut c = moe();
        c.parallel.overlap_moe_expert_parallel_comm = true;
        c.training.recompute = Recompute::None;
        assert!(fields(&c).is_empty(), "{:?}", fields(&c));
        c.training.recompute = Recompute::Full;
        assert!(fields(&c)[0].contains("full recomputation"));
        c.training.recompute = Recompute::None;
        c.parallel.moe_token_dispatcher = TokenDispatcher::AllGather;
        assert!(fields(&c)[0].contains("not allgather"));
        c.parallel.moe_token_dispatcher = TokenDispatcher::Flex;
        c.parallel.pp = 2;
        let f = fields(&c);
        assert!(f.len() == 1 && f[0].contains("vpp > 1"), "{f:?}");
        c.parallel.vpp = 2;
        assert!(fields(&c).is_empty());
        c.parallel.ep = 1;
        assert!(fields(&c)[0].contains("ep > 1"));
    }

    /// The allgather and flex dispatchers are timed over the EP group alone: with expert TP
    /// they are refused by name; alltoall keeps its expert-TP collectives.
    #[test]
    fn gather_and_flex_dispatchers_refuse_expert_tp() {
        let mut c = moe();
        c.parallel.expert_tp = Some(2);
        assert!(fields(&c).is_empty());
        for d in [TokenDispatcher::AllGather, TokenDispatcher::Flex] {
            c.parallel.moe_token_dispatcher = d;
            let f = fields(&c);
            assert!(
                f.len() == 1 && f[0].contains("parallel.moe_token_dispatcher"),
                "{f:?}"
            );
        }
    }
}
