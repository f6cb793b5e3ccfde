//! Leave-one-family-out validation of a fit from measurement lines: a line's family is what a
//! planner chooses beside the shapes (its parallel mix and schedule, its recompute mode), and
//! each family in turn is left out whole: tables and scalars are fitted on the other families'
//! fitting lines alone and the left-out family's lines are predicted, step times and op
//! classes. A held-out point between two fitted neighbours of its own family says little about
//! a new mix; this figure says how well the fit carries to one.

use super::loop_fit::{fit_with_tables, LoopFitError};
use super::measurements::Measurement;
use super::op_report::{compare, ClassRow};
use super::profile_fit::held_out_lines;
use crate::config::tables::TableProvenance;
use crate::config::{Config, GpuProfile, Recompute};
use parsim_plan::op_timing::OpTiming;
use serde::Serialize;

/// The family of a configuration: its ranks and parallel mix (TP with or without SP, the
/// pipeline schedule, ZeRO stage, CP's exchange, EP) and its recompute mode, never its shapes.
pub fn family_of(c: &Config) -> String {
    let p = &c.parallel;
    let mut parts = vec![format!("{} rank(s)", c.cluster.num_gpus)];
    if p.tp > 1 {
        parts.push(format!("tp{}{}", p.tp, if p.sp { " sp" } else { "" }));
    }
    if p.pp > 1 {
        parts.push(format!("pp{} {}", p.pp, p.schedule));
    }
    if p.cp > 1 {
        parts.push(format!("cp{} {}", p.cp, p.cp_comm));
    }
    if p.ep > 1 {
        parts.push(format!("ep{}", p.ep));
    }
    if p.zero > 0 {
        parts.push(format!("zero{}", p.zero));
    }
    if c.training.recompute != Recompute::None {
        parts.push(format!("recompute {}", c.training.recompute));
    }
    parts.join(", ")
}

/// One left-out family: its lines predicted by the fit that never saw the family.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyFold {
    /// Per line of the family (collapsed repeats, each naming the family): label, measured and
    /// predicted step.
    pub rows: Vec<PredictedRow>,
    /// The family's op timings against the fold's profile (`after`) and the given one
    /// (`before`).
    pub classes: Vec<ClassRow>,
}

/// One line the fit never saw (a left-out family's, an unseen configuration's), measured and
/// predicted.
#[derive(Debug, Clone, Serialize)]
pub struct PredictedRow {
    pub label: String,
    pub family: String,
    pub measured_s: f64,
    pub predicted_s: f64,
}

impl PredictedRow {
    /// predicted / measured - 1.
    pub fn error(&self) -> f64 {
        self.predicted_s / self.measured_s - 1.0
    }
}

/// Every fold, and the op classes of all left-out lines together.
#[derive(Debug, Clone, Serialize)]
pub struct LeaveOneFamilyOut {
    pub folds: Vec<FamilyFold>,
    /// Per op class, every fold's left-out timings against its own fold's profile, summed.
    pub classes: Vec<ClassRow>,
}

impl LeaveOneFamilyOut {
    /// (median, worst) absolute step error over every left-out line; `None` with none.
    pub fn summary(&self) -> Option<(f64, f64)> {
        let errs: Vec<f64> = self
            .folds
            .iter()
            .flat_map(|f| f.rows.iter().map(|r| r.error().abs()))
            .collect();
        abs_summary(errs)
    }
}

/// (median, worst) of absolute errors; `None` when there are none.
pub fn abs_summary(mut errs: Vec<f64>) -> Option<(f64, f64)> {
    if errs.is_empty() {
        return None;
    }
    errs.sort_by(f64::total_cmp);
    let n = errs.len();
    let median = if n % 2 == 1 {
        errs[n / 2]
    } else {
        0.5 * (errs[n / 2 - 1] + errs[n / 2])
    };
    Some((median, errs[n - 1]))
}

/// Adds `b`'s seconds and counts into `a` (the same class).
fn add_class(a: &mut ClassRow, b: &ClassRow) {
    a.timings += b.timings;
    a.measured_s += b.measured_s;
    for (x, y) in [(&mut a.before, &b.before), (&mut a.after, &b.after)] {
        x.predicted_s += y.predicted_s;
        x.measured_s += y.measured_s;
        x.unpredicted += y.unpredicted;
    }
}

/// Leaves out each family of the fitting lines of `ms` in turn (lines the fit holds out stay
/// out of every fold): fits tables and scalars on the rest, as [`fit_with_tables`] does, and
/// predicts the family's lines. A family that is the only one left is skipped (nothing would
/// remain to fit).
pub fn leave_one_family_out(
    base: &GpuProfile,
    ms: &[Measurement],
    origin: &str,
    provenance: &TableProvenance,
) -> Result<LeaveOneFamilyOut, LoopFitError> {
    let held = held_out_lines(ms);
    let families: Vec<String> = ms.iter().map(|m| family_of(&m.config)).collect();
    let mut order: Vec<&String> = Vec::new();
    for (f, h) in families.iter().zip(&held) {
        if !h && !order.contains(&f) {
            order.push(f);
        }
    }
    let mut folds = Vec::new();
    let mut classes: Option<Vec<ClassRow>> = None;
    if order.len() < 2 {
        return Ok(LeaveOneFamilyOut {
            folds,
            classes: Vec::new(),
        });
    }
    for family in order {
        let left_out = |i: usize| &families[i] == family && !held[i];
        // The rule's held-out lines stay held out; the family joins them.
        let fold: Vec<Measurement> = ms
            .iter()
            .enumerate()
            .map(|(i, m)| Measurement {
                holdout: held[i] || left_out(i),
                ..m.clone()
            })
            .collect();
        let fit = fit_with_tables(base, &fold, origin, provenance)?.fit;
        let labels: Vec<&str> = (0..ms.len())
            .filter(|&i| left_out(i))
            .map(|i| ms[i].label.as_str())
            .collect();
        let rows = fit
            .rows
            .iter()
            .filter(|r| labels.contains(&r.label.as_str()))
            .map(|r| PredictedRow {
                label: r.label.clone(),
                family: family.clone(),
                measured_s: r.measured_s,
                predicted_s: r.after_s,
            })
            .collect();
        let ops: Vec<OpTiming> = (0..ms.len())
            .filter(|&i| left_out(i))
            .flat_map(|i| ms[i].ops.iter().cloned())
            .collect();
        let fold_classes = compare(&ops, base, &fit.profile).rows;
        match &mut classes {
            None => classes = Some(fold_classes.clone()),
            Some(all) => all
                .iter_mut()
                .zip(&fold_classes)
                .for_each(|(a, b)| add_class(a, b)),
        }
        folds.push(FamilyFold {
            rows,
            classes: fold_classes,
        });
    }
    Ok(LeaveOneFamilyOut {
        folds,
        classes: classes.unwrap_or_default(),
    })
}
