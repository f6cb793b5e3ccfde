//! Context and sequence parallelism: the sequence splits over CP (twice over for the
//! load-balanced layouts) and, with SP, over TP; Ulysses splits heads over CP (Jacobs et al.
//! 2023, "DeepSpeed Ulysses").

use super::super::{Config, CpComm, Violation};

/// Whether Ulysses' all-to-all can give each of `cp` ranks whole heads of a `tp` rank's share:
/// the heads (and, without MLA's shared latent, the KV heads) per TP rank divide by `cp`. The
/// search enumerates Ulysses only where this holds.
pub fn ulysses_splits_heads(cfg: &Config, tp: u32, cp: u32) -> bool {
    let m = &cfg.model;
    let (tp, cp) = (u64::from(tp.max(1)), u64::from(cp.max(1)));
    let heads_rank = m.num_attention_heads as u64 / tp;
    let groups_rank = m.num_query_groups as u64 / tp;
    heads_rank % cp == 0 && (m.mla.is_some() || groups_rank % cp == 0)
}

/// Ulysses needs the heads per TP rank divisible by CP; CP runs on fused attention; the
/// sequence splits into CP chunks (2 CP for zigzag and all-gather).
pub fn context_parallel(cfg: &Config) -> Vec<Violation> {
    let (m, p, t) = (&cfg.model, &cfg.parallel, &cfg.training);
    let heads = m.num_attention_heads as u64;
    let groups = m.num_query_groups as u64;
    let mut errs = Vec::new();
    if p.cp_comm == CpComm::A2a && p.cp > 1 && heads % p.tp as u64 == 0 {
        let heads_rank = heads / p.tp as u64;
        let groups_rank = groups / p.tp as u64;
        if !ulysses_splits_heads(cfg, p.tp, p.cp) {
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
    errs
}

/// With SP the CP shard of the sequence splits over TP; MoE with TP needs SP.
pub fn sequence_parallel(cfg: &Config) -> Vec<Violation> {
    let (m, p, t) = (&cfg.model, &cfg.parallel, &cfg.training);
    let mut errs = Vec::new();
    let sp_active = p.sp && p.tp > 1;
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
    errs
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn load_balanced_cp_needs_twice_cp_chunks() {
        let v = context_parallel(&with(|c| {
            c.parallel.cp = 2;
            c.parallel.cp_comm = CpComm::Zigzag;
            c.training.seq_length = 8190;
        }));
        assert_eq!(fields(&v), ["training.seq_length"]);
        assert!(context_parallel(&Config::default()).is_empty());
    }

    #[test]
    fn cp_runs_on_fused_attention() {
        let v = context_parallel(&with(|c| {
            c.parallel.cp = 2;
            c.training.flash_attention = false;
        }));
        assert_eq!(fields(&v), ["training.flash_attention"]);
    }

    #[test]
    fn ulysses_splits_the_heads_over_cp() {
        // 32 heads and 8 KV heads over tp 2: 4 KV heads per TP rank, not divisible by cp 8.
        let v = context_parallel(&with(|c| {
            c.parallel.cp = 8;
            c.parallel.cp_comm = CpComm::A2a;
        }));
        assert_eq!(fields(&v), ["parallel.cp"]);
    }

    #[test]
    fn sp_splits_the_sequence_over_tp() {
        let v = sequence_parallel(&with(|c| {
            c.parallel.tp = 8;
            c.training.seq_length = 8196;
        }));
        assert_eq!(fields(&v), ["training.seq_length"]);
        let v = sequence_parallel(&with(|c| {
            c.model.num_experts = 8;
            c.parallel.sp = false;
        }));
        assert_eq!(fields(&v), ["parallel.sp"]);
    }
}
