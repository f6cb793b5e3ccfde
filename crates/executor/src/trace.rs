//! The executor's trace clock; the trace's data types are the plan crate's
//! ([`parsim_plan::trace`]).

use std::time::Instant;

/// The clock every rank of a run reads: a monotonic origin taken before the ranks start, so
/// that their timelines share one axis.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Seconds since the origin.
    pub fn now_s(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
