//! Sizes: positive where they divide, within [0, 1) where they are probabilities, and below
//! bounds far beyond any real run so that every byte and FLOP count fits in 64 bits.

use super::super::{Config, Violation};

/// The largest NVLink domain accepted: far beyond NVL576, small enough for any product.
const MAX_NVLINK_DOMAIN_GPUS: u32 = 1 << 16;

/// The most GPUs (`cluster.num_gpus`), and so the largest parallel degree: a degree counts
/// GPUs of the world.
pub const MAX_GPUS: u64 = 1 << 24;

/// The most layers (`model.num_layers`), and so the most a pipeline stage holds.
const MAX_LAYERS: u64 = 10_000;

/// The most virtual pipeline stages (`parallel.pp x parallel.vpp`): each holds a layer, the
/// embedding or the loss, so a real split has at most num_layers + MTP + 2 of them; the bound
/// keeps every stage count and stage index a small 32-bit number.
pub const MAX_VIRTUAL_STAGES: u64 = 1 << 16;

/// Every size rule; the other groups run only when these pass.
pub fn sizes(cfg: &Config) -> Vec<Violation> {
    let mut errs = positive(cfg);
    errs.extend(ranges(cfg));
    errs.extend(upper(cfg));
    errs
}

/// Sizes that must be positive.
pub fn positive(cfg: &Config) -> Vec<Violation> {
    let (m, c, p, t) = (&cfg.model, &cfg.cluster, &cfg.parallel, &cfg.training);
    let mut errs = Vec::new();
    let positive: [(&str, u64); 14] = [
        ("model.num_layers", m.num_layers as u64),
        ("model.hidden_size", m.hidden_size),
        ("model.num_attention_heads", m.num_attention_heads as u64),
        ("model.num_query_groups", m.num_query_groups as u64),
        ("model.ffn_hidden_size", m.ffn_hidden_size),
        ("model.vocab_size", m.vocab_size),
        (
            "model.make_vocab_size_divisible_by",
            m.make_vocab_size_divisible_by,
        ),
        ("cluster.num_gpus", c.num_gpus as u64),
        ("cluster.gpus_per_node", c.per_node() as u64),
        ("training.seq_length", t.seq_length),
        ("training.micro_batch_size", t.micro_batch_size),
        ("training.global_batch_size", t.global_batch_size),
        ("parallel.tp", p.tp as u64),
        ("parallel.cp", p.cp as u64),
    ];
    for (field, v) in positive {
        if v == 0 {
            errs.push(Violation::new(field, "must be at least 1, got 0"));
        }
    }
    for (field, v) in [
        ("parallel.pp", p.pp),
        ("parallel.vpp", p.vpp),
        ("parallel.ep", p.ep),
    ] {
        if v == 0 {
            errs.push(Violation::new(field, "must be at least 1, got 0"));
        }
    }
    if p.expert_tp == Some(0) {
        errs.push(Violation::new(
            "parallel.expert_tp",
            "must be at least 1, got 0",
        ));
    }
    if p.dp == Some(0) {
        errs.push(Violation::new("parallel.dp", "must be at least 1, got 0"));
    }
    if m.kv_channels == Some(0) {
        errs.push(
            Violation::new("model.kv_channels", "must be at least 1, got 0")
                .hint("leave it out for hidden_size / num_attention_heads"),
        );
    }
    if c.nvlink_domain_size == Some(0) {
        errs.push(
            Violation::new(
                "cluster.nvlink_domain_size",
                "must be at least 1 GPU, got 0",
            )
            .hint("leave it out for the GPU profile's domain, or gpus_per_node"),
        );
    }
    if c.nvlink_domain_size
        .is_some_and(|d| d > MAX_NVLINK_DOMAIN_GPUS)
    {
        errs.push(Violation::new(
            "cluster.nvlink_domain_size",
            format!(
                "must be at most {MAX_NVLINK_DOMAIN_GPUS} GPUs, got {}",
                c.nvlink_domain_size.unwrap_or_default()
            ),
        ));
    }
    if p.ddp_bucket_size == Some(0) {
        errs.push(
            Violation::new(
                "parallel.ddp_bucket_size",
                "must be at least 1 parameter, got 0",
            )
            .hint("leave it out for the framework's bucket (training.framework)"),
        );
    }
    errs
}

/// Dropout probabilities in [0, 1); MoE and MTP factors finite and at least their neutral value.
pub fn ranges(cfg: &Config) -> Vec<Violation> {
    let m = &cfg.model;
    let mut errs = Vec::new();
    for (field, v) in [
        ("model.hidden_dropout", m.hidden_dropout),
        ("model.attention_dropout", m.attention_dropout),
    ] {
        if !(v.is_finite() && (0.0..1.0).contains(&v)) {
            errs.push(Violation::new(field, format!("must be in [0, 1), got {v}")));
        }
    }
    if !(m.moe_load_imbalance.is_finite() && m.moe_load_imbalance >= 1.0) {
        errs.push(
            Violation::new(
                "model.moe_load_imbalance",
                format!(
                    "must be a finite number >= 1 (the hottest expert's tokens over a uniform share), got {}",
                    m.moe_load_imbalance
                ),
            )
            .hint("1.0 means perfectly balanced routing"),
        );
    }
    if let Some(f) = m.moe_dropped_fraction {
        if !(f.is_finite() && (0.0..1.0).contains(&f)) {
            errs.push(
                Violation::new(
                    "model.moe_dropped_fraction",
                    format!(
                        "must be in [0, 1) (the share of routed assignments the capacity drops), got {f}"
                    ),
                )
                .hint("leave it out for a balanced router's drops"),
            );
        } else if m.moe_capacity_factor == 0.0 {
            errs.push(
                Violation::new(
                    "model.moe_dropped_fraction",
                    format!(
                        "= {f} needs model.moe_capacity_factor > 0: without a capacity nothing is dropped"
                    ),
                )
                .hint("set model.moe_capacity_factor, or leave moe_dropped_fraction out"),
            );
        }
    }
    for (field, v, what) in [
        (
            "model.moe_capacity_factor",
            m.moe_capacity_factor,
            "0 means no capacity (no dropping)",
        ),
        (
            "model.moe_aux_loss_coeff",
            m.moe_aux_loss_coeff,
            "0 means no load-balancing loss",
        ),
        (
            "model.moe_router_bias_update_rate",
            m.moe_router_bias_update_rate,
            "0 keeps the expert bias at zero",
        ),
        (
            "model.mtp_loss_scaling_factor",
            m.mtp_loss_scaling_factor,
            "0 trains the MTP modules without letting them move the loss",
        ),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            errs.push(
                Violation::new(field, format!("must be a finite number >= 0, got {v}")).hint(what),
            );
        }
    }
    errs.extend(router_groups(m));
    errs
}

/// Group-limited routing (DeepSeek-V3): the groups split the experts evenly and a token's
/// top-k fits in its `group_topk` groups.
fn router_groups(m: &crate::config::ModelConfig) -> Option<Violation> {
    let (g, gk, e, k) = (
        m.moe_router_num_groups,
        m.moe_router_group_topk,
        m.num_experts,
        m.moe_router_topk,
    );
    if !m.is_moe() || (g == 0 && gk == 0) {
        return None;
    }
    if g == 0 {
        return Some(
            Violation::new(
                "model.moe_router_group_topk",
                format!("is {gk} but model.moe_router_num_groups is 0"),
            )
            .hint("set both, or neither"),
        );
    }
    let ok = e % g == 0 && (1..=g).contains(&gk) && k >= gk && k <= gk * (e / g);
    (!ok).then(|| {
        Violation::new(
            "model.moe_router_num_groups",
            format!(
                "{g} groups with group_topk {gk}: the groups must divide num_experts ({e}), group_topk lie in 1..=groups, and moe_router_topk ({k}) in group_topk..=group_topk x experts per group"
            ),
        )
    })
}

/// Upper bounds far beyond any real run, so that every byte and FLOP count fits in 64 bits.
pub fn upper(cfg: &Config) -> Vec<Violation> {
    let (m, c, p, t) = (&cfg.model, &cfg.cluster, &cfg.parallel, &cfg.training);
    let mut errs = Vec::new();
    let at_most: [(&str, u64, u64); 26] = [
        ("model.num_layers", m.num_layers as u64, MAX_LAYERS),
        ("model.hidden_size", m.hidden_size, 1 << 20),
        (
            "model.num_attention_heads",
            m.num_attention_heads as u64,
            1 << 16,
        ),
        ("model.ffn_hidden_size", m.ffn_hidden_size, 1 << 22),
        ("model.vocab_size", m.vocab_size, 1 << 28),
        ("model.kv_channels", m.kv_channels.unwrap_or(1), 1 << 16),
        ("model.num_experts", m.num_experts as u64, 1 << 16),
        ("model.num_query_groups", m.num_query_groups as u64, 1 << 16),
        (
            "parallel.ddp_bucket_size",
            p.ddp_bucket_size.unwrap_or(1),
            1 << 40,
        ),
        (
            "parallel.zero3_prefetch_params",
            p.zero3_prefetch_params.unwrap_or(0),
            1 << 40,
        ),
        (
            "parallel.zero3_prefetch_bucket_size",
            p.zero3_prefetch_bucket_size.unwrap_or(0),
            1 << 40,
        ),
        (
            "parallel.zero3_param_persistence_threshold",
            p.zero3_param_persistence_threshold.unwrap_or(0),
            1 << 40,
        ),
        (
            "parallel.zero3_max_live_parameters",
            p.zero3_max_live_parameters.unwrap_or(0),
            1 << 40,
        ),
        ("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size, 1 << 22),
        (
            "model.moe_latent_size",
            m.moe_latent_size.unwrap_or(0),
            1 << 22,
        ),
        (
            "model.moe_shared_expert_intermediate_size",
            m.moe_shared_expert_intermediate_size,
            1 << 22,
        ),
        ("model.mtp_num_layers", m.mtp_num_layers as u64, 64),
        (
            "model.make_vocab_size_divisible_by",
            m.make_vocab_size_divisible_by,
            1 << 16,
        ),
        ("cluster.num_gpus", c.num_gpus as u64, MAX_GPUS),
        ("cluster.gpus_per_node", c.per_node() as u64, 1 << 12),
        ("training.seq_length", t.seq_length, 1 << 24),
        ("training.micro_batch_size", t.micro_batch_size, 1 << 16),
        ("training.global_batch_size", t.global_batch_size, 1 << 32),
        ("training.lora.rank", t.lora.rank, 1 << 16),
        ("parallel.vpp", p.vpp as u64, 1 << 10),
        (
            "model.max_position_embeddings",
            m.max_position_embeddings,
            1 << 32,
        ),
    ];
    // The Mamba-2 mixer's widths (a config.json's `chunk_size` or state can be anything).
    let mamba: Vec<(&str, u64, u64)> = match &m.mamba {
        Some(mc) => vec![
            ("model.mamba.num_heads", mc.num_heads as u64, 1 << 16),
            ("model.mamba.head_dim", mc.head_dim, 1 << 12),
            ("model.mamba.state_dim", mc.state_dim, 1 << 12),
            ("model.mamba.num_groups", mc.num_groups as u64, 1 << 16),
            ("model.mamba.conv_kernel", mc.conv_kernel, 1 << 10),
            ("model.mamba.chunk_size", mc.chunk_size, 1 << 16),
        ],
        None => Vec::new(),
    };
    for (field, v, max) in at_most.into_iter().chain(mamba) {
        if v > max {
            errs.push(Violation::new(
                field,
                format!("must be at most {max}, got {v}"),
            ));
        }
    }
    errs.extend(parallel_upper(p));
    if t.seq_length.saturating_mul(t.micro_batch_size) > 1 << 32 {
        errs.push(Violation::new(
            "training.micro_batch_size",
            format!(
                "seq_length x micro_batch_size must be at most 2^32 tokens, got {} x {}",
                t.seq_length, t.micro_batch_size
            ),
        ));
    }
    if let Some(mla) = &m.mla {
        for (field, v) in [
            ("model.mla.q_lora_rank", mla.q_lora_rank),
            ("model.mla.kv_lora_rank", mla.kv_lora_rank),
            ("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim),
            ("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim),
            ("model.mla.v_head_dim", mla.v_head_dim),
        ] {
            if v > 1 << 16 {
                errs.push(Violation::new(
                    field,
                    format!("must be at most 65536, got {v}"),
                ));
            }
        }
    }
    errs
}

/// Parallel degrees at most [`MAX_GPUS`] (a degree counts GPUs), explicit stage sizes at most
/// [`MAX_LAYERS`], and at most [`MAX_VIRTUAL_STAGES`] virtual pipeline stages: the products
/// the other rules form of them (tp x cp x pp, pp x vpp, expert_tp x ep) then stay far inside
/// 64 bits, and each is refused by name before any is formed.
fn parallel_upper(p: &crate::config::ParallelConfig) -> Vec<Violation> {
    let mut errs = Vec::new();
    for (field, v) in [
        ("parallel.tp", Some(p.tp)),
        ("parallel.cp", Some(p.cp)),
        ("parallel.pp", Some(p.pp)),
        ("parallel.ep", Some(p.ep)),
        ("parallel.expert_tp", p.expert_tp),
        ("parallel.dp", p.dp),
    ] {
        if let Some(v) = v.filter(|&v| u64::from(v) > MAX_GPUS) {
            errs.push(Violation::new(
                field,
                format!("must be at most {MAX_GPUS} (a degree counts GPUs, and cluster.num_gpus is at most {MAX_GPUS}), got {v}"),
            ));
        }
    }
    for (field, v) in [
        ("parallel.first_stage_layers", p.first_stage_layers),
        ("parallel.last_stage_layers", p.last_stage_layers),
    ] {
        if let Some(v) = v.filter(|&v| u64::from(v) > MAX_LAYERS) {
            errs.push(Violation::new(
                field,
                format!("must be at most {MAX_LAYERS} layers (model.num_layers' bound), got {v}"),
            ));
        }
    }
    let stages = u64::from(p.pp) * u64::from(p.vpp);
    if stages > MAX_VIRTUAL_STAGES {
        errs.push(
            Violation::new(
                "parallel.vpp",
                format!(
                    "parallel.pp x parallel.vpp = {} x {} = {stages} virtual stages: at most {MAX_VIRTUAL_STAGES} (each holds at least a layer, the embedding or the loss)",
                    p.pp, p.vpp
                ),
            )
            .hint("lower parallel.pp or parallel.vpp"),
        );
    }
    errs
}

/// The whole model at most 10^15 parameters, one micro batch's widest activation tensor at
/// most [`MAX_TENSOR_ELEMENTS`], and unfused attention scores at most 2^50 bytes per layer
/// (checked once the sizes are in range).
pub fn model_size(cfg: &Config) -> Vec<Violation> {
    let (m, t) = (&cfg.model, &cfg.training);
    let mut errs = Vec::new();
    // Whole-model size, in floating point: at most 10^15 parameters.
    let (l, h, f, v) = (
        m.num_layers as f64,
        m.hidden_size as f64,
        m.ffn_hidden_size.max(m.moe_ffn_hidden_size) as f64,
        m.vocab_size as f64,
    );
    let experts = (m.num_experts as f64).max(1.0);
    let d = m
        .kv_channels
        .unwrap_or(m.hidden_size / m.num_attention_heads as u64) as f64;
    let rough =
        l * (4.0 * h * d * m.num_attention_heads as f64 + 3.0 * h * f * experts) + 2.0 * v * h;
    if rough > 1e15 {
        errs.push(Violation::new(
            "model",
            format!("about {rough:.2e} parameters: at most 10^15 are supported"),
        ));
    }
    errs.extend(widest_tensor(cfg));
    // Without a fused kernel the s x s scores are materialised.
    if !t.flash_attention {
        let scores = t.micro_batch_size as f64
            * m.num_attention_heads as f64
            * (t.seq_length as f64).powi(2)
            * 4.0;
        if scores > (1u64 << 50) as f64 {
            errs.push(
                Violation::new("training.flash_attention", format!("without a fused kernel the s x s attention scores take {scores:.2e} bytes per layer"))
                    .hint("set training.flash_attention = true"),
            );
        }
    }
    errs
}

/// The most elements one activation tensor of one micro batch may hold (tokens x its width):
/// 2^40, 4 times a 1M-token sequence's logits over a 256k vocabulary. With it a layer saves
/// at most about 2^50 bytes, and all 10,000 layers a model may have, twice over (an
/// interleaved pipeline's peak), stay below 2^62: every byte count fits in 64 bits.
pub const MAX_TENSOR_ELEMENTS: f64 = (1u64 << 40) as f64;

/// seq_length x micro_batch_size tokens times the widest per-token activation (the hidden
/// state, an MLP's, the routed experts' k rows, the router's scores, the logits, the attention
/// projections, the Mamba mixer's) at most [`MAX_TENSOR_ELEMENTS`]; in floating point, so
/// that it cannot wrap.
fn widest_tensor(cfg: &Config) -> Option<Violation> {
    let (m, t) = (&cfg.model, &cfg.training);
    let f = |x: u64| x as f64;
    let heads = f(m.num_attention_heads.into());
    let head_dim = f(m.head_dim());
    let mut widths: Vec<(&str, f64)> = vec![
        ("model.hidden_size", f(m.hidden_size)),
        ("model.ffn_hidden_size", f(m.ffn_hidden_size)),
        (
            "model.moe_ffn_hidden_size",
            f(m.moe_ffn_hidden_size) * f(m.moe_router_topk.max(1).into()),
        ),
        (
            "model.moe_shared_expert_intermediate_size",
            f(m.moe_shared_expert_intermediate_size),
        ),
        ("model.num_experts", f(m.num_experts.into())),
        ("model.vocab_size", f(m.vocab_size)),
        ("model.num_attention_heads", heads * head_dim),
        (
            "model.num_query_groups",
            f(m.num_query_groups.into()) * head_dim,
        ),
    ];
    if let Some(a) = &m.mla {
        let qk = f(a.qk_nope_head_dim) + f(a.qk_rope_head_dim);
        widths.push(("model.mla", heads * qk.max(f(a.v_head_dim))));
        widths.push(("model.mla", f(a.q_lora_rank).max(f(a.kv_lora_rank))));
    }
    if let Some(mc) = &m.mamba {
        widths.push((
            "model.mamba",
            (f(mc.num_heads.into()) * f(mc.head_dim))
                .max(f(mc.num_groups.into()) * f(mc.state_dim)),
        ));
    }
    let (field, width) =
        widths.into_iter().fold(
            ("model.hidden_size", 0.0),
            |a, b| if b.1 > a.1 { b } else { a },
        );
    let tokens = f(t.seq_length) * f(t.micro_batch_size);
    let elements = tokens * width;
    (elements > MAX_TENSOR_ELEMENTS).then(|| {
        Violation::new(
            "training.micro_batch_size",
            format!(
                "seq_length x micro_batch_size x the widest activation ({field}: {width} per token) = {elements:.3e} elements in one tensor of one micro batch: at most 2^40"
            ),
        )
        .hint("a shorter sequence, a smaller micro batch, or a narrower model")
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn zero_sizes_are_named() {
        let v = sizes(&with(|c| c.model.hidden_size = 0));
        assert_eq!(fields(&v), ["model.hidden_size"]);
        assert_eq!(v[0].rule, "must be at least 1, got 0");
    }

    #[test]
    fn probabilities_stay_below_one() {
        let v = ranges(&with(|c| c.model.attention_dropout = 1.0));
        assert_eq!(fields(&v), ["model.attention_dropout"]);
        assert!(ranges(&Config::default()).is_empty());
    }

    #[test]
    fn a_dropped_fraction_is_below_one_and_needs_a_capacity() {
        let cap = |f: f64| {
            with(move |c| {
                c.model.moe_capacity_factor = 1.0;
                c.model.moe_dropped_fraction = Some(f);
            })
        };
        assert!(ranges(&cap(0.5)).is_empty());
        for bad in [1.0, -0.1, f64::NAN] {
            let v = ranges(&cap(bad));
            assert_eq!(fields(&v), ["model.moe_dropped_fraction"], "{bad}");
        }
        // Without a capacity nothing is dropped: the error names both fields.
        let v = ranges(&with(|c| c.model.moe_dropped_fraction = Some(0.5)));
        assert_eq!(fields(&v), ["model.moe_dropped_fraction"]);
        assert!(
            v[0].rule.contains("model.moe_capacity_factor"),
            "{}",
            v[0].rule
        );
    }

    #[test]
    fn huge_sizes_are_bounded() {
        let v = upper(&with(|c| c.model.num_layers = 10_001));
        assert_eq!(fields(&v), ["model.num_layers"]);
        let v = upper(&with(|c| {
            c.training.seq_length = 1 << 20;
            c.training.micro_batch_size = 1 << 13;
        }));
        assert_eq!(fields(&v), ["training.micro_batch_size"]);
    }

    #[test]
    fn a_quadrillion_parameters_is_too_many() {
        let v = model_size(&with(|c| {
            c.model.num_layers = 10_000;
            c.model.hidden_size = 1 << 18;
        }));
        assert_eq!(fields(&v), ["model"]);
        assert!(model_size(&Config::default()).is_empty());
    }

    /// Issue 18: both were accepted and divided by later.
    #[test]
    fn zero_kv_channels_and_bucket_size_are_named() {
        let v = sizes(&with(|c| {
            c.model.kv_channels = Some(0);
            c.parallel.ddp_bucket_size = Some(0);
        }));
        assert_eq!(
            fields(&v),
            ["model.kv_channels", "parallel.ddp_bucket_size"]
        );
    }

    /// Each degree at most the GPU count's bound, and pp x vpp at most 2^16 virtual stages:
    /// named before the other rules form products of them.
    #[test]
    fn degrees_and_virtual_stages_are_bounded() {
        let v = upper(&with(|c| {
            c.parallel.pp = 1 << 31;
            c.parallel.vpp = 2;
            c.parallel.dp = Some(u32::MAX);
            c.parallel.first_stage_layers = Some(10_001);
        }));
        assert_eq!(
            fields(&v),
            [
                "parallel.pp",
                "parallel.dp",
                "parallel.first_stage_layers",
                "parallel.vpp"
            ]
        );
        assert!(
            v[3].rule.contains("2147483648 x 2 = 4294967296"),
            "{}",
            v[3].rule
        );
        // At the bounds: 2^24 GPUs of one degree, 2^16 virtual stages.
        let v = upper(&with(|c| {
            c.parallel.tp = 1 << 24;
            c.parallel.pp = 1 << 6;
            c.parallel.vpp = 1 << 10;
        }));
        assert!(v.is_empty(), "{v:?}");
    }

    /// One micro batch's widest tensor: 2^20 tokens x a 2^20 vocabulary = 2^40 elements is
    /// the most accepted; twice the tokens is refused, naming the widest field.
    #[test]
    fn the_widest_tensor_is_bounded() {
        let at = |seq: u64| {
            model_size(&with(|c| {
                c.model.vocab_size = 1 << 20;
                c.training.seq_length = seq;
            }))
        };
        assert!(at(1 << 20).is_empty());
        let v = at(1 << 21);
        assert_eq!(fields(&v), ["training.micro_batch_size"]);
        assert!(v[0].rule.contains("model.vocab_size"), "{}", v[0].rule);
        // Megatron's largest published runs are far inside: Llama 3 405B at 131072 tokens.
        let v = model_size(&with(|c| {
            c.model.vocab_size = 128_256;
            c.model.ffn_hidden_size = 53_248;
            c.training.seq_length = 131_072;
        }));
        assert!(v.is_empty(), "{v:?}");
    }
}
