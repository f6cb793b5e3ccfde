//! The run section (`--train-tokens`) as the CLI prints it and the GUI shows it: one row
//! per figure, with the terms behind the wall time.

use super::table::{right_align, table};
use crate::planning::RunForecast;

/// A token count as people write it: 15.6T, 300B, 2.5M, or the integer below a thousand.
pub fn tokens(n: u64) -> String {
    let v = n as f64;
    for (scale, suffix) in [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")] {
        if v >= scale {
            return format!("{}{suffix}", trim(v / scale));
        }
    }
    n.to_string()
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bytes in the largest binary unit that keeps the figure at or above 1.
fn bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", units[i])
}

/// The (name, value) rows of the run, in the order of the JSON section.
pub fn run_rows(r: &RunForecast) -> Vec<(String, String)> {
    let mut rows = vec![
        ("tokens".to_string(), tokens(r.tokens)),
        ("steps".to_string(), r.steps.to_string()),
        ("wall time".to_string(), format!("{:.2} days", r.wall_days)),
        (
            "  training (steps x step time)".into(),
            format!("{:.2} days", r.compute_days),
        ),
        (
            "  checkpoint stalls".into(),
            format!("{:.2} days", r.checkpoint_days),
        ),
        (
            "  failures (restart, restore, lost work)".into(),
            format!("{:.2} days", r.failure_days),
        ),
        ("GPU-hours".to_string(), format!("{:.0}", r.gpu_hours)),
    ];
    match r.energy_mwh {
        Some(e) => rows.push(("energy (facility, with PUE)".into(), format!("{e:.1} MWh"))),
        None => rows.push(("energy".into(), "- (no GPU power figures)".into())),
    }
    match r.cost_usd {
        Some(c) => rows.push(("cost".into(), format!("${c:.0}"))),
        None => rows.push(("cost".into(), "- (no price set)".into())),
    }
    rows.extend([
        (
            "goodput".to_string(),
            format!("{:.1}%", 100.0 * r.goodput_fraction),
        ),
        (
            "checkpoint interval".into(),
            format!("{:.0} s", r.checkpoint_interval_s),
        ),
        ("checkpoint size".into(), bytes(r.checkpoint_bytes)),
        (
            "checkpoint write / stall".into(),
            format!(
                "{:.1} s / {:.1} s",
                r.checkpoint_write_s, r.checkpoint_stall_s
            ),
        ),
        (
            "restart (with restore)".into(),
            format!("{:.0} s", r.restart_s),
        ),
        (
            "expected interruptions".into(),
            format!("{:.1}", r.expected_interruptions),
        ),
    ]);
    if let (Some(d), Some(m)) = (r.deadline_days, r.deadline_margin_days) {
        rows.push(("deadline".into(), deadline_verdict(d, m)));
    }
    if let Some(m) = r.job_mtbf_hours {
        rows.push(("job MTBF".into(), format!("{m:.2} h")));
    }
    if let Some(p) = r.gpu_power_w {
        rows.push((
            format!(
                "GPU power training ({:.0}% busy)",
                100.0 * r.gpu_utilization
            ),
            format!("{p:.0} W"),
        ));
    }
    rows
}

/// Whether a run meets its deadline of `deadline_days`, by its margin (negative: late).
pub fn deadline_verdict(deadline_days: f64, margin_days: f64) -> String {
    if margin_days >= 0.0 {
        format!("{deadline_days:.1} days: met, {margin_days:.2} days to spare")
    } else {
        format!(
            "{deadline_days:.1} days: missed by {:.2} days",
            -margin_days
        )
    }
}

/// The run table, followed by its notes.
pub fn run_text(r: &RunForecast) -> String {
    let mut t = table(&["run", "value"]);
    for (k, v) in run_rows(r) {
        t.add_row(vec![k, v]);
    }
    right_align(&mut t, 1);
    let mut out = format!("{t}\n");
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// The runs of several configurations side by side (`compare`): one column each, a dash
/// where a column has no run.
pub fn runs_text(labels: &[String], runs: &[Option<RunForecast>]) -> String {
    let mut header = vec!["run"];
    header.extend(labels.iter().map(String::as_str));
    let mut t = table(&header);
    let columns: Vec<Vec<(String, String)>> = runs
        .iter()
        .map(|r| r.as_ref().map(run_rows).unwrap_or_default())
        .collect();
    let names: Vec<String> = columns
        .iter()
        .max_by_key(|c| c.len())
        .map(|c| c.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    for name in names {
        let mut row = vec![name.clone()];
        for c in &columns {
            let v = c
                .iter()
                .find(|(k, _)| k.starts_with(name.split(" (").next().unwrap_or("")));
            row.push(v.map_or("-".to_string(), |(_, v)| v.clone()));
        }
        t.add_row(row);
    }
    right_align(&mut t, 1);
    let mut out = format!("{t}\n");
    let mut notes: Vec<&String> = runs.iter().flatten().flat_map(|r| &r.notes).collect();
    notes.dedup();
    for n in notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_print_as_written() {
        assert_eq!(tokens(15_600_000_000_000), "15.6T");
        assert_eq!(tokens(300_000_000_000), "300B");
        assert_eq!(tokens(999), "999");
        assert_eq!(tokens(1_500), "1.5K");
    }
}
