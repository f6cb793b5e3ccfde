//! The closed loop on the CPU backend (`parsim execute --calibrate --closed-loop`): the built-in
//! sweep is measured and fitted as `execute --calibrate` does, and configurations no sweep point
//! has (another rank count and width, other micro batch counts, other mixes at other shapes) are
//! executed beside it and predicted by the fitted profile, which never saw them: what a user
//! planning a run they have not made gets.

use super::family::{abs_summary, family_of, PredictedRow};
use super::measurements::Measurement;
use super::op_report::{compare, ClassRow};
use super::profile_fit::ProfileFit;
use super::sweep::{dp, h, l4, moe, par, point, pp, tr, two, with, SweepPoint};
use crate::config::GpuProfile;
use parsim_plan::op_timing::OpTiming;
use serde::Serialize;
use serde_json::json;

/// The label prefix of the unseen configurations.
pub const UNSEEN: &str = "unseen: ";

/// Hidden 512: 8 heads in 4 query groups, FFN 1024.
fn h512() -> serde_json::Value {
    h(512, 8, 4, 1024)
}

/// The eight unseen configurations, each held out: one rank at hidden 512; PP 2 interleaved
/// at micro batch 2 over 4 micro batches; TP 2 + SP at hidden 512; DP 2 ZeRO-3 at hidden 512;
/// CP 2 zigzag at hidden 512 and sequence 1024; EP 2 over 8 experts at micro batch 2;
/// selective recompute at hidden 448, sequence 512, micro batch 2; PP 2 ZB-V at hidden 512
/// over 8 micro batches.
pub fn unseen_cpu_points() -> Vec<SweepPoint> {
    let moe8 = with(moe(), json!({"model": {"num_experts": 8}}));
    let points = vec![
        ("1 rank h512", with(h512(), json!({}))),
        (
            "pp2 interleaved mbs2",
            two(l4(par(
                pp("interleaved-1f1b", 2),
                json!({"micro_batch_size": 2, "global_batch_size": 8}),
            ))),
        ),
        (
            "tp2 sp h512",
            two(with(h512(), par(json!({"tp": 2, "sp": true}), json!({})))),
        ),
        (
            "dp2 zero3 h512",
            two(with(
                h512(),
                par(json!({"zero": 3}), json!({"global_batch_size": 4})),
            )),
        ),
        (
            "cp2 zigzag h512 s1024",
            two(with(
                h512(),
                par(
                    json!({"cp": 2, "cp_comm": "zigzag"}),
                    json!({"seq_length": 1024}),
                ),
            )),
        ),
        (
            "ep2 8 experts mbs2",
            two(with(
                moe8,
                par(
                    json!({"ep": 2}),
                    json!({"micro_batch_size": 2, "global_batch_size": 8}),
                ),
            )),
        ),
        (
            "dp2 selective h448 s512 mbs2",
            dp(with(
                h(448, 7, 7, 896),
                tr(
                    json!({"recompute": "selective", "seq_length": 512, "micro_batch_size": 2, "global_batch_size": 8}),
                ),
            )),
        ),
        (
            "pp2 zb-v h512",
            two(l4(with(
                h512(),
                par(pp("zb-v", 2), json!({"global_batch_size": 8})),
            ))),
        ),
    ];
    points
        .into_iter()
        .map(|(label, v)| point(&format!("{UNSEEN}{label}"), true, v))
        .collect()
}

/// The closed loop's outcome: every unseen configuration, and its op timings per class
/// against the fitted profile.
#[derive(Debug, Clone, Serialize)]
pub struct ClosedLoop {
    pub rows: Vec<PredictedRow>,
    pub classes: Vec<ClassRow>,
}

impl ClosedLoop {
    /// The unseen configurations of `ms` (labels starting with [`UNSEEN`]) as `fit` predicted
    /// them (they are held out, so the fit never saw them), and their op timings against
    /// `base` (before) and the fitted profile (after).
    pub fn of(ms: &[Measurement], fit: &ProfileFit, base: &GpuProfile) -> ClosedLoop {
        let unseen = |label: &str| label.starts_with(UNSEEN);
        let rows = fit
            .rows
            .iter()
            .filter(|r| unseen(&r.label))
            .map(|r| PredictedRow {
                label: r.label.trim_start_matches(UNSEEN).to_string(),
                family: ms
                    .iter()
                    .find(|m| m.label == r.label)
                    .map_or_else(String::new, |m| family_of(&m.config)),
                measured_s: r.measured_s,
                predicted_s: r.after_s,
            })
            .collect();
        let ops: Vec<OpTiming> = ms
            .iter()
            .filter(|m| unseen(&m.label))
            .flat_map(|m| m.ops.iter().cloned())
            .collect();
        ClosedLoop {
            rows,
            classes: compare(&ops, base, &fit.profile).rows,
        }
    }

    /// (median, worst) absolute step error; `None` with no rows.
    pub fn summary(&self) -> Option<(f64, f64)> {
        abs_summary(self.rows.iter().map(|r| r.error().abs()).collect())
    }
}
