//! What a rank hands back to the orchestration.

use parsim_plan::run_report::RankReport;
use parsim_plan::trace::RankTrace;

/// (global tensor name, flat index in it, value).
pub(in crate::runner) type Element = (String, usize, f32);

/// What a rank hands back to the orchestration.
pub(in crate::runner) struct RankOutput {
    pub(in crate::runner) report: RankReport,
    pub(in crate::runner) loss_sums: Vec<f64>,
    pub(in crate::runner) aux_sums: Vec<f64>,
    pub(in crate::runner) params: Vec<Element>,
    pub(in crate::runner) grads: Vec<Element>,
    pub(in crate::runner) trace: Option<RankTrace>,
}
