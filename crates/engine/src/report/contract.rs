//! The JSON documents of the output contract (docs/design.md) that more than one front end
//! prints: the CLI's `--json` and the Python package both build them here, so that the same
//! configuration gives the same text, key order included.

use crate::config::{Config, ConfigError, Resolved, ScheduleKind};
use crate::estimate::{Estimate, EstimateError};
use crate::layout::Layout;
use crate::planning::{PlanningError, RunForecast};
use crate::report::compare::{compare, Comparison};
use crate::schedule::{simulate, Costs, Program, ScheduleError, Simulation};
use serde::Serialize;

/// Why a document could not be built (each names the field, the column or the schedule).
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// One column of a comparison failed (the column's label; the reason is the source).
    #[error("{label}")]
    Column {
        label: String,
        #[source]
        source: Box<ContractError>,
    },
    /// A schedule could not run on the configuration.
    #[error("the {schedule} schedule on the configuration")]
    Schedule {
        schedule: ScheduleKind,
        #[source]
        source: Box<ContractError>,
    },
    #[error("cannot simulate the {schedule} schedule")]
    Simulate {
        schedule: ScheduleKind,
        #[source]
        source: ScheduleError,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A `[run]` setting, or a run that cannot be forecast.
    #[error(transparent)]
    Planning(#[from] PlanningError),
    /// The estimate's own figures (a schedule, a non-finite number).
    #[error(transparent)]
    Estimate(#[from] EstimateError),
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The run of `est` when its configuration sets `run.train_tokens`. The other `[run]`
/// settings are checked either way, so a bad one is refused by its field, never ignored.
pub fn run_of(est: &Estimate) -> Result<Option<RunForecast>, ContractError> {
    if est.config.run.train_tokens.is_none() {
        crate::planning::Settings::from_config(&est.config.run)?;
        return Ok(None);
    }
    let r = Resolved::new(est.config.clone())?;
    Ok(crate::planning::run_forecast(&r, est)?)
}

/// An output object with a `run` section after its own fields.
#[derive(Serialize)]
pub struct WithRun<'a, T, R> {
    #[serde(flatten)]
    pub inner: &'a T,
    pub run: R,
}

/// `inner` as pretty JSON, with a `run` section after its fields when there is one.
pub fn with_run_json<T: Serialize, R: Serialize>(
    inner: &T,
    run: Option<R>,
) -> Result<String, ContractError> {
    Ok(match run {
        Some(run) => serde_json::to_string_pretty(&WithRun { inner, run })?,
        None => serde_json::to_string_pretty(inner)?,
    })
}

/// `parsim estimate --json`: the estimate, with its run when the configuration has a token
/// budget.
pub fn estimate_json(est: &Estimate) -> Result<String, ContractError> {
    with_run_json(est, run_of(est)?)
}

/// Estimates side by side, with each column's run (`None` without a token budget).
pub struct Compared {
    pub comparison: Comparison,
    pub runs: Vec<Option<RunForecast>>,
    pub labels: Vec<String>,
}

/// Compares the estimates (one column each, labelled) and forecasts each column's run.
pub fn compared(labels: Vec<String>, estimates: Vec<Estimate>) -> Result<Compared, ContractError> {
    let runs = estimates
        .iter()
        .zip(&labels)
        .map(|(e, label)| {
            run_of(e).map_err(|source| ContractError::Column {
                label: label.clone(),
                source: Box::new(source),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Compared {
        comparison: compare(labels.clone(), estimates),
        runs,
        labels,
    })
}

impl Compared {
    /// True when some column has a run.
    pub fn any_run(&self) -> bool {
        self.runs.iter().any(Option::is_some)
    }

    /// `parsim compare --json`: the comparison, with every column's run when any has one.
    pub fn json(&self) -> Result<String, ContractError> {
        with_run_json(&self.comparison, self.any_run().then_some(&self.runs))
    }
}

/// The largest world whose every group the layout document lists: 65536 ranks give about
/// 20 MB of JSON; 2^24 ranks needed over 8 GB of memory.
pub const MAX_LISTED_RANKS: u32 = 1 << 16;

/// `parsim layout --json`: every rank's coordinates and groups, and how the NVLink domain was
/// chosen where that is more than "each node". Callers keep the world within
/// [`MAX_LISTED_RANKS`].
pub fn layout_json(resolved: &Resolved, layout: &Layout) -> Result<String, ContractError> {
    let mut v = crate::report::layout::layout_json(layout);
    if let Some(d) = Some(&resolved.nvlink_domain).filter(|d| d.is_worth_saying()) {
        v["nvlink_domain_choice"] = serde_json::to_value(d)?;
    }
    Ok(serde_json::to_string_pretty(&v)?)
}

/// The configuration's schedule (or `kind`, with the chunks per rank it takes: the pipeline
/// split is dropped when that changes the chunk count), its program, simulation and the
/// engine's stage costs.
pub fn configured_schedule(
    mut cfg: Config,
    kind: Option<ScheduleKind>,
) -> Result<(Program, Simulation, Costs), ContractError> {
    if let Some(kind) = kind {
        let p = &mut cfg.parallel;
        let vpp = crate::schedule::vpp_for(kind, p.vpp);
        if vpp != p.vpp {
            p.first_stage_layers = None;
            p.last_stage_layers = None;
            p.pipeline_layout = None;
        }
        p.schedule = kind;
        p.vpp = vpp;
    }
    let schedule = cfg.parallel.schedule;
    let wrap = |source: ContractError| ContractError::Schedule {
        schedule,
        source: Box::new(source),
    };
    let resolved = Resolved::new(cfg).map_err(|e| wrap(e.into()))?;
    let (program, costs) = crate::estimate::pipeline(&resolved)?;
    let sim = simulate(&program, &costs)
        .map_err(|source| ContractError::Simulate { schedule, source })?;
    Ok((program, sim, costs))
}

/// `parsim schedule --json`: one timeline, or a list of them when schedules are compared.
pub fn schedule_json(
    runs: &[(&Program, &Simulation)],
    compared: bool,
) -> Result<String, ContractError> {
    let docs: Vec<_> = runs
        .iter()
        .map(|(p, s)| crate::report::schedule_json::schedule_json(p, s))
        .collect();
    Ok(match (compared, docs.first()) {
        (false, Some(one)) => serde_json::to_string_pretty(one)?,
        _ => serde_json::to_string_pretty(&docs)?,
    })
}
