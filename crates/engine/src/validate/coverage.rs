//! Interval coverage leave-one-source-out: a row's p10-p90 comes from the shipped residual
//! model without any residual of the row's own source, so a source never widens or centres its
//! own interval. The Megatron-Bridge rows (validation only) hold no residual, so theirs is the
//! shipped model's interval itself.

use super::{residuals, Outcome, Row, Source, ValidateError};
use crate::interval::IntervalModel;
use std::collections::HashMap;

/// Sets each predicted row's `step_s_p10/p90` and `covered` from the model without its source.
pub fn leave_source_out(rows: &mut [Row]) -> Result<(), ValidateError> {
    let mut models: HashMap<Source, IntervalModel> = HashMap::new();
    for r in rows.iter_mut() {
        let Outcome::Predicted(p) = &mut r.outcome else {
            continue;
        };
        let Some(regime) = p.regime else { continue };
        let model = match models.entry(r.source) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(residuals::model_without(r.source)?)
            }
        };
        let i = model.lookup(&regime);
        let (lo, hi) = (p.step_s * i.lower_factor, p.step_s * i.upper_factor);
        p.step_s_p10 = Some(lo);
        p.step_s_p90 = Some(hi);
        p.covered = r.measured.step_s.map(|m| lo <= m && m <= hi);
    }
    Ok(())
}
