//! The estimate's step-time interval: its step time, tokens per second and MFU at the lower
//! and upper factors of a residual model's interval ([`crate::interval`]).

use super::Estimate;
use crate::interval::{IntervalModel, StepInterval};

impl Estimate {
    /// Sets `time.step_s_p10/p90`, `throughput.tokens_per_s_p10/p90` and `mfu_p10/p90` from
    /// `interval` (factors on the predicted step time). Throughput's p10 is the slow end: the
    /// tokens per second of the upper step time.
    pub fn set_interval(&mut self, interval: StepInterval) {
        let step_s = self.time.step_s;
        let (lo_s, hi_s) = (
            step_s * interval.lower_factor,
            step_s * interval.upper_factor,
        );
        self.time.step_s_p10 = lo_s;
        self.time.step_s_p90 = hi_s;
        let t = &mut self.throughput;
        t.tokens_per_s_p10 = t.tokens_per_s * step_s / hi_s;
        t.tokens_per_s_p90 = t.tokens_per_s * step_s / lo_s;
        t.mfu_p10 = t.mfu * step_s / hi_s;
        t.mfu_p90 = t.mfu * step_s / lo_s;
        self.step_interval = interval;
    }

    /// The interval of this estimate's regime in another residual model (a user's file).
    pub fn use_interval_model(&mut self, model: &IntervalModel) {
        let interval = model.lookup(&self.step_interval.regime);
        self.set_interval(interval);
    }
}
