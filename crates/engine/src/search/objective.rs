//! Inverse questions over the whole run (`parsim search --objective`, `--deadline`): rank the
//! fitting mixes by the wall time, cost or energy of a token budget, and find the cheapest
//! cluster (or, unpriced, the fewest GPUs) whose best mix finishes by a deadline.
//!
//! The pool ranked is the search's fastest mixes by step time ([`POOL`] of them at least): at
//! one GPU count the steps and the per-step terms are the same for every mix, so the run's
//! wall time and cost follow the step time save the checkpoint terms, which the pool covers.

use super::{resolve, search, Pruned, Ranked, SearchError, SearchResult, SearchSpec};
use crate::config::GpuProfile;
use crate::planning::{run_forecast, PlanningError, RunForecast};
use serde::Serialize;
use std::sync::atomic::AtomicBool;

/// How many of the fastest mixes (by step time) a run objective ranks, at least.
pub const POOL: usize = 40;

const S_PER_DAY: f64 = 86_400.0;

/// What `--objective` ranks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Wall time to train the token budget (step time without one).
    #[default]
    Time,
    /// GPUs x wall hours x the GPU-hour price.
    Cost,
    /// Facility energy of the run.
    Energy,
}

/// Bad input for a run objective or a deadline, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum ObjectiveError {
    #[error("--objective {0}: expected time, cost or energy")]
    Name(String),
    #[error("--objective {0} ranks the run of a token budget: give --train-tokens N")]
    NoTokens(&'static str),
    #[error("--objective cost needs a price: give --gpu-hour-price USD (run.price_per_gpu_hour_usd); there is no default price")]
    NoPrice,
    #[error("--objective energy: the GPU profile {0} gives no [power] idle_w and tdp_w")]
    NoPower(String),
    #[error("--deadline {0}: expected a positive number of days or hours with its unit, such as 60d or 36h")]
    Deadline(String),
    #[error("--deadline needs --train-tokens N: a deadline bounds the run of a token budget")]
    DeadlineNoTokens,
    #[error("--deadline: {deadline_s:.0} s is shorter than one training step ({step_s:.1} s, the fastest mix found at any GPU count): no run can finish by it")]
    DeadlineBelowStep { deadline_s: f64, step_s: f64 },
    #[error(transparent)]
    Planning(#[from] PlanningError),
    #[error(transparent)]
    Search(#[from] SearchError),
}

impl Objective {
    pub fn parse(text: &str) -> Result<Objective, ObjectiveError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "time" => Ok(Objective::Time),
            "cost" => Ok(Objective::Cost),
            "energy" => Ok(Objective::Energy),
            _ => Err(ObjectiveError::Name(text.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Time => "time",
            Objective::Cost => "cost",
            Objective::Energy => "energy",
        }
    }

    /// The run's figure this objective minimises (`None` when the run lacks it).
    pub fn key(self, run: &RunForecast) -> Option<f64> {
        match self {
            Objective::Time => Some(run.wall_days),
            Objective::Cost => run.cost_usd,
            Objective::Energy => run.energy_mwh,
        }
    }

    /// Refuses an objective the settings cannot rank by (before any search).
    pub fn check(self, spec: &SearchSpec) -> Result<(), ObjectiveError> {
        if spec.base.run.train_tokens.is_none() && self != Objective::Time {
            return Err(ObjectiveError::NoTokens(self.as_str()));
        }
        if self == Objective::Cost && spec.base.run.price_per_gpu_hour_usd.is_none() {
            return Err(ObjectiveError::NoPrice);
        }
        Ok(())
    }
}

/// `60d`, `36h`, `1.5d` in seconds: a finite number above 0 with a `d` or `h` unit.
pub fn parse_deadline_s(text: &str) -> Result<f64, ObjectiveError> {
    let err = || ObjectiveError::Deadline(text.to_string());
    let t = text.trim();
    let (num, unit_s) = if let Some(n) = t.strip_suffix('d') {
        (n, S_PER_DAY)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        return Err(err());
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !(v.is_finite() && v > 0.0) {
        return Err(err());
    }
    Ok(v * unit_s)
}

/// A mix with its run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRanked {
    #[serde(flatten)]
    pub ranked: Ranked,
    pub run: RunForecast,
}

/// `parsim search --objective X --train-tokens N --json`.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectiveResult {
    pub objective: Objective,
    pub candidates: u64,
    pub pruned: Pruned,
    pub evaluated: u64,
    pub elapsed_s: f64,
    pub interrupted: bool,
    pub top: Vec<RunRanked>,
}

/// Each of `ranked` with its run, ordered by `objective` (ties by the mix's name).
pub fn rank_by(
    spec: &SearchSpec,
    ranked: &[Ranked],
    objective: Objective,
) -> Result<Vec<RunRanked>, ObjectiveError> {
    objective.check(spec)?;
    let gpu =
        std::sync::Arc::new(GpuProfile::load(&spec.base.cluster.gpu).map_err(SearchError::from)?);
    let mut out = Vec::with_capacity(ranked.len());
    for r in ranked {
        let Some(resolved) = resolve(&r.mix, spec, &gpu) else {
            continue;
        };
        let Some(run) = run_forecast(&resolved, &r.estimate)? else {
            return Err(ObjectiveError::NoTokens(objective.as_str()));
        };
        if objective.key(&run).is_none() {
            return Err(ObjectiveError::NoPower(spec.base.cluster.gpu.clone()));
        }
        out.push(RunRanked {
            ranked: r.clone(),
            run,
        });
    }
    out.sort_by(|a, b| {
        let (ka, kb) = (objective.key(&a.run), objective.key(&b.run));
        ka.unwrap_or(f64::INFINITY)
            .total_cmp(&kb.unwrap_or(f64::INFINITY))
            .then_with(|| a.ranked.mix.to_string().cmp(&b.ranked.mix.to_string()))
    });
    Ok(out)
}

/// A search's result re-ranked by `objective`, the first `top` kept.
pub fn rank_result(
    spec: &SearchSpec,
    result: SearchResult,
    objective: Objective,
    top: usize,
) -> Result<ObjectiveResult, ObjectiveError> {
    let mut ranked = rank_by(spec, &result.top, objective)?;
    ranked.truncate(top);
    Ok(ObjectiveResult {
        objective,
        candidates: result.candidates,
        pruned: result.pruned,
        evaluated: result.evaluated,
        elapsed_s: result.elapsed_s,
        interrupted: result.interrupted,
        top: ranked,
    })
}

/// The mix with the shortest run at one GPU count (`None` when no mix fits).
#[derive(Debug, Clone, Serialize)]
pub struct DeadlinePoint {
    pub gpus: u32,
    pub best: Option<RunRanked>,
    pub finishes: bool,
}

/// `parsim search --gpus LOW..HIGH --train-tokens N --deadline D`.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineAnswer {
    pub deadline_days: f64,
    /// What "cheapest" means: `cost` when priced, else `gpus` (the fewest).
    pub cheapest_by: &'static str,
    /// The cheapest count and mix that finishes by the deadline.
    pub answer: Option<DeadlinePoint>,
    /// When none finishes: the fastest, and by how many days it misses.
    pub closest: Option<DeadlinePoint>,
    pub miss_days: Option<f64>,
    pub points: Vec<DeadlinePoint>,
    pub interrupted: bool,
}

/// Searches each of `counts` for the mix with the shortest run, then answers the cheapest
/// (by cost when priced, else the fewest GPUs; ties by wall time) that finishes within
/// `deadline_s`, or the fastest and its miss. At one count the shortest run is also the
/// cheapest (cost is GPUs x wall hours x price). `progress(i, n)` runs before each count.
pub fn deadline_search(
    spec: &SearchSpec,
    counts: &[u32],
    deadline_s: f64,
    progress: &(dyn Fn(usize, usize) + Sync),
    cancel: &AtomicBool,
) -> Result<DeadlineAnswer, ObjectiveError> {
    if spec.base.run.train_tokens.is_none() {
        return Err(ObjectiveError::DeadlineNoTokens);
    }
    let priced = spec.base.run.price_per_gpu_hour_usd.is_some();
    let mut points = Vec::new();
    let mut interrupted = false;
    for (i, &gpus) in counts.iter().enumerate() {
        progress(i, counts.len());
        let mut s = spec.clone();
        s.base.cluster.num_gpus = gpus;
        s.top = s.top.max(POOL);
        let r = search(&s, &|_, _| {}, cancel)?;
        interrupted = r.interrupted;
        let best = rank_by(&s, &r.top, Objective::Time)?.into_iter().next();
        let finishes = best
            .as_ref()
            .is_some_and(|b| b.run.wall_days * S_PER_DAY <= deadline_s);
        points.push(DeadlinePoint {
            gpus,
            best,
            finishes,
        });
        if interrupted {
            break;
        }
    }
    // A deadline shorter than one step of the fastest mix cannot be met by any run.
    let fastest_step_s = points
        .iter()
        .filter_map(|p| p.best.as_ref())
        .map(|b| b.run.compute_days * S_PER_DAY / b.run.steps.max(1) as f64)
        .fold(f64::INFINITY, f64::min);
    if deadline_s < fastest_step_s && fastest_step_s.is_finite() {
        return Err(ObjectiveError::DeadlineBelowStep {
            deadline_s,
            step_s: fastest_step_s,
        });
    }
    let wall = |p: &DeadlinePoint| p.best.as_ref().map_or(f64::INFINITY, |b| b.run.wall_days);
    let cheap = |p: &DeadlinePoint| {
        let b = p.best.as_ref();
        if priced {
            b.and_then(|b| b.run.cost_usd).unwrap_or(f64::INFINITY)
        } else {
            f64::from(p.gpus)
        }
    };
    let answer = points
        .iter()
        .filter(|p| p.finishes)
        .min_by(|a, b| {
            cheap(a)
                .total_cmp(&cheap(b))
                .then(wall(a).total_cmp(&wall(b)))
        })
        .cloned();
    let closest = if answer.is_none() {
        points
            .iter()
            .filter(|p| p.best.is_some())
            .min_by(|a, b| wall(a).total_cmp(&wall(b)).then(a.gpus.cmp(&b.gpus)))
            .cloned()
    } else {
        None
    };
    let miss_days = closest.as_ref().map(|c| wall(c) - deadline_s / S_PER_DAY);
    Ok(DeadlineAnswer {
        deadline_days: deadline_s / S_PER_DAY,
        cheapest_by: if priced { "cost" } else { "gpus" },
        answer,
        closest,
        miss_days,
        points,
        interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_parse_with_units_and_refuse_the_rest() {
        assert_eq!(parse_deadline_s("60d").unwrap(), 60.0 * 86_400.0);
        assert_eq!(parse_deadline_s("36h").unwrap(), 36.0 * 3600.0);
        assert_eq!(parse_deadline_s("1.5d").unwrap(), 1.5 * 86_400.0);
        for bad in ["60", "0d", "-1d", "d", "xd", "infd", "NaNh", "5w"] {
            let e = parse_deadline_s(bad).unwrap_err().to_string();
            assert!(e.starts_with("--deadline"), "{bad}: {e}");
        }
    }

    #[test]
    fn objectives_parse_by_name() {
        assert_eq!(Objective::parse("cost").unwrap(), Objective::Cost);
        assert_eq!(Objective::parse("Energy").unwrap(), Objective::Energy);
        assert!(Objective::parse("speed")
            .unwrap_err()
            .to_string()
            .contains("expected time, cost or energy"));
    }
}
