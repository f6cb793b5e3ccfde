//! `parsim validate`'s human output: per source, the guards and goals, per (model, system), the
//! reasons rows are not expressible, the defaults each source takes, and (`--rows`) every row.

use super::guards::{self, GoalCheck, GuardCheck, GuardFile, MissCheck};
use super::stats::{self, Stats};
use super::{Outcome, Report, Row, Source, Use};
use crate::report::table::{right_align, table};
use std::fmt::Write;

/// A fraction as a percentage, "-" when absent.
pub fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
}

/// A signed fraction as a percentage, "-" when absent.
pub fn signed(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:+.1}%", 100.0 * x))
}

/// "inside/rows (share)".
pub fn coverage(s: &Stats) -> String {
    match s.coverage() {
        None => "-".into(),
        Some(c) => format!("{}/{} ({:.0}%)", s.covered, s.coverage_rows, 100.0 * c),
    }
}

/// "agree/rows".
pub fn fits(s: &Stats) -> String {
    if s.fits_rows == 0 {
        "-".into()
    } else {
        format!("{}/{}", s.fits_agree, s.fits_rows)
    }
}

/// "median / worst" of the memory error.
pub fn memory(s: &Stats) -> String {
    if s.memory_rows == 0 {
        "-".into()
    } else {
        format!(
            "{} / {} ({})",
            pct(s.memory_median),
            pct(s.memory_worst),
            s.memory_rows
        )
    }
}

/// "1 row", "N rows".
pub fn rows_of(n: usize) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}

pub fn usage(u: Use) -> &'static str {
    match u {
        Use::ValidationOnly => "validation only",
        Use::NotFitted => "not fitted",
        Use::Fitted => "leave-one-source-out",
    }
}

const HEADER: [&str; 11] = [
    "",
    "use",
    "rows",
    "expressible",
    "predicted",
    "median",
    "worst",
    "signed mean",
    "coverage",
    "memory err",
    "fits agree",
];

fn stats_cells(s: &Stats) -> Vec<String> {
    vec![
        s.rows.to_string(),
        s.expressible.to_string(),
        s.predicted.to_string(),
        pct(s.median),
        pct(s.worst),
        signed(s.mean_signed),
        coverage(s),
        memory(s),
        fits(s),
    ]
}

/// One line per source.
pub fn sources(report: &Report) -> String {
    let mut t = table(&HEADER);
    for (s, st) in stats::by_source(report) {
        let mut row = vec![s.name().to_string(), usage(s.usage()).to_string()];
        row.extend(stats_cells(&st));
        t.add_row(row);
    }
    right_align(&mut t, 2);
    t.to_string()
}

/// One line per (model, system) of `source`.
pub fn groups(report: &Report, source: Source) -> String {
    let mut header = vec!["model", "system"];
    header.extend(&HEADER[2..]);
    let mut t = table(&header);
    for ((m, sys), st) in stats::by_group(report, source) {
        let mut row = vec![m, sys];
        row.extend(stats_cells(&st));
        t.add_row(row);
    }
    right_align(&mut t, 2);
    t.to_string()
}

/// "figure (bound)" for a guard's column.
fn against(x: Option<f64>, bound: Option<f64>) -> String {
    match bound {
        Some(b) => format!("{} ({})", pct(x), pct(Some(b))),
        None => pct(x),
    }
}

/// The guards (each against its bounds) and the known misses.
pub fn guards(checks: &[GuardCheck], misses: &[MissCheck]) -> String {
    let mut t = table(&[
        "guard",
        "rows",
        "median (bound)",
        "worst (bound)",
        "signed (bound)",
        "coverage (bound)",
        "holds",
    ]);
    for c in checks {
        let g = &c.guard;
        t.add_row(vec![
            g.id.clone(),
            c.stats.predicted.to_string(),
            against(c.stats.median, Some(g.median)),
            against(c.stats.worst, Some(g.worst)),
            match g.signed {
                Some(_) => against(c.stats.mean_signed.map(f64::abs), g.signed),
                None => signed(c.stats.mean_signed),
            },
            against(c.stats.coverage(), g.coverage),
            if c.failures.is_empty() {
                "yes".into()
            } else {
                format!("NO: {}", c.failures.join("; "))
            },
        ]);
    }
    for m in misses {
        t.add_row(vec![
            format!("miss {} #{}", m.miss.source, m.miss.row),
            "1".into(),
            "-".into(),
            against(m.error.map(f64::abs), Some(m.miss.bound)),
            "-".into(),
            "-".into(),
            if m.failures.is_empty() {
                "yes".into()
            } else {
                format!("NO: {}", m.failures.join("; "))
            },
        ]);
    }
    right_align(&mut t, 1);
    let mut s = t.to_string();
    for m in misses {
        let _ = write!(
            s,
            "\nmiss {} #{} ({}): {}",
            m.miss.source, m.miss.row, m.miss.label, m.miss.reason
        );
    }
    s
}

/// Each goal beside today's figures, with what is still missed.
pub fn goals(checks: &[GoalCheck]) -> String {
    let mut t = table(&[
        "goal",
        "rows of",
        "median",
        "worst",
        "signed mean",
        "coverage",
        "missed",
    ]);
    for c in checks {
        let g = &c.goal;
        for (key, s) in &c.figures {
            let missed = g.misses(s);
            t.add_row(vec![
                g.name.clone(),
                key.clone(),
                format!("{} / {}", pct(s.median), pct(Some(g.median))),
                format!("{} / {}", pct(s.worst), pct(Some(g.worst))),
                match g.signed {
                    Some(b) => format!("{} / +-{}", signed(s.mean_signed), pct(Some(b))),
                    None => signed(s.mean_signed),
                },
                match g.coverage {
                    Some(b) => format!("{} / {}", pct(s.coverage()), pct(Some(b))),
                    None => pct(s.coverage()),
                },
                if missed.is_empty() {
                    "met".into()
                } else {
                    missed.join(", ")
                },
            ]);
        }
    }
    t.to_string()
}

/// Every row of the report.
pub fn rows(report: &Report) -> String {
    let mut t = table(&[
        "source",
        "#",
        "row",
        "measured s",
        "predicted s",
        "error",
        "p10-p90 s",
        "fits",
        "notes",
    ]);
    for r in &report.rows {
        t.add_row(row_cells(r));
    }
    right_align(&mut t, 3);
    t.to_string()
}

fn row_cells(r: &Row) -> Vec<String> {
    let secs = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
    let (pred, interval, fit, mut notes) = match &r.outcome {
        Outcome::Predicted(p) => (
            secs(Some(p.step_s)),
            match (p.step_s_p10, p.step_s_p90) {
                (Some(a), Some(b)) => format!("{a:.3}-{b:.3}"),
                _ => p
                    .covered
                    .map_or("-".into(), |c| if c { "inside" } else { "outside" }.into()),
            },
            if p.fits { "yes" } else { "no" }.to_string(),
            Vec::new(),
        ),
        Outcome::NotExpressible(why) => (
            "-".into(),
            "-".into(),
            "-".into(),
            vec![format!("not expressible: {why}")],
        ),
        Outcome::Excluded(why) => ("-".into(), "-".into(), "-".into(), vec![why.clone()]),
    };
    if r.measured.fits == Some(false) {
        notes.push("ran out of memory".into());
    }
    notes.extend(r.notes.iter().cloned());
    vec![
        r.source.key().to_string(),
        r.index.to_string(),
        r.label.clone(),
        secs(r.measured.step_s),
        pred,
        signed(r.error()),
        interval,
        fit,
        notes.join("; "),
    ]
}

/// The whole report as text: sources, guards and goals, then per source its groups, what is
/// not expressible and the defaults it takes; `all_rows` adds every row.
pub fn report(report: &Report, file: &GuardFile, all_rows: bool) -> String {
    let mut s = String::new();
    let n = report.rows.len();
    let _ = writeln!(
        s,
        "parsim validate: {n} published rows of {} source{}, each at its printed settings{}\n",
        report.sources.len(),
        if report.sources.len() == 1 { "" } else { "s" },
        if report.every > 1 {
            format!(
                " (every {}th row: a sample, not the published figures; guards not checked)",
                report.every
            )
        } else {
            String::new()
        }
    );
    s.push_str(
        "error = measured / predicted step time - 1 (positive: parsim is too fast); \
                coverage = measured steps inside parsim's p10-p90 interval\n",
    );
    s.push_str(&sources(report));
    s.push('\n');
    let (checks, misses) = guards::check(file, report);
    if !checks.is_empty() || !misses.is_empty() {
        s.push_str("\nGuards (calibration/accuracy-guards.toml; a bound may only tighten)\n");
        s.push_str(&guards(&checks, &misses));
        s.push('\n');
    }
    let goal_checks = guards::goals(file, report);
    if !goal_checks.is_empty() {
        s.push_str("\nGoals (figure / goal)\n");
        s.push_str(&goals(&goal_checks));
        s.push('\n');
    }
    for &src in &report.sources {
        let _ = writeln!(s, "\n{} ({})", src.name(), usage(src.usage()));
        s.push_str(&groups(report, src));
        s.push('\n');
        for (why, count) in stats::not_expressible(report, src) {
            let _ = writeln!(s, "  not expressible ({}): {why}", rows_of(count));
        }
        let _ = writeln!(s, "  settings not printed: {}", src.defaults());
    }
    for r in &report.remarks {
        let _ = writeln!(s, "\nnote: {r}");
    }
    if all_rows {
        s.push('\n');
        s.push_str(&rows(report));
        s.push('\n');
    }
    s
}
