//! The configuration being edited and the engine's answer for it.
//!
//! [`Session`] owns the configuration the controls edit. Whenever it changes, [`evaluate`]
//! runs the engine (validation, estimate, schedule generation and simulation) and the session
//! keeps either the new [`Results`] or the [`Problems`] that stopped them; the last valid
//! results stay available so the views can show them greyed while the input is broken. No
//! egui here: the views read this data and the app calls [`Session::refresh`] once a frame.

use parsim::config::{Config, ConfigError, GpuProfile, Resolved, ScheduleKind, Violation};
use parsim::estimate::{estimate, pipeline, Estimate, EstimateError};
use parsim::schedule::{simulate, Program, Simulation};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use web_time::Instant;

/// Programs with more actions than this are not simulated for drawing (the estimate still
/// simulates them, extrapolated): a timeline of a quarter million bars is unreadable anyway.
pub const MAX_TIMELINE_ACTIONS: u64 = 250_000;

/// The configuration the app opens on: the classic interleaved picture (4 pipeline ranks,
/// 2 virtual stages each, 8 microbatches, interleaved 1F1B) for Llama-3-8B, the smallest
/// preset, on one node of 8 H100s (the profile's node) with TP 2 (so DP is 1 and the global batch of 8 gives 8
/// microbatches). It fits comfortably, and every value can be expressed as `parsim estimate`
/// flags.
pub fn default_config() -> Config {
    let mut c = Config::default();
    c.parallel.tp = 2;
    c.parallel.sp = true;
    c.parallel.pp = 4;
    c.parallel.vpp = 2;
    c.parallel.schedule = ScheduleKind::Interleaved1F1B;
    c.cluster.num_gpus = 8;
    c.training.global_batch_size = 8;
    c.training.micro_batch_size = 1;
    c
}

/// The virtual-stage count a schedule needs, keeping `current` where the schedule allows it
/// (the engine's rule).
pub use parsim::schedule::vpp_for;

/// `config` with its schedule replaced by `kind` (and `vpp` adapted to it), for comparing two
/// schedules on the same model and cluster.
pub fn with_schedule(config: &Config, kind: ScheduleKind) -> Config {
    let mut c = config.clone();
    c.parallel.schedule = kind;
    c.parallel.vpp = vpp_for(kind, config.parallel.vpp);
    c
}

/// One simulated pipeline schedule: the per-rank programs and every action's start and end.
#[derive(Debug, Clone)]
pub struct Run {
    pub program: Program,
    pub sim: Simulation,
}

/// The engine's answer for one valid configuration.
#[derive(Debug, Clone)]
pub struct Results {
    /// The configuration these results are for (as edited, before resolution).
    pub config: Config,
    /// Data-parallel degree, derived from the GPU count.
    pub dp: u32,
    /// Microbatches per pipeline per step.
    pub microbatches: u32,
    pub estimate: Estimate,
    /// The run of `run.train_tokens` tokens (time to train, energy, cost, goodput), when set:
    /// an error names the `[run]` setting at fault.
    pub run: Option<Result<parsim::planning::RunForecast, String>>,
    /// The schedule of this configuration, simulated with the engine's per-stage costs; an
    /// explanation instead when it is too large to draw.
    pub timeline: Result<Run, String>,
    /// The comparison schedule on the same configuration, when one is asked for.
    pub compare: Option<(ScheduleKind, Result<Run, String>)>,
}

/// Why the current configuration has no results: the engine's violations, each naming the
/// field at fault (an empty field for problems that belong to no single field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Problems {
    pub violations: Vec<Violation>,
}

impl Problems {
    fn general(message: impl Into<String>) -> Problems {
        Problems {
            violations: vec![Violation::new("", message)],
        }
    }
}

/// A configuration error as violations attached to fields.
pub fn config_problems(e: &ConfigError) -> Problems {
    let v = match e {
        ConfigError::Invalid(v) => v.clone(),
        ConfigError::UnknownName {
            field,
            value,
            known,
            hint,
        } => vec![
            Violation::new(*field, format!("unknown value '{value}' (known: {known})")).hint(*hint),
        ],
        ConfigError::Field { field, message, .. } => {
            vec![Violation::new(field.clone(), message.clone())]
        }
        ConfigError::Profile { .. } => vec![Violation::new("cluster.gpu", e.to_string())],
        other => vec![Violation::new("", other.to_string())],
    };
    Problems { violations: v }
}

fn estimate_problems(e: &EstimateError) -> Problems {
    match e {
        EstimateError::Schedule(s) => Problems {
            violations: vec![Violation::new(s.field(), s.to_string())],
        },
        EstimateError::NonFinite { .. } => Problems {
            violations: vec![Violation::new("cluster.gpu", e.to_string())],
        },
        EstimateError::Interval(_) => Problems {
            violations: vec![Violation::new("", e.to_string())],
        },
    }
}

/// Caches the GPU profile by name, so a change of any other field does not re-parse it.
#[derive(Debug, Clone, Default)]
pub struct GpuCache {
    entry: Option<(String, Result<GpuProfile, Problems>)>,
}

impl GpuCache {
    /// The profile called `name` (a shipped name or a profile file path).
    pub fn get(&mut self, name: &str) -> Result<GpuProfile, Problems> {
        match &self.entry {
            Some((n, p)) if n == name => p.clone(),
            _ => {
                let p = GpuProfile::load(name).map_err(|e| config_problems(&e));
                self.entry = Some((name.to_string(), p.clone()));
                p
            }
        }
    }
}

/// Simulates the schedule of a resolved configuration with the engine's per-stage costs, unless
/// it has too many actions to draw.
fn timeline(r: &Resolved) -> Result<Run, String> {
    let p = &r.config.parallel;
    let actions = p.pp as u64 * p.vpp as u64 * r.microbatches as u64 * 3;
    if actions > MAX_TIMELINE_ACTIONS {
        return Err(format!(
            "not drawn: pp x vpp x microbatches = {} x {} x {} gives up to {actions} actions \
             (the limit is {MAX_TIMELINE_ACTIONS}); the estimate's figures still come from the \
             engine's extrapolated simulation",
            p.pp, p.vpp, r.microbatches
        ));
    }
    let (program, costs) = pipeline(r).map_err(|e| e.to_string())?;
    let sim = simulate(&program, &costs).map_err(|e| e.to_string())?;
    Ok(Run { program, sim })
}

/// The comparison run: `config` with schedule `kind`, resolved and simulated.
fn compare_run(config: &Config, kind: ScheduleKind, gpu: &GpuProfile) -> Result<Run, String> {
    let c = with_schedule(config, kind);
    let r = Resolved::with_gpu(c, gpu.clone()).map_err(|e| match e {
        ConfigError::Invalid(v) => v
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    })?;
    timeline(&r)
}

/// Runs the engine on `config`: validation, the estimate, the simulated schedule for the
/// timeline and, when `compare` names one, the same configuration under another schedule.
/// Never panics: an engine panic becomes a general problem.
pub fn evaluate(
    config: &Config,
    compare: Option<ScheduleKind>,
    gpus: &mut GpuCache,
) -> Result<Results, Problems> {
    let gpu = gpus.get(&config.cluster.gpu)?;
    let run = || -> Result<Results, Problems> {
        let r = Resolved::with_gpu(config.clone(), gpu.clone()).map_err(|e| config_problems(&e))?;
        let est = estimate(&r).map_err(|e| estimate_problems(&e))?;
        let timeline = timeline(&r);
        let compare = compare.map(|k| (k, compare_run(config, k, &gpu)));
        let run = parsim::planning::run_forecast(&r, &est)
            .map_err(|e| e.to_string())
            .transpose();
        Ok(Results {
            config: config.clone(),
            dp: r.dp,
            microbatches: r.microbatches,
            estimate: est,
            run,
            timeline,
            compare,
        })
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
                .unwrap_or_else(|| "unknown".into());
            Err(Problems::general(format!(
                "the engine failed on this configuration ({msg}); please report it"
            )))
        }
    }
}

/// The configuration being edited, with the engine's answer for it.
#[derive(Debug, Clone)]
pub struct Session {
    /// What the controls edit.
    pub config: Config,
    /// A second schedule to draw under the first, on the same configuration.
    pub compare: Option<ScheduleKind>,
    /// Results of the last configuration that was valid (possibly not the current one).
    pub last_valid: Option<Results>,
    /// Why the current configuration is invalid; `None` when `last_valid` is current.
    pub problems: Option<Problems>,
    /// Wall time of the last recompute.
    pub last_recompute: Duration,
    evaluated: Option<(Config, Option<ScheduleKind>)>,
    gpus: GpuCache,
}

impl Default for Session {
    fn default() -> Self {
        Session::new(default_config())
    }
}

impl Session {
    /// A session on `config`, already evaluated.
    pub fn new(config: Config) -> Session {
        let mut s = Session {
            config,
            compare: None,
            last_valid: None,
            problems: None,
            last_recompute: Duration::ZERO,
            evaluated: None,
            gpus: GpuCache::default(),
        };
        s.refresh();
        s
    }

    /// Re-evaluates when the configuration or the comparison changed since the last time;
    /// returns whether it did.
    pub fn refresh(&mut self) -> bool {
        let key = (self.config.clone(), self.compare);
        if self.evaluated.as_ref() == Some(&key) {
            return false;
        }
        self.recompute();
        self.evaluated = Some(key);
        true
    }

    /// Evaluates the current configuration unconditionally.
    pub fn recompute(&mut self) {
        let start = Instant::now();
        match evaluate(&self.config, self.compare, &mut self.gpus) {
            Ok(r) => {
                self.last_valid = Some(r);
                self.problems = None;
            }
            Err(p) => self.problems = Some(p),
        }
        self.last_recompute = start.elapsed();
    }

    /// True when the configuration changed since it was last evaluated (a file was opened or
    /// a search result loaded after this frame's refresh).
    pub fn is_stale(&self) -> bool {
        self.evaluated
            .as_ref()
            .is_none_or(|(c, k)| *c != self.config || *k != self.compare)
    }

    /// True when the shown results are those of the current configuration.
    pub fn is_current(&self) -> bool {
        self.problems.is_none() && self.last_valid.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_open_on_the_classic_interleaved_picture_and_fit() {
        let s = Session::default();
        assert!(s.is_current(), "{:?}", s.problems);
        let r = s.last_valid.as_ref().unwrap();
        let run = r.timeline.as_ref().unwrap();
        assert_eq!(run.program.pp, 4);
        assert_eq!(run.program.vpp, 2);
        assert_eq!(run.program.microbatches, 8);
        assert_eq!(run.program.kind, ScheduleKind::Interleaved1F1B);
        assert!(r.estimate.memory.fits);
    }

    #[test]
    fn invalid_configuration_keeps_the_last_valid_results() {
        let mut s = Session::default();
        let before = s
            .last_valid
            .as_ref()
            .unwrap()
            .estimate
            .memory
            .per_gpu_max_bytes;
        s.config.model.num_attention_heads = 12;
        assert!(s.refresh());
        let p = s
            .problems
            .as_ref()
            .expect("12 heads over tp 2 x 8 KV heads is invalid");
        assert!(p
            .violations
            .iter()
            .any(|v| v.field == "model.num_query_groups"));
        assert_eq!(
            s.last_valid
                .as_ref()
                .unwrap()
                .estimate
                .memory
                .per_gpu_max_bytes,
            before
        );
        assert!(!s.refresh(), "unchanged configuration is not re-evaluated");
    }

    #[test]
    fn schedule_errors_name_their_field() {
        let mut s = Session::default();
        s.config.training.global_batch_size = 6; // 6 microbatches: not a multiple of pp 4
        s.refresh();
        let p = s.problems.as_ref().expect("interleaved remainder");
        assert_eq!(p.violations[0].field, "training.global_batch_size");
    }

    #[test]
    fn compare_runs_the_other_schedule_with_its_vpp() {
        let mut s = Session::new(default_config());
        s.compare = Some(ScheduleKind::OneFOneB);
        s.refresh();
        let r = s.last_valid.as_ref().unwrap();
        let (k, run) = r.compare.as_ref().unwrap();
        assert_eq!(*k, ScheduleKind::OneFOneB);
        assert_eq!(run.as_ref().unwrap().program.vpp, 1);
    }

    #[test]
    fn a_token_budget_adds_the_run_and_its_cards() {
        let mut s = Session::new(default_config());
        s.refresh();
        assert!(s.last_valid.as_ref().unwrap().run.is_none());
        s.config.run.train_tokens = Some(1_000_000_000_000);
        s.refresh();
        let r = s.last_valid.as_ref().unwrap();
        let run = r.run.as_ref().unwrap().as_ref().unwrap();
        let gpus = f64::from(r.config.cluster.num_gpus);
        assert!((run.gpu_hours - gpus * run.wall_days * 24.0).abs() < 1e-6 * run.gpu_hours);
        let cards = crate::views::cards::run_card_values(run);
        assert_eq!(cards[0], ("Train tokens", "1T".to_string()));
        assert_eq!(cards[4], ("Cost", "-".to_string()));
        assert!(cards.iter().all(|(t, _)| *t != "Deadline"));
        // A deadline: its card says by how much, from the wall time computed here.
        let wall = run.wall_days;
        for (deadline, word) in [(2.0 * wall, "met"), (0.5 * wall, "missed")] {
            s.config.run.deadline_days = Some(deadline);
            s.refresh();
            let r = s.last_valid.as_ref().unwrap();
            let run = r.run.as_ref().unwrap().as_ref().unwrap();
            let card = crate::views::cards::run_card_values(run)
                .into_iter()
                .find(|(t, _)| *t == "Deadline")
                .expect("a deadline card");
            assert!(card.1.contains(word), "{card:?}");
            let margin = run.deadline_margin_days.unwrap();
            assert!((margin - (deadline - wall)).abs() < 1e-9 * wall, "{margin}");
        }
        s.config.run.deadline_days = None;
        s.config.run.storage_bytes_per_s = Some(0.0);
        s.refresh();
        let r = s.last_valid.as_ref().unwrap();
        let err = r.run.as_ref().unwrap().as_ref().unwrap_err();
        assert!(err.starts_with("run.storage_bytes_per_s"), "{err}");
    }

    #[test]
    fn unknown_gpu_is_a_problem_of_the_gpu_field() {
        let mut s = Session::default();
        s.config.cluster.gpu = "no-such-gpu".into();
        s.refresh();
        assert_eq!(s.problems.unwrap().violations[0].field, "cluster.gpu");
    }
}
