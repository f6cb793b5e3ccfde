//! Parallel degrees: the world splits into TP x CP x PP x DP, TP divides the heads, and the
//! ZeRO stage and rank order are known.

use super::super::{Config, Framework, Fsdp, Violation};
use super::{divisors, fmt_list};

/// The world size is a multiple of TP x CP x PP, and a given DP is the quotient.
pub fn world(cfg: &Config) -> Vec<Violation> {
    let (c, p) = (&cfg.cluster, &cfg.parallel);
    let mut errs = Vec::new();
    let model_parallel = super::model_parallel(p);
    let world = u128::from(c.num_gpus);
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
        let dp = world / model_parallel;
        if let Some(given) = p.dp {
            if u128::from(given) != dp {
                errs.push(
                    Violation::new(
                        "parallel.dp",
                        format!(
                            "dp = {given} but num_gpus / (tp x cp x pp) = {world} / {model_parallel} = {dp}"
                        ),
                    )
                    .hint(format!(
                        "leave dp out to derive it, or set cluster.num_gpus = {}",
                        model_parallel * u128::from(given)
                    )),
                );
            }
        }
    }
    errs
}

/// TP divides the attention heads and (without MLA) the KV heads.
pub fn tensor(cfg: &Config) -> Vec<Violation> {
    let (m, p) = (&cfg.model, &cfg.parallel);
    let heads = m.num_attention_heads as u64;
    let groups = m.num_query_groups as u64;
    let mut errs = Vec::new();
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
    errs
}

/// ZeRO stage 0-3 (3 under torch FSDP2), FSDP outside DeepSpeed; the rank order names each
/// axis once.
pub fn options(cfg: &Config) -> Vec<Violation> {
    let p = &cfg.parallel;
    let mut errs = Vec::new();
    if p.zero > 3 {
        errs.push(Violation::new(
            "parallel.zero",
            format!("ZeRO stage must be 0, 1, 2 or 3, got {}", p.zero),
        ));
    }
    match p.fsdp {
        Some(Fsdp::Torch) if p.zero != 3 => errs.push(
            Violation::new(
                "parallel.zero",
                format!(
                    "torch FSDP2 (parallel.fsdp = \"torch\") shards parameters, gradients and optimizer states: zero must be 3, got {}",
                    p.zero
                ),
            )
            .hint("set zero = 3, or fsdp = \"megatron\" for Megatron-FSDP's optim / optim_grads strategies (zero 1, 2)"),
        ),
        Some(f) if cfg.training.framework == Framework::Deepspeed => errs.push(
            Violation::new(
                "parallel.fsdp",
                format!(
                    "\"{}\" FSDP does not run under training.framework = \"deepspeed\" (DeepSpeed shards with its own ZeRO)",
                    f.name()
                ),
            )
            .hint("leave fsdp out for DeepSpeed's ZeRO, or set framework = \"megatron-core\" or \"fsdp\""),
        ),
        _ => {}
    }
    errs.extend(deepspeed_zero3(cfg));
    if let Err(msg) = check_order(&p.order) {
        errs.push(
            Violation::new("parallel.order", msg)
                .hint("e.g. tp-cp-ep-dp-pp (Megatron's order, fastest first)"),
        );
    }
    errs
}

/// DeepSpeed's ZeRO-3 settings (`zero3_prefetch_bucket_size`,
/// `zero3_param_persistence_threshold`, `zero3_max_live_parameters`) shape DeepSpeed's ZeRO-3
/// calls only (src/dp_calls.rs): set elsewhere they would change nothing, so they are refused.
fn deepspeed_zero3(cfg: &Config) -> Vec<Violation> {
    let p = &cfg.parallel;
    let deepspeed = cfg.training.framework == Framework::Deepspeed;
    let settings = [
        ("zero3_prefetch_bucket_size", p.zero3_prefetch_bucket_size),
        (
            "zero3_param_persistence_threshold",
            p.zero3_param_persistence_threshold,
        ),
        ("zero3_max_live_parameters", p.zero3_max_live_parameters),
    ];
    let mut errs = Vec::new();
    for (name, v) in settings {
        if v.is_none() || (deepspeed && p.zero == 3) {
            continue;
        }
        let why = if deepspeed {
            format!("DeepSpeed's ZeRO-3 setting: zero must be 3, got {}", p.zero)
        } else {
            format!(
                "DeepSpeed's ZeRO-3 setting: training.framework must be \"deepspeed\", got \"{}\"",
                cfg.training.framework.name()
            )
        };
        errs.push(
            Violation::new(format!("parallel.{name}"), why)
                .hint("leave it out, or set framework = \"deepspeed\" and zero = 3"),
        );
    }
    errs
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

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn the_world_splits_into_the_degrees() {
        assert!(world(&Config::default()).is_empty());
        let v = world(&with(|c| c.cluster.num_gpus = 7));
        assert_eq!(fields(&v), ["cluster.num_gpus"]);
        let v = world(&with(|c| c.parallel.dp = Some(2)));
        assert_eq!(fields(&v), ["parallel.dp"]);
    }

    #[test]
    fn tp_divides_heads_and_kv_heads() {
        let v = tensor(&with(|c| {
            c.parallel.tp = 16;
            c.cluster.num_gpus = 16;
        }));
        assert_eq!(fields(&v), ["parallel.tp"]);
        assert!(v[0].rule.contains("num_query_groups"));
    }

    #[test]
    fn zero_stage_and_order_are_known() {
        let v = options(&with(|c| {
            c.parallel.zero = 4;
            c.parallel.order = "tp-dp-pp".into();
        }));
        assert_eq!(fields(&v), ["parallel.zero", "parallel.order"]);
        // torch FSDP2 is ZeRO-3; FSDP does not run under DeepSpeed.
        let v = options(&with(|c| {
            c.parallel.fsdp = Some(Fsdp::Torch);
            c.parallel.zero = 2;
        }));
        assert_eq!(fields(&v), ["parallel.zero"]);
        assert!(v[0].rule.contains("zero must be 3"), "{}", v[0].rule);
        let v = options(&with(|c| {
            c.parallel.fsdp = Some(Fsdp::Megatron);
            c.training.framework = Framework::Deepspeed;
        }));
        assert_eq!(fields(&v), ["parallel.fsdp"]);
        for zero in 0..=3 {
            let v = options(&with(|c| {
                c.parallel.fsdp = Some(Fsdp::Megatron);
                c.parallel.zero = zero;
            }));
            assert!(v.is_empty(), "megatron zero {zero}");
        }
        assert!(check_order("pp-dp-ep-cp-tp").is_ok());
        // DeepSpeed's ZeRO-3 settings only under DeepSpeed at ZeRO-3.
        let v = options(&with(|c| {
            c.parallel.zero3_prefetch_bucket_size = Some(1);
            c.parallel.zero = 3;
        }));
        assert_eq!(fields(&v), ["parallel.zero3_prefetch_bucket_size"]);
        let v = options(&with(|c| {
            c.parallel.zero3_max_live_parameters = Some(1);
            c.training.framework = Framework::Deepspeed;
        }));
        assert_eq!(fields(&v), ["parallel.zero3_max_live_parameters"]);
        assert!(v[0].rule.contains("zero must be 3"), "{}", v[0].rule);
    }

    /// tp x cp x pp of three 32-bit degrees overflowed u64; in u128 it is exact, so the
    /// world rule names the product (here 2^96 - ...) and no dp is derived.
    #[test]
    fn three_extreme_degrees_do_not_overflow() {
        let c = with(|c| {
            c.parallel.tp = u32::MAX;
            c.parallel.cp = u32::MAX;
            c.parallel.pp = u32::MAX;
        });
        assert_eq!(super::super::data_parallel(&c), None);
        let v = world(&c);
        assert_eq!(fields(&v), ["cluster.num_gpus"]);
        let product = u128::from(u32::MAX).pow(3);
        assert!(v[0].rule.contains(&product.to_string()), "{}", v[0].rule);
    }
}
