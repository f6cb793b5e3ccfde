//! A search as a front end asks for it: the base configuration and the options the CLI's
//! `search` and the Python package both take, made into a [`SearchSpec`] in one place.

use super::{framework_schedules, Constraint, Knob, SearchError, SearchSpec};
use crate::config::Config;

/// The options of a one-GPU-count search besides its base configuration.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// Largest micro batch size tried.
    pub mbs_max: u64,
    /// How many mixes to list.
    pub top: usize,
    /// Filters such as `tp<=4` or `schedule!=gpipe`.
    pub constraints: Vec<String>,
    /// Simulate every candidate that may fit instead of pruning by the step-time bound.
    pub exhaustive: bool,
    /// Rank every pipeline schedule, also those the configuration's framework does not run.
    pub all_schedules: bool,
}

impl SearchRequest {
    /// The spec over `base` (its profile's defaults already filled in:
    /// [`Config::with_profile_defaults`]), and the line naming the
    /// schedules left out because the framework does not run them (none when every schedule
    /// is ranked: `all_schedules`, or a constraint names the schedule).
    pub fn spec(&self, base: Config) -> Result<(SearchSpec, Option<String>), SearchError> {
        let mut constraints = self
            .constraints
            .iter()
            .map(|c| Constraint::parse(c))
            .collect::<Result<Vec<_>, _>>()?;
        let names_schedule = constraints.iter().any(|c| c.knob == Knob::Schedule);
        let note = if self.all_schedules || names_schedule {
            None
        } else {
            let (only, note) = framework_schedules(&base);
            constraints.extend(only);
            note
        };
        let spec = SearchSpec {
            base,
            mbs_max: self.mbs_max,
            top: self.top,
            constraints,
            exhaustive: self.exhaustive,
        };
        Ok((spec, note))
    }
}
