//! Terminal timeline of a simulated schedule: ranks as rows, time as columns.
//!
//! Each column is one time step (the shortest action, or longer when the timeline would not
//! fit `max_columns`). An action's first cell shows its kind, microbatch and, with several
//! chunks per rank, its chunk (`F3.1` = forward of microbatch 3, chunk 1); the cells it goes
//! on for show `-`; idle cells show `.`. An overlapped DualPipe-V slot shows its forward label
//! then its backward label. With `color`, cells get an ANSI colour per microbatch: forwards
//! plain, full backwards bold reverse video, I reverse video, W underlined. When the columns
//! are coarser than the shortest action, a later action can cover an earlier one's cell: a
//! closing line says how many actions are not drawn and which `max_columns` draws them all.

use crate::schedule::{ActionKind, Overlap, Program, Simulation};
use std::fmt::Write as _;

const PALETTE: [u8; 12] = [33, 166, 34, 160, 91, 130, 169, 244, 142, 37, 202, 63];

#[derive(Clone)]
struct Cell {
    text: String,
    style: Option<(u32, ActionKind)>,
}

/// Renders the timeline; `max_columns` bounds the number of time steps drawn.
pub fn render(program: &Program, sim: &Simulation, color: bool, max_columns: usize) -> String {
    let multi_chunk = program.vpp > 1;
    let label = |kind: ActionKind, mb: u32, stage: u32| {
        if multi_chunk {
            format!("{kind}{mb}.{}", program.chunk_of_stage(stage))
        } else {
            format!("{kind}{mb}")
        }
    };
    let mut min_dur = f64::INFINITY;
    let mut width = 2;
    for (acts, spans) in program.ranks.iter().zip(&sim.timeline) {
        for (a, s) in acts.iter().zip(spans) {
            let d = s.end - s.start;
            let d = if a.overlap == Overlap::None {
                d
            } else {
                d / 2.0
            };
            if d > 0.0 {
                min_dur = min_dur.min(d);
            }
            width = width.max(label(a.kind, a.microbatch, a.stage).len());
        }
    }
    if sim.makespan.is_nan() || sim.makespan <= 0.0 || !min_dur.is_finite() {
        return String::from("(empty timeline)\n");
    }
    let max_columns = max_columns.max(8);
    let mut dt = min_dur;
    let mut columns = (sim.makespan / dt).ceil() as usize;
    let natural_columns = columns;
    let (mut drawn, mut total) = (0usize, 0usize);
    if columns > max_columns {
        dt = sim.makespan / max_columns as f64;
        columns = max_columns;
    }
    let to_col = |t: f64| ((t / dt).round() as usize).min(columns);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} | pp {} | vpp {} | {} microbatches | one column = {} time units",
        program.kind,
        program.pp,
        program.vpp,
        program.microbatches,
        trim(dt)
    );
    let gutter = format!("rank {}", program.pp.saturating_sub(1)).len() + 1;
    // time axis: a tick every 5 columns
    let mut axis = " ".repeat(gutter + 1);
    for c in (0..columns).step_by(5) {
        let t = trim(c as f64 * dt);
        let cell = format!("{:<w$}", t, w = 5 * (width + 1));
        axis.push_str(&cell);
    }
    let _ = writeln!(out, "{}", axis.trim_end());
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        let mut cells = vec![
            Cell {
                text: ".".repeat(width),
                style: None,
            };
            columns
        ];
        // Which action's label each cell shows, to count the actions left with none.
        let mut label_of: Vec<Option<usize>> = vec![None; columns];
        let mut k = 0;
        while k < acts.len() {
            let a = &acts[k];
            let s = spans[k];
            let c0 = to_col(s.start).min(columns - 1);
            let c1 = to_col(s.end).max(c0 + 1).min(columns);
            let halves: Vec<&crate::schedule::ComputeAction> = if a.overlap == Overlap::First {
                acts.get(k + 1).into_iter().fold(vec![a], |mut v, b| {
                    v.push(b);
                    v
                })
            } else {
                vec![a]
            };
            for (c, cell) in cells.iter_mut().enumerate().take(c1).skip(c0) {
                let off = c - c0;
                let which = if halves.len() == 2 && (off >= (c1 - c0) / 2 && c1 - c0 > 1) {
                    halves[1]
                } else {
                    halves[0]
                };
                let first_cell_of_half =
                    off == 0 || (halves.len() == 2 && off == (c1 - c0) / 2 && c1 - c0 > 1);
                if first_cell_of_half {
                    let id = if std::ptr::eq(which, halves[0]) {
                        k
                    } else {
                        k + 1
                    };
                    label_of[c] = Some(id);
                } else if label_of[c].is_some() {
                    label_of[c] = None;
                }
                cell.text = if first_cell_of_half {
                    format!(
                        "{:<w$}",
                        label(which.kind, which.microbatch, which.stage),
                        w = width
                    )
                } else {
                    "-".repeat(width)
                };
                cell.style = Some((which.microbatch, which.kind));
            }
            k += halves.len();
        }
        total += acts.len();
        let mut shown: Vec<usize> = label_of.into_iter().flatten().collect();
        shown.sort_unstable();
        shown.dedup();
        drawn += shown.len();
        let _ = write!(out, "{:<g$}|", format!("rank {r}"), g = gutter);
        write_cells(&mut out, &cells, color);
        let _ = writeln!(
            out,
            "| idle {} | peak {}",
            trim(sim.idle[r]),
            sim.peak_inflight[r]
        );
    }
    if drawn < total {
        let _ = writeln!(
            out,
            "note: {} of {total} actions are narrower than a column and not drawn; --max-columns {natural_columns} draws every one",
            total - drawn
        );
    }
    out
}

/// One rank's cells, each with its ANSI colour and attribute when `color`.
fn write_cells(out: &mut String, cells: &[Cell], color: bool) {
    for cell in cells {
        match (color, cell.style) {
            (true, Some((mb, kind))) => {
                let fg = PALETTE[mb as usize % PALETTE.len()];
                let attr = match kind {
                    ActionKind::F => "",
                    ActionKind::B => "1;7;",
                    ActionKind::I => "7;",
                    ActionKind::W => "4;",
                };
                let _ = write!(out, "\x1b[{attr}38;5;{fg}m{}\x1b[0m ", cell.text);
            }
            _ => {
                let _ = write!(out, "{} ", cell.text);
            }
        }
    }
}

/// A compact decimal: at most 4 significant decimals, no trailing zeros.
fn trim(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{generate, simulate, Costs, ScheduleKind};

    fn timeline(m: u32, max_columns: usize) -> String {
        let p = generate(ScheduleKind::OneFOneB, 4, 1, m).unwrap();
        let c = Costs::uniform(4, 1, 1.0, 2.0, None, 0.0).unwrap();
        render(&p, &simulate(&p, &c).unwrap(), false, max_columns)
    }

    /// 1F1B on 4 ranks with 32 microbatches lasts (m + p - 1)(F + B) = 35 x 3 = 105 forward
    /// times: at one column per forward every action has its cell; at 40 columns, several
    /// 1-unit forwards share a column, so some are covered, and the note says so.
    #[test]
    fn dropped_actions_are_counted_and_named() {
        let full = timeline(32, 200);
        assert!(!full.contains("not drawn"), "{full}");
        let coarse = timeline(32, 40);
        let note = coarse.lines().last().unwrap();
        assert!(
            note.contains("of 256 actions are narrower than a column"),
            "{note}"
        );
        assert!(
            note.ends_with("--max-columns 105 draws every one"),
            "{note}"
        );
    }
}
