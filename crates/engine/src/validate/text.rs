//! `parsim validate`'s human output: per source, the guards and goals, per (model, system), the
//! reasons rows are not expressible, the defaults each source takes, and (`--rows`) every row.

use super::guards::{self, Goal, GoalCheck, GuardCheck, GuardFile, MissCheck};
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

/// "yes", or "NO: why".
fn holds(failures: &[String]) -> String {
    if failures.is_empty() {
        "yes".into()
    } else {
        format!("NO: {}", failures.join("; "))
    }
}

/// The columns of the guard tables.
pub const GUARD_HEADER: [&str; 7] = [
    "guard",
    "rows",
    "median (bound)",
    "worst (bound)",
    "signed (bound)",
    "coverage (bound)",
    "holds",
];

/// A guard's row: its figures against its bounds, and whether it holds.
pub fn guard_cells(c: &GuardCheck) -> Vec<String> {
    let g = &c.guard;
    vec![
        g.id.clone(),
        c.stats.predicted.to_string(),
        against(c.stats.median, Some(g.median)),
        against(c.stats.worst, Some(g.worst)),
        match g.signed {
            Some(_) => against(c.stats.mean_signed.map(f64::abs), g.signed),
            None => signed(c.stats.mean_signed),
        },
        against(c.stats.coverage(), g.coverage),
        holds(&c.failures),
    ]
}

/// A known miss's row, as [`guard_cells`].
pub fn miss_cells(m: &MissCheck) -> Vec<String> {
    vec![
        format!("miss {} #{}", m.miss.source, m.miss.row),
        "1".into(),
        "-".into(),
        against(m.error.map(f64::abs), Some(m.miss.bound)),
        "-".into(),
        "-".into(),
        holds(&m.failures),
    ]
}

/// The guards (each against its bounds) and the known misses, with why each misses.
pub fn guards(checks: &[GuardCheck], misses: &[MissCheck]) -> String {
    let mut t = table(&GUARD_HEADER);
    for c in checks {
        t.add_row(guard_cells(c));
    }
    for m in misses {
        t.add_row(miss_cells(m));
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

/// The columns of the goal tables.
pub const GOAL_HEADER: [&str; 7] = [
    "goal",
    "rows of",
    "median / goal",
    "worst / goal",
    "signed mean / goal",
    "coverage / goal",
    "missed",
];

/// A goal's row for the figures `s` of `key` (a source, or "all").
pub fn goal_cells(g: &Goal, key: &str, s: &Stats) -> Vec<String> {
    let missed = g.misses(s);
    vec![
        g.name.clone(),
        key.to_string(),
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
    ]
}

/// Each goal beside today's figures, with what is still missed.
pub fn goals(checks: &[GoalCheck]) -> String {
    let mut t = table(&GOAL_HEADER);
    for c in checks {
        for (key, s) in &c.figures {
            t.add_row(goal_cells(&c.goal, key, s));
        }
    }
    t.to_string()
}

/// The columns of the row tables.
pub const ROW_HEADER: [&str; 9] = [
    "source",
    "#",
    "row",
    "measured s",
    "predicted s",
    "error",
    "p10-p90 s",
    "fits",
    "notes",
];

/// Every row of the report.
pub fn rows(report: &Report) -> String {
    let mut t = table(&ROW_HEADER);
    for r in &report.rows {
        t.add_row(row_cells(r));
    }
    right_align(&mut t, 3);
    t.to_string()
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// One row's cells: source, index, label, measured and predicted step, error, interval (or
/// whether the leave-one-source-out one holds it), parsim's fits verdict, and notes (why it is not
/// expressible, an out-of-memory run, labelled memory against parsim's peak, the row's own
/// settings).
pub fn row_cells(r: &Row) -> Vec<String> {
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
    if let Some(m) = r.measured.memory_bytes {
        notes.push(format!(
            "memory {}, predicted {}",
            gib(m),
            r.predicted().map_or("-".into(), |p| gib(p.peak_bytes))
        ));
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
