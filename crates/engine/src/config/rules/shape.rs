//! The model's shape: heads, KV groups and head dimension agree; MLA's ranks are positive.

use super::super::{Config, Violation};
use super::{divisors, fmt_list};

/// Heads split evenly into KV groups; without an explicit head dimension (or MLA) the hidden
/// size splits evenly into heads.
pub fn heads(cfg: &Config) -> Vec<Violation> {
    let m = &cfg.model;
    let heads = m.num_attention_heads as u64;
    let groups = m.num_query_groups as u64;
    let mut errs = Vec::new();
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
    errs
}

/// MLA's latent rank and head dimensions are positive (DeepSeek-V2).
pub fn mla(cfg: &Config) -> Vec<Violation> {
    let m = &cfg.model;
    let mut errs = Vec::new();
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
    errs
}

/// Sliding windows fit the sequence, and the layer patterns fit the layers: a window larger
/// than `training.seq_length` is refused rather than read as full attention, a pattern of
/// another length rather than cut or repeated. (A chunk longer than the sequence is Llama 4
/// trained at a short context: one chunk, full causal attention, as the ledger counts it.)
pub fn layer_patterns(cfg: &Config) -> Vec<Violation> {
    let (m, seq) = (&cfg.model, cfg.training.seq_length);
    let mut errs = Vec::new();
    match m.window_size {
        Some(0) => errs.push(Violation::new(
            "model.window_size",
            "must be at least 1 token, got 0",
        )),
        Some(w) if w > seq => errs.push(
            Violation::new(
                "model.window_size",
                format!("the sliding window ({w} tokens) is larger than the sequence (training.seq_length {seq})"),
            )
            .hint("remove it for full attention, or shorten it to the sequence at most"),
        ),
        _ => {}
    }
    if m.attention_chunk_size == Some(0) {
        errs.push(Violation::new(
            "model.attention_chunk_size",
            "must be at least 1 token, got 0",
        ));
    }
    if m.window_size.is_some() && m.attention_chunk_size.is_some() {
        errs.push(Violation::new(
            "model.attention_chunk_size",
            "a layer attends either in a sliding window or in chunks: set window_size or attention_chunk_size, not both",
        ));
    }
    if m.window_attn_skip_freq > 0 && m.window_size.is_none() && m.attention_chunk_size.is_none() {
        errs.push(Violation::new(
            "model.window_attn_skip_freq",
            "names the full-attention layers among windowed ones, but neither window_size nor attention_chunk_size is set",
        ));
    }
    let pattern = &m.moe_layer_pattern;
    if !pattern.is_empty() {
        if m.num_experts == 0 {
            errs.push(Violation::new(
                "model.moe_layer_pattern",
                "marks MoE layers, but num_experts is 0",
            ));
        }
        if pattern.len() != m.num_layers as usize {
            errs.push(Violation::new(
                "model.moe_layer_pattern",
                format!(
                    "lists {} layers, num_layers is {}",
                    pattern.len(),
                    m.num_layers
                ),
            ));
        }
        if let Some(x) = pattern.iter().find(|&&x| x > 1) {
            errs.push(Violation::new(
                "model.moe_layer_pattern",
                format!("entries are 1 (MoE) or 0 (dense), got {x}"),
            ));
        }
        if m.moe_first_k_dense > 0 {
            errs.push(Violation::new(
                "model.moe_first_k_dense",
                "is implied by moe_layer_pattern: set one of them",
            ));
        }
    }
    errs.extend(hybrid(cfg));
    if let Some(v) = m.activation_clamp.filter(|v| !(v.is_finite() && *v > 0.0)) {
        errs.push(Violation::new(
            "model.activation_clamp",
            format!("is the limit a gated activation's inputs are clamped to, a positive number; got {v}"),
        ));
    }
    if m.moe_router_linear_bias && m.num_experts == 0 {
        errs.push(Violation::new(
            "model.moe_router_linear_bias",
            "is a bias of the MoE router, but num_experts is 0",
        ));
    }
    errs
}

/// A hybrid pattern has one known character a layer; its Mamba-2 mixer is given and splits
/// over TP by whole heads and B/C groups; context parallelism over Mamba layers is refused
/// (its exchange is not modelled).
fn hybrid(cfg: &Config) -> Vec<Violation> {
    let m = &cfg.model;
    let mut errs = Vec::new();
    let Some(p) = &m.hybrid_layer_pattern else {
        if m.mamba.is_some() {
            errs.push(Violation::new(
                "model.mamba",
                "a Mamba-2 mixer needs model.hybrid_layer_pattern to place it",
            ));
        }
        return errs;
    };
    let field = "model.hybrid_layer_pattern";
    let len = p.chars().count();
    if len != m.num_layers as usize {
        errs.push(
            Violation::new(
                field,
                format!("has {len} layers, num_layers is {}", m.num_layers),
            )
            .hint("one character (M, *, -, E) a layer"),
        );
    }
    if let Some(c) = p.chars().find(|c| !matches!(c, 'M' | '*' | '-' | 'E')) {
        errs.push(Violation::new(
            field,
            format!("unknown layer '{c}' (M Mamba-2, * attention, - MLP, E MoE)"),
        ));
    }
    if p.contains('E') && m.num_experts == 0 {
        errs.push(Violation::new(
            field,
            "has MoE layers (E) but num_experts is 0",
        ));
    }
    if !p.contains('E') && m.num_experts > 0 {
        errs.push(Violation::new(
            field,
            "has no MoE layer (E) but num_experts is set",
        ));
    }
    if p.contains('M') {
        match &m.mamba {
            None => errs.push(Violation::new(
                "model.mamba",
                "the pattern has Mamba-2 layers (M): give num_heads, head_dim, state_dim, num_groups",
            )),
            Some(mc) => {
                let tp = cfg.parallel.tp.max(1);
                if mc.num_heads == 0 || mc.num_groups == 0 || mc.head_dim == 0 || mc.state_dim == 0 {
                    errs.push(Violation::new(
                        "model.mamba",
                        "num_heads, head_dim, state_dim and num_groups must be positive",
                    ));
                } else if mc.num_heads % mc.num_groups != 0 {
                    errs.push(Violation::new(
                        "model.mamba.num_groups",
                        format!("must divide num_heads ({})", mc.num_heads),
                    ));
                } else if mc.num_groups % tp != 0 {
                    errs.push(Violation::new(
                        "model.mamba.num_groups",
                        format!(
                            "tensor parallelism splits whole B/C groups: {} groups over tp {tp}",
                            mc.num_groups
                        ),
                    ));
                }
                if cfg.parallel.cp > 1 {
                    errs.push(Violation::new(
                        "parallel.cp",
                        "context parallelism over Mamba-2 layers is not modelled",
                    ));
                }
            }
        }
    }
    if !m.moe_layer_pattern.is_empty() || m.moe_first_k_dense > 0 {
        errs.push(Violation::new(
            field,
            "places the MoE layers itself: moe_layer_pattern and moe_first_k_dense must be unset",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn kv_groups_divide_the_heads() {
        let v = heads(&with(|c| c.model.num_query_groups = 5));
        assert_eq!(fields(&v), ["model.num_query_groups"]);
        assert!(heads(&Config::default()).is_empty());
    }

    #[test]
    fn hidden_size_splits_into_heads_unless_the_head_dim_is_given() {
        let v = heads(&with(|c| c.model.hidden_size = 4100));
        assert_eq!(fields(&v), ["model.hidden_size"]);
        assert!(heads(&with(|c| {
            c.model.hidden_size = 4100;
            c.model.kv_channels = Some(128);
        }))
        .is_empty());
    }

    #[test]
    fn mla_ranks_are_positive() {
        assert!(mla(&Config::default()).is_empty());
        let v = mla(&with(|c| {
            c.model.mla = Some(super::super::super::MlaConfig {
                q_lora_rank: 1536,
                kv_lora_rank: 0,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
            })
        }));
        assert_eq!(fields(&v), ["model.mla"]);
    }
}
