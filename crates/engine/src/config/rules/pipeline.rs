//! Pipeline: the schedule's virtual stages, and the split of the layers over pipeline ranks
//! (even, or with Megatron's explicit first/last stage counts).

use super::super::{Config, ScheduleKind, Violation};
use super::pipeline_layout;

/// Interleaved 1F1B needs pp >= 2 and vpp >= 2; V-shaped schedules exactly 2 chunks per rank;
/// the others one.
pub fn schedule(cfg: &Config) -> Vec<Violation> {
    let p = &cfg.parallel;
    let mut errs = Vec::new();
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
    errs
}

/// The layers split over pipeline ranks and their chunks ([`stage_layer_counts`]).
pub fn layer_split(cfg: &Config) -> Vec<Violation> {
    let p = &cfg.parallel;
    let mut errs = Vec::new();
    if p.pp >= 1 && p.vpp >= 1 {
        if let Err(v) = stage_layer_counts(cfg) {
            errs.push(v);
        }
    }
    errs
}

/// Decoder layers of each global stage 0..pp x vpp, in layer order: from the explicit
/// pipeline layout, from the embedding/loss slots, or from the per-rank split
/// ([`split_layers`]) placed as [`crate::config::PipelinePlacement`] places stages.
pub fn stage_layer_counts(cfg: &Config) -> Result<Vec<u32>, Violation> {
    let (m, p) = (&cfg.model, &cfg.parallel);
    let accounted =
        p.account_for_embedding_in_pipeline_split || p.account_for_loss_in_pipeline_split;
    let first_last = p.first_stage_layers.is_some() || p.last_stage_layers.is_some();
    if let Some(layout) = &p.pipeline_layout {
        if accounted || first_last {
            return Err(Violation::new(
                "parallel.pipeline_layout",
                "an explicit layout excludes first_stage_layers, last_stage_layers and the account_for_*_in_pipeline_split options (as in Megatron-Core)",
            ));
        }
        return pipeline_layout::stage_layers(layout, m.num_layers, m.mtp_num_layers, p.pp, p.vpp);
    }
    if accounted {
        if first_last {
            return Err(Violation::new(
                "parallel.account_for_embedding_in_pipeline_split",
                "the embedding/loss slots exclude first_stage_layers and last_stage_layers (as in Megatron-Core)",
            ));
        }
        return pipeline_layout::accounted_stage_layers(
            m.num_layers,
            p.pp,
            p.vpp,
            p.account_for_embedding_in_pipeline_split,
            p.account_for_loss_in_pipeline_split,
        );
    }
    let per_rank = split_layers(
        m.num_layers,
        p.pp,
        p.vpp,
        p.first_stage_layers,
        p.last_stage_layers,
    )?;
    Ok(
        crate::config::PipelinePlacement::stage_ranks(p.pp, p.vpp, p.schedule)
            .iter()
            .map(|&r| per_rank[r as usize] / p.vpp)
            .collect(),
    )
}

/// Layers per pipeline rank: even, or with Megatron's explicit first/last stage counts.
pub fn split_layers(
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
    // Sums and products of the counts in u64: each is a 32-bit field, so none wraps.
    let f = u64::from(first.unwrap_or(0));
    let l = u64::from(last.unwrap_or(0));
    let middle_ranks = u64::from(pp) - u64::from(first.is_some()) - u64::from(last.is_some());
    if f + l > u64::from(layers) {
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
    let rest = u64::from(layers) - f - l;
    let chunks = middle_ranks * u64::from(vpp);
    if middle_ranks == 0 {
        if rest != 0 {
            return Err(Violation::new(
                "parallel.first_stage_layers",
                format!("with pp = 2 the first and last stage counts must add up to num_layers ({layers})"),
            ));
        }
    } else if rest % chunks != 0 || rest == 0 {
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
    // At most num_layers, a u32.
    let mid = rest.checked_div(middle_ranks).unwrap_or(0) as u32;
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
    use super::super::test_support::{fields, with};
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

    #[test]
    fn schedules_fix_their_chunks_per_rank() {
        assert!(schedule(&Config::default()).is_empty());
        let v = schedule(&with(|c| c.parallel.vpp = 2));
        assert_eq!(fields(&v), ["parallel.vpp"]);
        let v = schedule(&with(|c| {
            c.parallel.schedule = ScheduleKind::Interleaved1F1B
        }));
        assert_eq!(fields(&v), ["parallel.schedule", "parallel.vpp"]);
        let v = schedule(&with(|c| {
            c.parallel.schedule = ScheduleKind::ZbV;
            c.parallel.pp = 2;
        }));
        assert_eq!(fields(&v), ["parallel.vpp"]);
    }

    #[test]
    fn layers_split_over_the_pipeline() {
        assert!(layer_split(&Config::default()).is_empty());
        let v = layer_split(&with(|c| c.parallel.pp = 3));
        assert_eq!(fields(&v), ["model.num_layers"]);
    }

    /// The reported `--pp 2147483648 --vpp 2`: (pp - 2) x vpp wrapped to 0 in u32 (and
    /// first + last wrapped too), then the split divided by it. Called past the size rules,
    /// the split answers with a violation for every 32-bit count.
    #[test]
    fn extreme_counts_split_to_a_violation_not_a_wrap() {
        for (pp, vpp, first, last) in [
            (1 << 31, 2, None, None),
            (1 << 31, 2, Some(2), Some(2)),
            (u32::MAX, u32::MAX, Some(u32::MAX), None),
            (4, 1, Some(u32::MAX), Some(1)),
            (3, 1 << 31, Some(1 << 31), Some(1 << 31)),
        ] {
            let e = split_layers(32, pp, vpp, first, last).unwrap_err();
            assert!(
                [
                    "model.num_layers",
                    "parallel.first_stage_layers",
                    "parallel.last_stage_layers"
                ]
                .contains(&e.field.as_str()),
                "{pp} {vpp} {first:?} {last:?}: {e}"
            );
        }
    }
}
