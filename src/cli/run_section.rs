//! The run section (`--train-tokens`, `[run]`) that `estimate` and `compare` add to their
//! output: absent unless asked for, so every other output stays as it was.

use parsim::estimate::Estimate;
use parsim::planning::RunForecast;
use serde::Serialize;

/// The run of `est` when its configuration sets `run.train_tokens`. The other `[run]`
/// settings are checked either way, so a bad one is refused by its field, never ignored.
pub fn run_of(est: &Estimate) -> anyhow::Result<Option<RunForecast>> {
    if est.config.run.train_tokens.is_none() {
        parsim::planning::Settings::from_config(&est.config.run)?;
        return Ok(None);
    }
    let r = parsim::config::Resolved::new(est.config.clone())?;
    Ok(parsim::planning::run_forecast(&r, est)?)
}

/// An output object with a `run` section after its own fields.
#[derive(Serialize)]
pub struct WithRun<'a, T, R> {
    #[serde(flatten)]
    pub inner: &'a T,
    pub run: R,
}
