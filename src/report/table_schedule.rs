//! The `parsim schedule --compare` table: one row per schedule.

use crate::schedule::{closed_form, parameter_copies, Program, ScheduleKind, Simulation};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};

/// A table of makespan, bubble fraction, idle share, per-rank peak activations and
/// parameter copies per rank, with the textbook bubble fraction beside the simulated one
/// where one applies (uniform costs, free communication).
pub fn compare_table(runs: &[(&Program, &Simulation)]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "schedule",
        "vpp",
        "makespan",
        "bubble (of ideal)",
        "textbook",
        "idle / makespan",
        "peak activations per rank",
        "param copies / rank",
    ]);
    for (p, s) in runs {
        let textbook = match p.kind {
            ScheduleKind::Gpipe | ScheduleKind::OneFOneB => {
                format!(
                    "{:.1}%",
                    100.0 * closed_form::bubble_fraction_1f1b(p.pp, p.microbatches)
                )
            }
            ScheduleKind::Interleaved1F1B => format!(
                "{:.1}%",
                100.0 * closed_form::bubble_fraction_interleaved(p.pp, p.vpp, p.microbatches)
            ),
            _ => "-".into(),
        };
        let peaks: Vec<String> = s.peak_inflight.iter().map(|x| x.to_string()).collect();
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
            Cell::new(parameter_copies(p.kind)).set_alignment(CellAlignment::Right),
        ]);
    }
    t
}
