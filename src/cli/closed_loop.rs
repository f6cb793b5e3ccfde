//! The printed figures of held-out families and unseen configurations: `parsim calibrate
//! --report`'s leave-one-family-out table beside the in-family held-out figure, and `parsim
//! execute --calibrate --closed-loop`'s unseen configurations, measured against predicted.

use parsim::calibrate::closed_loop::ClosedLoop;
use parsim::calibrate::family::{LeaveOneFamilyOut, PredictedRow};
use parsim::calibrate::op_report::ClassRow;
use parsim::calibrate::profile_fit::ProfileFit;
use parsim::report::format::seconds;
use parsim::report::table::table;

fn pct(x: Option<(f64, f64)>) -> String {
    x.map_or("-".into(), |(m, w)| {
        format!("median {:.1}%, worst {:.1}%", 100.0 * m, 100.0 * w)
    })
}

/// A class's error after the fit, "n/a" where nothing was predicted or measured.
fn class_error(r: Option<&ClassRow>) -> String {
    r.filter(|r| r.timings > 0 && r.after.unpredicted < r.timings)
        .and_then(|r| r.after.error())
        .map_or("n/a".into(), |e| format!("{:+.1}%", 100.0 * e))
}

/// Per op class, the in-family held-out lines' timings and the left-out families' timings,
/// each against the profile that never saw them.
pub fn class_text(in_family: &[ClassRow], lofo: &[ClassRow]) -> String {
    let mut t = table(&[
        "op class",
        "in-family held out",
        "timings",
        "left-out families",
        "timings",
    ]);
    for r in in_family {
        let other = lofo.iter().find(|o| o.class == r.class);
        t.add_row(vec![
            r.class.to_string(),
            class_error(Some(r)),
            r.timings.to_string(),
            class_error(other),
            other.map_or(0, |o| o.timings).to_string(),
        ]);
    }
    t.to_string()
}

/// A predicted line's cells after its two naming columns: measured, predicted, signed error.
fn row_cells(first: String, second: String, r: &PredictedRow) -> Vec<String> {
    vec![
        first,
        second,
        seconds(r.measured_s),
        seconds(r.predicted_s),
        format!("{:+.1}%", 100.0 * r.error()),
    ]
}

/// `calibrate --report`'s leave-one-family-out figures: per family its lines' errors, the
/// summary beside the in-family held-out one, and per op class both.
pub fn print_lofo(fit: &ProfileFit, lofo: &LeaveOneFamilyOut, in_family: &[ClassRow]) {
    let mut t = table(&["left-out family", "line", "measured", "predicted", "error"]);
    for f in &lofo.folds {
        for r in &f.rows {
            t.add_row(row_cells(r.family.clone(), r.label.clone(), r));
        }
    }
    println!(
        "leave-one-family-out: each family (ranks, parallel mix, schedule, recompute) left out whole, tables and scalars fitted on the others:\n{t}"
    );
    println!(
        "step time, in-family held out: {} | left-out families: {}",
        pct(fit.summary("held out", false, true)),
        pct(lofo.summary())
    );
    println!(
        "op classes on lines the fit never saw (the fitted op time against the measured, summed over the class):\n{}",
        class_text(in_family, &lofo.classes)
    );
}

/// `execute --calibrate --closed-loop`'s table: every unseen configuration, measured against
/// predicted, the median and worst, and per op class.
pub fn print_closed_loop(l: &ClosedLoop) {
    let mut t = table(&[
        "unseen configuration",
        "family",
        "measured",
        "predicted",
        "error",
    ]);
    for r in &l.rows {
        t.add_row(row_cells(r.label.clone(), r.family.clone(), r));
    }
    println!("closed loop: configurations no sweep point has, executed and predicted by the fitted profile:\n{t}");
    println!("closed loop step time: {}", pct(l.summary()));
    let mut c = table(&["op class", "timings", "measured", "predicted", "error"]);
    for r in l.classes.iter().filter(|r| r.timings > 0) {
        c.add_row(vec![
            r.class.to_string(),
            r.timings.to_string(),
            seconds(r.measured_s),
            seconds(r.after.predicted_s),
            class_error(Some(r)),
        ]);
    }
    println!("closed loop op classes (the unseen runs' slowest rank):\n{c}");
}
