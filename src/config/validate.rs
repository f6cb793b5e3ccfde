//! Validation: every rule a configuration must satisfy, checked before anything is computed.
//! All violations are collected, so a user sees every problem at once.

use super::resolve::{PipelinePlacement, Resolved};
use super::{
    Config, ConfigError, CpComm, GpuProfile, Precision, ScheduleKind, TrainingMode, Violation,
};

/// Divisors of `n` in increasing order (for hints).
pub fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n % d == 0).collect()
}

fn fmt_list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// Checks `config` and derives DP, microbatches and the layer placement.
pub fn resolve(mut config: Config, gpu: GpuProfile) -> Result<Resolved, ConfigError> {
    let mut errs: Vec<Violation> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let m = &config.model;
    let c = &config.cluster;
    let p = &config.parallel;
    let t = &config.training;

    // Sizes that must be positive.
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
        ("cluster.gpus_per_node", c.gpus_per_node as u64),
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
    ] {
        if !(v.is_finite() && v >= 0.0) {
            errs.push(
                Violation::new(field, format!("must be a finite number >= 0, got {v}")).hint(what),
            );
        }
    }
    // Upper bounds far beyond any real run, so that every byte and FLOP count fits in 64 bits.
    let at_most: [(&str, u64, u64); 19] = [
        ("model.num_layers", m.num_layers as u64, 10_000),
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
        ("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size, 1 << 22),
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
        ("cluster.num_gpus", c.num_gpus as u64, 1 << 24),
        ("cluster.gpus_per_node", c.gpus_per_node as u64, 1 << 12),
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
    for (field, v, max) in at_most {
        if v > max {
            errs.push(Violation::new(
                field,
                format!("must be at most {max}, got {v}"),
            ));
        }
    }
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
    if errs.is_empty() {
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
    }
    if !errs.is_empty() {
        return Err(ConfigError::Invalid(errs));
    }

    // Architecture.
    let heads = m.num_attention_heads as u64;
    let groups = m.num_query_groups as u64;
    if heads % groups != 0 {
        errs.push(
            Violation::new(
                "model.num_query_groups",
                format!("num_attention_heads ({heads}) must be divisible by num_query_groups ({groups})"),
            )
            .hint(format!("use one of {}", fmt_list(&divisors(heads)))),
        );
    }
    if m.mla.is_none() && m.kv_channels.is_none() && m.hidden_size % heads != 0 {
        errs.push(
            Violation::new(
                "model.hidden_size",
                format!(
                    "must be divisible by num_attention_heads ({heads}), got {}",
                    m.hidden_size
                ),
            )
            .hint("or set model.kv_channels (the head dimension) explicitly"),
        );
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
        if m.moe_first_k_dense > m.num_layers {
            errs.push(Violation::new(
                "model.moe_first_k_dense",
                format!(
                    "must be at most num_layers ({}), got {}",
                    m.num_layers, m.moe_first_k_dense
                ),
            ));
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
    if let Some(mla) = &m.mla {
        if mla.kv_lora_rank == 0
            || mla.qk_nope_head_dim + mla.qk_rope_head_dim == 0
            || mla.v_head_dim == 0
        {
            errs.push(Violation::new(
                "model.mla",
                "kv_lora_rank, qk head dims and v_head_dim must be positive",
            ));
        }
    }

    // Parallel degrees and the world size.
    let model_parallel = p.tp as u64 * p.cp as u64 * p.pp as u64;
    let world = c.num_gpus as u64;
    let mut dp = 0u64;
    if world % model_parallel != 0 {
        errs.push(
            Violation::new(
                "cluster.num_gpus",
                format!(
                    "world size {world} must be divisible by tp x cp x pp = {} x {} x {} = {model_parallel}",
                    p.tp, p.cp, p.pp
                ),
            )
            .hint(format!("use a multiple of {model_parallel} GPUs, or change tp/cp/pp")),
        );
    } else {
        dp = world / model_parallel;
        if let Some(given) = p.dp {
            if given as u64 != dp {
                errs.push(
                    Violation::new(
                        "parallel.dp",
                        format!(
                            "dp = {given} but num_gpus / (tp x cp x pp) = {world} / {model_parallel} = {dp}"
                        ),
                    )
                    .hint(format!(
                        "leave dp out to derive it, or set cluster.num_gpus = {}",
                        model_parallel * given as u64
                    )),
                );
            }
        }
    }
    if p.tp > c.gpus_per_node {
        warnings.push(format!(
            "parallel.tp = {} exceeds cluster.gpus_per_node = {}: tensor parallelism crosses nodes",
            p.tp, c.gpus_per_node
        ));
    }
    if heads % p.tp as u64 != 0 {
        errs.push(
            Violation::new(
                "parallel.tp",
                format!(
                    "num_attention_heads ({heads}) must be divisible by tp ({})",
                    p.tp
                ),
            )
            .hint(format!("use tp in {{{}}}", fmt_list(&divisors(heads)))),
        );
    }
    if m.mla.is_none() && groups % p.tp as u64 != 0 {
        errs.push(
            Violation::new(
                "parallel.tp",
                format!(
                    "num_query_groups (KV heads, {groups}) must be divisible by tp ({})",
                    p.tp
                ),
            )
            .hint(format!("use tp in {{{}}}", fmt_list(&divisors(groups)))),
        );
    }
    if p.cp_comm == CpComm::A2a && p.cp > 1 && heads % p.tp as u64 == 0 {
        let heads_rank = heads / p.tp as u64;
        let groups_rank = groups / p.tp as u64;
        if heads_rank % p.cp as u64 != 0 || (m.mla.is_none() && groups_rank % p.cp as u64 != 0) {
            errs.push(
                Violation::new(
                    "parallel.cp",
                    format!(
                        "Ulysses (cp_comm = a2a) needs the heads ({heads_rank}) and KV heads ({groups_rank}) per TP rank divisible by cp ({})",
                        p.cp
                    ),
                )
                .hint("use cp_comm = p2p, zigzag or allgather, or a cp that divides the KV heads per TP rank"),
            );
        }
    }
    if p.cp > 1 && !t.flash_attention {
        errs.push(
            Violation::new(
                "training.flash_attention",
                "context parallelism (cp > 1) runs on fused attention",
            )
            .hint("set training.flash_attention = true or parallel.cp = 1"),
        );
    }
    // Zigzag and all-gather CP cut the sequence into 2 cp chunks (the load-balanced layout).
    let balanced = matches!(p.cp_comm, CpComm::Zigzag | CpComm::Allgather);
    let seq_div = p.cp as u64 * if balanced { 2 } else { 1 };
    if t.seq_length % seq_div != 0 {
        errs.push(Violation::new(
            "training.seq_length",
            format!(
                "must be divisible by {} (cp{}), got {}",
                seq_div,
                if balanced {
                    " x 2 for the load-balanced layout of zigzag and allgather"
                } else {
                    ""
                },
                t.seq_length
            ),
        ));
    }
    let sp_active = p.sp && p.tp > 1;
    if p.sp && p.tp == 1 {
        warnings.push(
            "parallel.sp ignored: sequence parallelism needs tp > 1 (turned off, as Megatron does)"
                .into(),
        );
    }
    if sp_active && (t.seq_length / p.cp.max(1) as u64) % p.tp as u64 != 0 {
        errs.push(Violation::new(
            "training.seq_length",
            format!(
                "with sequence parallelism seq_length / cp must be divisible by tp ({}), got {}",
                p.tp, t.seq_length
            ),
        ));
    }
    if m.is_moe() && p.tp > 1 && !p.sp {
        errs.push(
            Violation::new(
                "parallel.sp",
                "MoE layers with tp > 1 need sequence parallelism (as Megatron-Core requires)",
            )
            .hint("set parallel.sp = true"),
        );
    }
    if dp > 0 && p.ep > 1 {
        if dp % p.ep as u64 != 0 {
            errs.push(
                Violation::new("parallel.ep", format!("ep ({}) must divide dp ({dp}): expert parallelism folds into data parallelism", p.ep))
                    .hint(format!("use ep in {{{}}}", fmt_list(&divisors(dp)))),
            );
        }
        if m.num_experts % p.ep != 0 {
            errs.push(Violation::new(
                "parallel.ep",
                format!(
                    "num_experts ({}) must be divisible by ep ({})",
                    m.num_experts, p.ep
                ),
            ));
        }
    }
    let etp = p.etp() as u64;
    if dp > 0 && (p.tp as u64 * p.cp as u64 * dp) % (etp * p.ep as u64) != 0 {
        errs.push(Violation::new(
            "parallel.expert_tp",
            format!(
                "expert_tp x ep ({etp} x {}) must divide tp x cp x dp ({})",
                p.ep,
                p.tp as u64 * p.cp as u64 * dp
            ),
        ));
    }
    if p.zero > 3 {
        errs.push(Violation::new(
            "parallel.zero",
            format!("ZeRO stage must be 0, 1, 2 or 3, got {}", p.zero),
        ));
    }
    if let Err(msg) = check_order(&p.order) {
        errs.push(
            Violation::new("parallel.order", msg)
                .hint("e.g. tp-cp-ep-dp-pp (Megatron's order, fastest first)"),
        );
    }

    // Schedules and virtual stages.
    match p.schedule {
        ScheduleKind::Interleaved1F1B => {
            if p.pp < 2 {
                errs.push(
                    Violation::new("parallel.schedule", "interleaved-1f1b needs pp >= 2")
                        .hint("use 1f1b, or raise parallel.pp"),
                );
            }
            if p.vpp < 2 {
                errs.push(
                    Violation::new(
                        "parallel.vpp",
                        format!(
                            "interleaved-1f1b needs vpp >= 2 model chunks per rank, got {}",
                            p.vpp
                        ),
                    )
                    .hint("with vpp = 1 use schedule = 1f1b"),
                );
            }
        }
        ScheduleKind::ZbV | ScheduleKind::DualPipeV => {
            if p.vpp != 2 {
                errs.push(
                    Violation::new(
                        "parallel.vpp",
                        format!("{} places exactly 2 chunks per rank in a V shape: vpp must be 2, got {}", p.schedule, p.vpp),
                    )
                    .hint("set parallel.vpp = 2"),
                );
            }
        }
        _ => {
            if p.vpp != 1 {
                errs.push(
                    Violation::new(
                        "parallel.vpp",
                        format!(
                            "{} runs one model chunk per rank: vpp must be 1, got {}",
                            p.schedule, p.vpp
                        ),
                    )
                    .hint("use schedule = interleaved-1f1b for virtual stages"),
                );
            }
        }
    }

    // Layer split over pipeline ranks.
    let mut per_rank_layers: Vec<u32> = Vec::new();
    if p.pp >= 1 && p.vpp >= 1 {
        match split_layers(
            m.num_layers,
            p.pp,
            p.vpp,
            p.first_stage_layers,
            p.last_stage_layers,
        ) {
            Ok(v) => per_rank_layers = v,
            Err(v) => errs.push(v),
        }
    }

    // Batch.
    let mut microbatches = 0u64;
    if dp > 0 {
        let per_step = t.micro_batch_size * dp;
        if t.global_batch_size % per_step != 0 {
            errs.push(
                Violation::new(
                    "training.global_batch_size",
                    format!(
                        "must be divisible by micro_batch_size x dp = {} x {dp} = {per_step}, got {}",
                        t.micro_batch_size, t.global_batch_size
                    ),
                )
                .hint(format!(
                    "use {} or {}",
                    (t.global_batch_size / per_step).max(1) * per_step,
                    (t.global_batch_size / per_step + 1) * per_step
                )),
            );
        } else {
            microbatches = t.global_batch_size / per_step;
            if microbatches > u32::MAX as u64 {
                errs.push(Violation::new(
                    "training.global_batch_size",
                    "too many microbatches",
                ));
            }
        }
    }

    // Precision, positions, fine-tuning.
    if t.precision == Precision::Fp8 && gpu.peak_flops.fp8.is_none() {
        errs.push(
            Violation::new(
                "training.precision",
                format!("fp8 needs FP8 tensor cores, which {} lacks", gpu.name),
            )
            .hint("use bf16, or an H100/H200/B200/MI300X profile"),
        );
    }
    if m.position_embedding == super::PositionEmbedding::Learned
        && t.seq_length > m.max_position_embeddings
    {
        errs.push(Violation::new(
            "training.seq_length",
            format!(
                "{} exceeds model.max_position_embeddings ({}) of the learned position embedding",
                t.seq_length, m.max_position_embeddings
            ),
        ));
    } else if t.seq_length > m.max_position_embeddings {
        warnings.push(format!(
            "training.seq_length {} exceeds the model's max_position_embeddings {} (rotary positions extrapolate)",
            t.seq_length, m.max_position_embeddings
        ));
    }
    if t.mode == TrainingMode::Lora {
        if t.lora.rank == 0 {
            errs.push(Violation::new("training.lora.rank", "must be at least 1"));
        }
        if t.lora.targets.is_empty() {
            errs.push(Violation::new(
                "training.lora.targets",
                "name at least one projection (qkv, proj, fc1, fc2)",
            ));
        }
    }
    if !errs.is_empty() {
        return Err(ConfigError::Invalid(errs));
    }

    let placement = PipelinePlacement::new(p.pp, p.vpp, &per_rank_layers, p.schedule);
    config.parallel.sp = sp_active;
    config.parallel.dp = Some(dp as u32);
    Ok(Resolved {
        config,
        gpu,
        dp: dp as u32,
        microbatches: microbatches as u32,
        placement,
        warnings,
    })
}

/// The rank order must name tp, cp, ep, dp and pp once each.
fn check_order(order: &str) -> Result<(), String> {
    let mut names: Vec<&str> = order.split('-').collect();
    names.sort_unstable();
    if names == ["cp", "dp", "ep", "pp", "tp"] {
        Ok(())
    } else {
        Err(format!(
            "'{order}' must name tp, cp, ep, dp and pp once each, separated by '-'"
        ))
    }
}

/// Layers per pipeline rank: even, or with Megatron's explicit first/last stage counts.
fn split_layers(
    layers: u32,
    pp: u32,
    vpp: u32,
    first: Option<u32>,
    last: Option<u32>,
) -> Result<Vec<u32>, Violation> {
    if pp == 1 {
        if first.is_some() || last.is_some() {
            return Err(Violation::new(
                "parallel.first_stage_layers",
                "an uneven first/last stage needs pp > 1",
            ));
        }
        if layers % vpp != 0 {
            return Err(Violation::new(
                "model.num_layers",
                format!("{layers} layers do not split into vpp = {vpp} chunks"),
            ));
        }
        return Ok(vec![layers]);
    }
    let f = first.unwrap_or(0);
    let l = last.unwrap_or(0);
    let middle_ranks = pp - first.is_some() as u32 - last.is_some() as u32;
    if f + l > layers {
        return Err(Violation::new(
            "parallel.first_stage_layers",
            format!("first ({f}) + last ({l}) stage layers exceed num_layers ({layers})"),
        ));
    }
    for (field, n) in [
        ("parallel.first_stage_layers", first),
        ("parallel.last_stage_layers", last),
    ] {
        if let Some(n) = n {
            if n == 0 || n % vpp != 0 {
                return Err(Violation::new(
                    field,
                    format!("must be a positive multiple of vpp ({vpp}), got {n}"),
                ));
            }
        }
    }
    let rest = layers - f - l;
    if middle_ranks == 0 {
        if rest != 0 {
            return Err(Violation::new(
                "parallel.first_stage_layers",
                format!("with pp = 2 the first and last stage counts must add up to num_layers ({layers})"),
            ));
        }
    } else if rest % (middle_ranks * vpp) != 0 || rest == 0 {
        let chunks = middle_ranks * vpp;
        let mut v = Violation::new(
            "model.num_layers",
            if first.is_some() || last.is_some() {
                format!("the {rest} layers between the first and last stage do not split evenly into {middle_ranks} ranks x {vpp} chunks")
            } else {
                format!("{layers} layers do not split evenly into pp x vpp = {pp} x {vpp} = {chunks} chunks")
            },
        );
        if first.is_none() && last.is_none() && vpp == 1 {
            v = v.hint("set parallel.first_stage_layers / last_stage_layers for an uneven split (Megatron's --decoder-first-pipeline-num-layers)");
        }
        return Err(v);
    }
    let mid = rest.checked_div(middle_ranks).unwrap_or(0);
    Ok((0..pp)
        .map(|r| match (r, first, last) {
            (0, Some(f), _) => f,
            (r, _, Some(l)) if r == pp - 1 => l,
            _ => mid,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_split_puts_counts_on_first_and_last() {
        // Llama-3-405B's 126 layers over pp 16: Megatron recipes use first/last stage 7 + 14 x 8.
        let v = split_layers(126, 16, 1, Some(7), Some(7)).unwrap();
        assert_eq!(v.len(), 16);
        assert_eq!(v.iter().sum::<u32>(), 126);
        assert_eq!((v[0], v[1], v[15]), (7, 8, 7));
    }

    #[test]
    fn uneven_layers_without_override_is_an_error_with_a_hint() {
        let e = split_layers(126, 16, 1, None, None).unwrap_err();
        assert_eq!(e.field, "model.num_layers");
        assert!(e.hint.unwrap().contains("first_stage_layers"));
    }
}
