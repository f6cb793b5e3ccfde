//! Why a search ranked no mix: which filter removed the last candidates. The divisibility
//! rules decide which splits of the GPUs into tp x cp x pp x dp yield candidates at all
//! ([`super::grid`]); each candidate is then removed by the constraints (`--constraint`, `--recompute`), refused by the rules (a
//! divisibility or size rule of the configuration, or the schedule's own), or does not fit
//! the GPU's memory. When none is left, the constraints that stand between the user and a mix
//! that fits are named (from a search without them, [`NoFit::without_constraints`]); when no
//! mix fits even without them, memory decides (with the candidate that misses by least), or,
//! when nothing passes the rules, the rules that refused the most.

use super::{Constraint, Gpu, Mix, Pruned, Ranked, SearchSpec};
use crate::config::{ConfigError, Resolved};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One constraint's share of the candidates.
#[derive(Debug, Clone, Serialize)]
pub struct ConstraintCount {
    /// As given, e.g. `tp<=2`.
    pub constraint: String,
    /// Candidates it excludes (another constraint may exclude them too).
    pub removed: u64,
    /// Of the fastest mixes that fit without the constraints, those it excludes, and those
    /// it alone excludes (they meet every other constraint).
    pub fitting_removed: u64,
    pub fitting_removed_alone: u64,
}

/// The candidates one field's rule refused.
#[derive(Debug, Clone, Serialize)]
pub struct RuleCount {
    /// The field the first broken rule names (`the estimate` for a refusal of the schedule or
    /// the estimate after the configuration's rules passed).
    pub field: String,
    /// That rule, as the first candidate it refused broke it.
    pub example: String,
    pub removed: u64,
}

/// The candidate whose memory exceeds the GPU's by least.
#[derive(Debug, Clone, Serialize)]
pub struct Closest {
    pub mix: Mix,
    /// Its per-GPU peak, as the estimate reports it.
    pub per_gpu_max_bytes: u64,
    /// What the GPU offers (capacity less the memory margin).
    pub usable_bytes: u64,
}

/// Why no mix was ranked (`parsim search`'s answer when nothing fits).
#[derive(Debug, Clone, Serialize)]
pub struct NoFit {
    /// The splits of the GPU count into tp x cp x pp x dp, and those a divisibility rule
    /// skipped (no candidate is built from them), by field, most first.
    pub splits: u64,
    pub splits_skipped: Vec<RuleCount>,
    pub candidates: u64,
    /// Candidates some constraint excludes.
    pub removed_by_constraints: u64,
    /// Each constraint, in the order given.
    pub constraints: Vec<ConstraintCount>,
    /// Candidates every constraint keeps that a rule refused, by field, most first.
    pub rules: Vec<RuleCount>,
    /// Candidates every constraint keeps and the rules accept whose memory exceeds the GPU's.
    pub over_memory: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closest: Option<Closest>,
    /// The fastest mix that fits once the constraints are dropped (none: none fits anyway),
    /// and how many of the fastest that fit [`ConstraintCount::fitting_removed`] counts over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fastest_without_constraints: Option<Mix>,
    pub fitting_without_constraints: u64,
    /// What removed the last candidates: constraints (as given), `memory`, or rule fields.
    pub removed_last_by: Vec<String>,
}

/// The data-parallel degree of `mix` on `gpus` GPUs (a mix's degrees divide the count).
fn dp_of(mix: &Mix, gpus: u32) -> u32 {
    let model = u64::from(mix.tp) * u64::from(mix.cp) * u64::from(mix.pp);
    u32::try_from(u64::from(gpus) / model.max(1)).unwrap_or(u32::MAX)
}

/// (field, rule) pairs counted by field, most first, each with its first rule.
fn tally(refusals: impl IntoIterator<Item = (String, String)>) -> Vec<RuleCount> {
    let mut counts: Vec<RuleCount> = Vec::new();
    for (field, rule) in refusals {
        match counts.iter_mut().find(|c| c.field == field) {
            Some(c) => c.removed += 1,
            None => counts.push(RuleCount {
                field,
                example: rule,
                removed: 1,
            }),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.removed));
    counts
}

/// The skipped splits of `base`'s GPUs by the field of their rule, most first, and how many
/// splits there are.
fn split_counts(base: &crate::config::Config, mbs_max: u64, domain: u32) -> (u64, Vec<RuleCount>) {
    let all = super::grid::splits(base, mbs_max, domain);
    let skipped = all
        .iter()
        .filter_map(|(_, s)| s.as_ref())
        .map(|s| (s.field.to_string(), s.rule.clone()));
    (all.len() as u64, tally(skipped))
}

/// The rule that refuses `mix`: its field and text, or None when the configuration passes.
fn refusal(mix: &Mix, spec: &SearchSpec, gpu: &Gpu) -> Option<(String, String)> {
    match Resolved::with_gpu(mix.apply(&spec.base), Arc::clone(gpu)) {
        Ok(_) => None,
        Err(ConfigError::Invalid(v)) => v.first().map(|v| (v.field.clone(), v.rule.clone())),
        Err(e) => Some(("configuration".into(), e.to_string())),
    }
}

/// The candidates' refusals by field, most first; `invalid` (the search's count) beyond the
/// configuration's refusals were refused by the schedule or the estimate.
fn rule_counts(
    kept: &[&Mix],
    (spec, gpu, cancel): (&SearchSpec, &Gpu, &AtomicBool),
    invalid: u64,
) -> Vec<RuleCount> {
    let refused: Vec<(String, String)> = kept
        .par_iter()
        .filter(|_| !cancel.load(Ordering::Relaxed))
        .filter_map(|m| refusal(m, spec, gpu))
        .collect();
    let mut rules = tally(refused);
    let by_rules: u64 = rules.iter().map(|r| r.removed).sum();
    if invalid > by_rules {
        rules.push(RuleCount {
            field: "the estimate".into(),
            example: "the schedule or the estimate refused the configuration".into(),
            removed: invalid - by_rules,
        });
    }
    rules.sort_by_key(|c| std::cmp::Reverse(c.removed));
    rules
}

/// Of `closest` (mixes with their memory bound or peak, fewest bytes first), the one whose
/// estimate reports the least memory: a peak is at least its bound, so when the least peak
/// is below the bounds of the mixes not kept it is the least of all.
fn closest_of(
    closest: &[(Mix, u64)],
    (spec, gpu, cancel): (&SearchSpec, &Gpu, &AtomicBool),
) -> Option<Closest> {
    closest
        .par_iter()
        .filter(|_| !cancel.load(Ordering::Relaxed))
        .filter_map(|&(mix, bound)| {
            let r = Resolved::with_gpu(mix.apply(&spec.base), Arc::clone(gpu)).ok()?;
            let peak = crate::estimate::estimate(&r)
                .ok()
                .map_or(bound, |e| e.memory.per_gpu_max_bytes);
            Some(Closest {
                mix,
                per_gpu_max_bytes: peak,
                usable_bytes: r.gpu.usable_memory_bytes(),
            })
        })
        .min_by(|a, b| {
            a.per_gpu_max_bytes
                .cmp(&b.per_gpu_max_bytes)
                .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
        })
}

impl NoFit {
    /// What the search of `spec` over `mixes` removed (`pruned`), with the candidates closest
    /// to fitting it met (`closest`, [`super::run::Run::closest`]); the constraints' effect on
    /// mixes that fit is added by [`NoFit::without_constraints`]. Once `cancel` is set the
    /// rest is skipped (and the caller drops the answer).
    pub(super) fn of(
        spec: &SearchSpec,
        gpu: &Gpu,
        mixes: &[Mix],
        pruned: &Pruned,
        closest: &[(Mix, u64)],
        cancel: &AtomicBool,
    ) -> NoFit {
        let gpus = spec.base.cluster.num_gpus;
        let holds = |c: &Constraint, m: &Mix| c.holds(m, dp_of(m, gpus));
        let constraints = spec
            .constraints
            .iter()
            .map(|c| ConstraintCount {
                constraint: c.to_string(),
                removed: mixes.iter().filter(|m| !holds(c, m)).count() as u64,
                fitting_removed: 0,
                fitting_removed_alone: 0,
            })
            .collect();
        let kept: Vec<&Mix> = mixes
            .iter()
            .filter(|m| spec.constraints.iter().all(|c| holds(c, m)))
            .collect();
        let rules = rule_counts(&kept, (spec, gpu, cancel), pruned.invalid);
        let domain = spec.base.cluster.nvlink_domain(gpu);
        let (splits, splits_skipped) = split_counts(&spec.base, spec.mbs_max, domain);
        let mut no_fit = NoFit {
            splits,
            splits_skipped,
            candidates: mixes.len() as u64,
            removed_by_constraints: (mixes.len() - kept.len()) as u64,
            constraints,
            rules,
            over_memory: pruned.memory_bound + pruned.memory,
            closest: closest_of(closest, (spec, gpu, cancel)),
            fastest_without_constraints: None,
            fitting_without_constraints: 0,
            removed_last_by: Vec::new(),
        };
        no_fit.decide(spec);
        no_fit
    }

    /// True when a search without the constraints could rank a mix this one could not.
    pub fn constraints_removed_any(&self) -> bool {
        self.constraints.iter().any(|c| c.removed > 0)
    }

    /// Adds what a search of the same space without the constraints ranked (`fitting`, its
    /// fastest mixes that fit, fastest first) and decides again.
    pub fn without_constraints(&mut self, spec: &SearchSpec, fitting: &[Ranked]) {
        let gpus = spec.base.cluster.num_gpus;
        let fails = |c: &Constraint, m: &Mix| !c.holds(m, dp_of(m, gpus));
        for (count, c) in self.constraints.iter_mut().zip(&spec.constraints) {
            let removed = fitting.iter().filter(|r| fails(c, &r.mix));
            count.fitting_removed = removed.clone().count() as u64;
            count.fitting_removed_alone = removed
                .filter(|r| spec.constraints.iter().filter(|o| fails(o, &r.mix)).count() == 1)
                .count() as u64;
        }
        self.fastest_without_constraints = fitting.first().map(|r| r.mix);
        self.fitting_without_constraints = fitting.len() as u64;
        self.decide(spec);
    }

    /// [`NoFit::removed_last_by`]: the constraints that exclude the fastest mix that fits
    /// without them (and any that alone excludes a fitting mix); else memory, when some
    /// candidate passed every rule; else the divisibility rules, when no split of the GPUs
    /// gave a candidate; else the rules that refused the candidates.
    fn decide(&mut self, spec: &SearchSpec) {
        let gpus = spec.base.cluster.num_gpus;
        self.removed_last_by = match self.fastest_without_constraints {
            Some(fastest) => self
                .constraints
                .iter()
                .zip(&spec.constraints)
                .filter(|(count, c)| {
                    !c.holds(&fastest, dp_of(&fastest, gpus)) || count.fitting_removed_alone > 0
                })
                .map(|(count, _)| count.constraint.clone())
                .collect(),
            None if self.over_memory > 0 => vec!["memory".into()],
            None if self.candidates == 0 => self
                .splits_skipped
                .iter()
                .map(|r| r.field.clone())
                .collect(),
            None => self.rules.iter().map(|r| r.field.clone()).collect(),
        };
    }
}
