//! The step broken into named terms that add up to it: compute, exposed collectives by
//! group, the pipeline bubble split into warm-up/cool-down, stage imbalance and send/receive
//! waits, the DP tail and the optimizer. One function ([`terms`]) feeds the CLI table, the
//! GUI cards and the verdict, so they show the same numbers.

use crate::config::ScheduleKind;
use crate::model::{ChunkContents, CommKind};
use crate::schedule::{
    base_microbatches, closed_form, simulate_extrapolated, simulate_summary, CheckedProgram, Costs,
    GeneratedProgram, PipelineSummary, ScheduleError,
};
use crate::time::{StageImbalance, StepTime};

/// The critical rank's pipeline idle time, split by cause (seconds; the three add up to it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IdleSplit {
    pub warmup_cooldown_s: f64,
    pub imbalance_s: f64,
    pub pp_wait_s: f64,
}

/// The pipeline shape a split is made for.
#[derive(Debug, Clone, Copy)]
pub struct Pipe {
    pub kind: ScheduleKind,
    pub pp: u32,
    pub vpp: u32,
    pub microbatches: u32,
}

/// `costs` with free pipeline hops (no latency, no transfer): the run whose idle time, taken
/// from the real one's, leaves the send and receive waits.
pub fn free_hops(costs: &Costs) -> Costs {
    let mut free = costs.clone();
    free.p2p_latency = 0.0;
    free.hop_transfer.iter_mut().for_each(|h| *h = 0.0);
    free
}

/// Rank `crit`'s idle time (its finish less its busy time) under `balanced` costs (equal
/// stages, free hops) where a closed form gives it: for GPipe and 1F1B with m >= p, every rank
/// idles (p-1)(F+B) up to the makespan (the DualPipe README's table; Narayanan et al. 2021,
/// §2.2.1), of which rank r spends the last r B after its final backward, since the final
/// backwards run from rank p-1 down to rank 0 one after another. The unit test checks it
/// against the simulator on every rank. None where the simulator must run.
fn balanced_idle_closed_form(pipe: Pipe, balanced: &Costs, crit: usize) -> Option<f64> {
    let simple = matches!(pipe.kind, ScheduleKind::Gpipe | ScheduleKind::OneFOneB);
    if !simple || pipe.vpp != 1 || pipe.microbatches < pipe.pp || balanced.forward.is_empty() {
        return None;
    }
    let (f, b) = (balanced.forward[0], balanced.backward[0]);
    Some(closed_form::bubble_1f1b(pipe.pp, f, b) - crit as f64 * b)
}

/// Splits rank `crit`'s idle time in `sim` (simulated with `costs`) by two more simulations:
/// free hops (what is left is warm-up/cool-down plus imbalance; the difference is the send and
/// receive waits), and every stage at the mean stage's cost with free hops (the schedule's
/// own warm-up/cool-down, e.g. (p-1)(F+B) for 1F1B, Narayanan et al. 2021). `program`, the
/// whole schedule when the caller generated it, is simulated instead of extrapolating; the
/// balanced run's idle time stops growing once the pipeline is in steady state, so it is
/// simulated over the shortest such run. `free_run`, when the caller already played the
/// schedule with [`free_hops`] of `costs`, is used instead of playing it again.
pub fn split_idle(
    pipe: Pipe,
    costs: &Costs,
    sim: &PipelineSummary,
    crit: usize,
    program: Option<CheckedProgram>,
    free_run: Option<&PipelineSummary>,
) -> Result<IdleSplit, ScheduleError> {
    let idle = (sim.finish[crit] - sim.busy[crit]).max(0.0);
    if pipe.pp <= 1 || idle == 0.0 {
        return Ok(IdleSplit {
            warmup_cooldown_s: idle,
            ..IdleSplit::default()
        });
    }
    let idle_of = |s: &PipelineSummary| (s.finish[crit] - s.busy[crit]).max(0.0);
    let run = |c: &Costs| -> Result<PipelineSummary, ScheduleError> {
        match program {
            Some(p) => simulate_summary(p, c),
            None => simulate_extrapolated(pipe.kind, pipe.pp, pipe.vpp, pipe.microbatches, c),
        }
    };
    let free = free_hops(costs);
    let idle_free = match free_run {
        _ if free == *costs => idle,
        Some(f) => idle_of(f),
        None => idle_of(&run(&free)?),
    };
    let mut balanced = free;
    for v in [
        &mut balanced.forward,
        &mut balanced.input_grad,
        &mut balanced.weight_grad,
    ] {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        v.iter_mut().for_each(|x| *x = mean);
    }
    for i in 0..balanced.backward.len() {
        balanced.backward[i] = balanced.input_grad[i] + balanced.weight_grad[i];
    }
    let warm = match balanced_idle_closed_form(pipe, &balanced, crit) {
        Some(w) => w,
        None => {
            let short =
                pipe.microbatches
                    .min(base_microbatches(pipe.kind, pipe.pp, pipe.microbatches));
            match program {
                Some(p) if short == pipe.microbatches => idle_of(&simulate_summary(p, &balanced)?),
                _ => {
                    let p = GeneratedProgram::of(pipe.kind, pipe.pp, pipe.vpp, short)?;
                    idle_of(&simulate_summary(p.checked(), &balanced)?)
                }
            }
        }
    };
    // Each cause takes what the simulations attribute to it, in this order, so that the
    // three add up to the idle time exactly.
    let pp_wait_s = (idle - idle_free).max(0.0);
    let warmup_cooldown_s = warm.min(idle - pp_wait_s);
    Ok(IdleSplit {
        warmup_cooldown_s,
        imbalance_s: idle - pp_wait_s - warmup_cooldown_s,
        pp_wait_s,
    })
}

/// The slowest pipeline rank given each rank's chunks and busy time per microbatch.
pub fn slowest_stage(chunks: &[Vec<ChunkContents>], per_mb_s: &[f64]) -> Option<StageImbalance> {
    if chunks.len() < 2 {
        return None;
    }
    let (stage, &stage_s) =
        per_mb_s
            .iter()
            .enumerate()
            .fold((0, &f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
    let n = per_mb_s.len() as f64;
    let mean_stage_s = per_mb_s.iter().sum::<f64>() / n;
    let layers_of = |ch: &Vec<ChunkContents>| -> u32 { ch.iter().map(ChunkContents::layers).sum() };
    let mine = &chunks[stage];
    Some(StageImbalance {
        stage: stage as u32,
        stage_s,
        mean_stage_s,
        excess_fraction: stage_s / mean_stage_s.max(f64::MIN_POSITIVE) - 1.0,
        layers: layers_of(mine),
        mean_layers: chunks.iter().map(layers_of).sum::<u32>() as f64 / n,
        holds_embedding: mine.iter().any(|c| c.embedding),
        holds_output: mine.iter().any(|c| c.output),
    })
}

/// One named part of the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    /// The JSON key under `time` it comes from (`exposed_comm_by_group_s.tp`, ...).
    pub key: String,
    pub label: &'static str,
    /// What a step dominated by this term is bound by, e.g. "stage-imbalance".
    pub bound: &'static str,
    pub seconds: f64,
    /// Fraction of the step.
    pub share: f64,
    /// The communication kind whose exposed time it is.
    comm: Option<CommKind>,
}

/// The exposed communication of the kinds shown `during_step` (else after the optimizer), in
/// their breakdown order, as terms (key, label, bound, seconds, kind). DP's during the step
/// leaves out the DP tail, its own term.
fn comm_terms(t: &StepTime, during_step: bool) -> Vec<TermParts> {
    let mut kinds: Vec<CommKind> = CommKind::ALL
        .into_iter()
        .filter(|k| k.info().term.during_step == during_step)
        .collect();
    kinds.sort_by_key(|k| k.info().term.rank);
    kinds
        .into_iter()
        .map(|k| {
            let g = t.exposed_comm_by_group_s[k];
            let seconds = if k == CommKind::Dp {
                (g - t.dp_tail_s).max(0.0)
            } else {
                g
            };
            let term = k.info().term;
            let key = format!("exposed_comm_by_group_s.{}", k.key());
            (key, term.label, term.bound, seconds, Some(k))
        })
        .collect()
}

/// A term before its share: key, label, bound, seconds and communication kind.
type TermParts = (String, &'static str, &'static str, f64, Option<CommKind>);

/// The parts of the step in display order; they add up to `step_s`. Exposed DP communication
/// during the step and the DP tail after it are separate terms.
pub fn terms(t: &StepTime) -> Vec<Term> {
    let part = |key: &str, label, bound, seconds| -> TermParts {
        (key.to_string(), label, bound, seconds, None)
    };
    let mut parts = vec![part(
        "compute_s",
        "compute (critical pipeline rank)",
        "compute",
        t.compute_s,
    )];
    parts.extend(comm_terms(t, true));
    parts.extend([
        part(
            "warmup_cooldown_s",
            "pipeline warm-up/cool-down bubble",
            "bubble",
            t.warmup_cooldown_s,
        ),
        part(
            "imbalance_s",
            "pipeline stage imbalance",
            "stage-imbalance",
            t.imbalance_s,
        ),
        part(
            "pp_wait_s",
            "pipeline send/receive waits",
            "pipeline-send",
            t.pp_wait_s,
        ),
        part(
            "dp_tail_s",
            "DP tail (after the last backward)",
            "DP-tail",
            t.dp_tail_s,
        ),
        part("optimizer_s", "optimizer step", "optimizer", t.optimizer_s),
    ]);
    parts.extend(comm_terms(t, false));
    parts
        .into_iter()
        .map(|(key, label, bound, seconds, comm)| Term {
            key,
            label,
            bound,
            seconds,
            share: seconds / t.step_s.max(f64::MIN_POSITIVE),
            comm,
        })
        .collect()
}

/// What the advice needs to know of the layout beyond the step's terms: whether the model has
/// routed experts, and which groups already run inside one NVLink domain (a node, or a
/// GB200/GB300 NVL72 rack), where "keep it inside a node" would not apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdviceContext {
    pub moe: bool,
    pub tp_inside_domain: bool,
    pub ep_inside_domain: bool,
    pub expert_tp_inside_domain: bool,
}

/// What helps when `term` is the largest; the layout (`ctx`) says where "keep it inside a
/// node" would not apply.
fn advice(term: &Term, t: &StepTime, ctx: AdviceContext) -> String {
    match term.comm {
        Some(CommKind::Tp) if ctx.tp_inside_domain => {
            return "lower TP or --tp-comm-overlap (the TP group already runs inside one NVLink domain)".into();
        }
        Some(CommKind::Ep) if ctx.ep_inside_domain => {
            return "the all-to-all already runs inside one NVLink domain: overlap it with compute (DualPipeV), or a lower EP (fewer, larger exchanges)".into();
        }
        Some(CommKind::ExpertTp) if ctx.expert_tp_inside_domain => {
            return "a lower expert_tp (MoE Parallel Folding lets it differ from tp; its group already runs on NVLink)".into();
        }
        Some(k) => return k.info().term.advice.into(),
        None => {}
    }
    match term.key.as_str() {
        "warmup_cooldown_s" => "more microbatches (a larger global batch or a smaller micro batch), interleaving (vpp) or a zero-bubble schedule".into(),
        "imbalance_s" => match &t.imbalance {
            Some(i) => format!(
                "pipeline rank {} is {:.0}% slower than the mean stage because {}: balance the split (parallel.pipeline_layout, account_for_loss_in_pipeline_split / account_for_embedding_in_pipeline_split, or first/last_stage_layers); more microbatches do not help",
                i.stage,
                100.0 * i.excess_fraction,
                i.reason()
            ),
            None => "balance the pipeline stages".into(),
        },
        "pp_wait_s" => "fewer pipeline hops (lower pp or vpp) or faster links between stages".into(),
        "dp_tail_s" => "overlap gradient reduction (overlap_grad_reduce) with a smaller last bucket (ddp_bucket_size)".into(),
        "optimizer_s" => "shard the optimizer (ZeRO-1)".into(),
        _ => "raise GEMM efficiency or cut recomputation".into(),
    }
}

/// The smallest share of the step an overhead must have for a compute-bound verdict to name it.
const MENTIONED_OVERHEAD: f64 = 0.05;

/// One line naming what bounds the step and, from the largest overhead, the change that helps.
pub fn verdict_line(t: &StepTime, ctx: AdviceContext) -> String {
    let all = terms(t);
    let largest = |it: &mut dyn Iterator<Item = &Term>| {
        it.fold(None::<&Term>, |a, b| match a {
            Some(a) if a.seconds >= b.seconds => Some(a),
            _ => Some(b),
        })
        .cloned()
    };
    let top = largest(&mut all.iter()).expect("terms are never empty");
    let overhead =
        largest(&mut all.iter().filter(|x| x.key != "compute_s")).expect("terms are never empty");
    let pct = |x: f64| 100.0 * x;
    if top.key == "compute_s" {
        // An overhead under 5% of the step is not worth a change of plan.
        if overhead.share >= MENTIONED_OVERHEAD {
            format!(
                "compute-bound: {:.0}% of the step is compute; the largest overhead is the {} ({:.0}%): {}",
                pct(top.share),
                overhead.label,
                pct(overhead.share),
                advice(&overhead, t, ctx)
            )
        } else {
            format!(
                "compute-bound: {:.0}% of the step is compute",
                pct(top.share)
            )
        }
    } else {
        format!(
            "{}-bound: the {} is {:.0}% of the step, compute {:.0}%; {}",
            top.bound,
            top.label,
            pct(top.share),
            pct(t.compute_s / t.step_s.max(f64::MIN_POSITIVE)),
            advice(&top, t, ctx)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{generate, simulate};

    /// With every stage alike, a rank's idle time stops growing once the pipeline is in steady
    /// state: the short run [`split_idle`] simulates gives the idle time of the long one.
    #[test]
    fn balanced_idle_is_flat_past_the_steady_state() {
        for kind in ScheduleKind::ALL.iter().copied() {
            let (pp, vpp) = match kind {
                ScheduleKind::Interleaved1F1B => (4, 3),
                ScheduleKind::ZbV | ScheduleKind::DualPipeV => (4, 2),
                _ => (4, 1),
            };
            let costs = Costs::uniform(pp, vpp, 1.0, 2.0, Some(1.5), 0.0).unwrap();
            let m = 13 * pp;
            let short = base_microbatches(kind, pp, m);
            assert!(short < m);
            let idle = |m: u32| {
                let s = PipelineSummary::of(
                    &simulate(&generate(kind, pp, vpp, m).unwrap(), &costs).unwrap(),
                );
                (0..pp as usize)
                    .map(|r| s.finish[r] - s.busy[r])
                    .collect::<Vec<_>>()
            };
            let (a, b) = (idle(short), idle(m));
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-9 * y.max(1.0), "{kind}: {a:?} vs {b:?}");
            }
        }
    }

    /// The closed form [`split_idle`] takes for GPipe and 1F1B is the simulator's idle time on
    /// every rank, with the backward split or not, for m >= p.
    #[test]
    fn the_closed_form_balanced_idle_is_the_simulated_one() {
        for kind in [ScheduleKind::Gpipe, ScheduleKind::OneFOneB] {
            for (f, b, w) in [(1.0, 2.0, None), (1.3, 2.1, Some(0.7)), (2.0, 1.0, None)] {
                for pp in 2..=6u32 {
                    for m in [pp, pp + 1, 3 * pp + 2] {
                        let costs = Costs::uniform(pp, 1, f, b, w, 0.0).unwrap();
                        let pipe = Pipe {
                            kind,
                            pp,
                            vpp: 1,
                            microbatches: m,
                        };
                        let s = PipelineSummary::of(
                            &simulate(&generate(kind, pp, 1, m).unwrap(), &costs).unwrap(),
                        );
                        for r in 0..pp as usize {
                            let want = s.finish[r] - s.busy[r];
                            let got = balanced_idle_closed_form(pipe, &costs, r).unwrap();
                            assert!(
                                (got - want).abs() <= 1e-9 * want.max(1.0),
                                "{kind} pp {pp} m {m} rank {r}: {got} vs simulated {want}"
                            );
                        }
                    }
                }
            }
        }
        let interleaved = Pipe {
            kind: ScheduleKind::Interleaved1F1B,
            pp: 4,
            vpp: 2,
            microbatches: 8,
        };
        let costs = Costs::uniform(4, 2, 1.0, 2.0, None, 0.0).unwrap();
        assert_eq!(balanced_idle_closed_form(interleaved, &costs, 0), None);
    }

    /// The terms add up to the step, and the largest overhead drives the advice.
    #[test]
    fn terms_add_up_and_imbalance_advice_names_the_stage() {
        let mut t = StepTime {
            step_s: 10.0,
            compute_s: 4.0,
            bubble_s: 5.0,
            warmup_cooldown_s: 1.0,
            imbalance_s: 3.0,
            pp_wait_s: 1.0,
            dp_tail_s: 0.5,
            optimizer_s: 0.5,
            imbalance: Some(StageImbalance {
                stage: 7,
                stage_s: 1.2,
                mean_stage_s: 1.0,
                excess_fraction: 0.2,
                layers: 10,
                mean_layers: 10.0,
                holds_embedding: false,
                holds_output: true,
            }),
            ..StepTime::default()
        };
        t.exposed_comm_by_group_s[CommKind::Dp] = 0.5;
        let sum: f64 = terms(&t).iter().map(|x| x.seconds).sum();
        assert!((sum - t.step_s).abs() < 1e-12, "{sum}");
        let v = verdict_line(&t, AdviceContext::default());
        assert!(
            v.contains("rank 7 is 20% slower") && v.contains("output layer"),
            "{v}"
        );
        assert!(v.contains("more microbatches do not help"), "{v}");
    }

    /// EP advice follows the layout: "keep EP inside a node" only where its group crosses
    /// NVLink domains (an NVL72 rack holding the whole EP group already has it there).
    #[test]
    fn tp_advice_follows_whether_the_group_crosses_domains() {
        let mut t = StepTime {
            step_s: 10.0,
            compute_s: 6.0,
            ..StepTime::default()
        };
        t.exposed_comm_by_group_s[CommKind::Tp] = 4.0;
        t.exposed_comm_s = 4.0;
        let across = verdict_line(&t, AdviceContext::default());
        assert!(across.contains("keep TP inside a node"), "{across}");
        let inside = verdict_line(
            &t,
            AdviceContext {
                tp_inside_domain: true,
                ..AdviceContext::default()
            },
        );
        assert!(!inside.contains("keep TP inside"), "{inside}");
        assert!(inside.contains("lower TP or --tp-comm-overlap"), "{inside}");
    }

    #[test]
    fn ep_advice_follows_whether_the_group_crosses_domains() {
        let mut t = StepTime {
            step_s: 10.0,
            compute_s: 6.0,
            ..StepTime::default()
        };
        t.exposed_comm_by_group_s[CommKind::Ep] = 4.0;
        t.exposed_comm_s = 4.0;
        let across = verdict_line(
            &t,
            AdviceContext {
                moe: true,
                ..AdviceContext::default()
            },
        );
        assert!(across.contains("keep EP inside a node"), "{across}");
        let inside = verdict_line(
            &t,
            AdviceContext {
                moe: true,
                ep_inside_domain: true,
                ..AdviceContext::default()
            },
        );
        assert!(!inside.contains("keep EP inside"), "{inside}");
        assert!(
            inside.contains("already runs inside one NVLink domain"),
            "{inside}"
        );
    }

    /// Every communication kind is a term, in the order the CLI's step-time table has always
    /// listed them (tests/snapshots): the kinds exposed during the step after compute (DP's without its tail), the
    /// pipeline's idle terms, the DP tail and the optimizer, then the pipeline hand-offs and the
    /// host link; the largest communication term's advice is its kind's.
    #[test]
    fn communication_terms_stand_in_the_documented_order() {
        let mut t = StepTime {
            step_s: 10.0,
            compute_s: 1.0,
            dp_tail_s: 0.25,
            ..StepTime::default()
        };
        for (i, k) in CommKind::ALL.into_iter().enumerate() {
            t.exposed_comm_by_group_s[k] = 0.5 + i as f64 / 10.0;
        }
        let keys: Vec<String> = terms(&t).into_iter().map(|x| x.key).collect();
        let g = |k: &str| format!("exposed_comm_by_group_s.{k}");
        let want = [
            "compute_s".to_string(),
            g("tp"),
            g("cp"),
            g("ep"),
            g("expert_tp"),
            g("dp"),
            "warmup_cooldown_s".into(),
            "imbalance_s".into(),
            "pp_wait_s".into(),
            "dp_tail_s".into(),
            "optimizer_s".into(),
            g("pp"),
            g("host"),
        ];
        assert_eq!(keys, want);
        let dp = terms(&t).into_iter().find(|x| x.key == g("dp")).unwrap();
        assert!((dp.seconds - (0.8 - 0.25)).abs() < 1e-12);
        // The host link (0.5 + 6/10 s) is the largest overhead.
        let v = verdict_line(&t, AdviceContext::default());
        assert!(v.starts_with("host-link-bound"), "{v}");
        assert!(v.contains("offload fewer layers"), "{v}");
    }
}
