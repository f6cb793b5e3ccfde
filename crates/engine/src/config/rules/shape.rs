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
