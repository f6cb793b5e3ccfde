//! The `parsim schedule --compare` table: one row per schedule.

use super::csv::Csv;
use crate::schedule::{closed_form, parameter_copies, Costs, Program, ScheduleKind, Simulation};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};

/// The textbook bubble fraction of `p` with the costs of stage 0 everywhere, where one applies.
fn textbook_bubble(p: &Program, c: &Costs) -> Option<f64> {
    let (f, b, w) = (c.forward[0], c.backward[0], c.weight_grad[0]);
    let m = p.microbatches as f64;
    match p.kind {
        ScheduleKind::Gpipe | ScheduleKind::OneFOneB => {
            Some(closed_form::bubble_fraction_1f1b(p.pp, p.microbatches))
        }
        ScheduleKind::Interleaved1F1B => Some(closed_form::bubble_fraction_interleaved(
            p.pp,
            p.vpp,
            p.microbatches,
        )),
        ScheduleKind::ZbH1 => Some(closed_form::bubble_zb1p(p.pp, f, b, w) / (m * (f + b))),
        ScheduleKind::DualPipeV if c.overlap_factor == 1.0 => {
            Some(closed_form::bubble_dualpipe(2 * p.pp, f + b, b, w) / (2.0 * m * (f + b)))
        }
        _ => None,
    }
}

/// The [`compare_table`] as CSV, numbers unrounded and fractions as fractions (the textbook
/// column empty where none applies; peaks space-separated).
pub fn compare_csv(runs: &[(&Program, &Simulation, &Costs)]) -> String {
    let mut out = Csv::new(&[
        "schedule",
        "pp",
        "vpp",
        "microbatches",
        "makespan",
        "bubble_fraction",
        "textbook_bubble_fraction",
        "idle_over_makespan",
        "peak_inflight_per_rank",
        "largest_peak_in_stage_sets",
        "param_copies_per_rank",
    ]);
    for (p, s, c) in runs {
        let peaks: Vec<String> = s.peak_inflight.iter().map(ToString::to_string).collect();
        let largest = s.peak_inflight.iter().copied().max().unwrap_or(0) as f64 / p.vpp as f64;
        out.row([
            p.kind.as_str().to_string(),
            p.pp.to_string(),
            p.vpp.to_string(),
            p.microbatches.to_string(),
            s.makespan.to_string(),
            s.bubble_fraction.to_string(),
            textbook_bubble(p, c).map_or_else(String::new, |v| v.to_string()),
            s.idle_over_makespan.to_string(),
            peaks.join(" "),
            largest.to_string(),
            parameter_copies(p.kind).to_string(),
        ]);
    }
    out.finish()
}

/// A table of makespan, bubble fraction, idle share, per-rank peak activations and
/// parameter copies per rank, with the textbook bubble fraction beside the simulated one
/// where one applies: Narayanan et al. 2021 for GPipe, 1F1B and interleaved 1F1B, the
/// DualPipe README for ZB-H1 (ZB1P) and DualPipe-V. The textbook figures assume the costs of
/// stage 0 on every stage and free communication; they are shown for comparison only.
pub fn compare_table(runs: &[(&Program, &Simulation, &Costs)]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "schedule",
        "vpp",
        "makespan",
        "bubble (of ideal)",
        "textbook (uniform, free comm.)",
        "idle / makespan",
        "peak live activation sets per rank (chunk-sized)",
        "largest, in stage-sized sets",
        "param copies / rank",
    ]);
    for (p, s, c) in runs {
        let textbook = textbook_bubble(p, c)
            .map(|v| format!("{:.1}%", 100.0 * v))
            .unwrap_or_else(|| "-".into());
        let peaks: Vec<String> = s.peak_inflight.iter().map(ToString::to_string).collect();
        t.add_row(vec![
            Cell::new(p.kind.as_str()),
            Cell::new(p.vpp).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.4}", s.makespan)).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.1}%", 100.0 * s.bubble_fraction))
                .set_alignment(CellAlignment::Right),
            Cell::new(textbook).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.1}%", 100.0 * s.idle_over_makespan))
                .set_alignment(CellAlignment::Right),
            Cell::new(peaks.join(" ")),
            Cell::new(format!(
                "{:.1}",
                s.peak_inflight.iter().copied().max().unwrap_or(0) as f64 / p.vpp as f64
            ))
            .set_alignment(CellAlignment::Right),
            Cell::new(parameter_copies(p.kind)).set_alignment(CellAlignment::Right),
        ]);
    }
    t
}
