//! Gantt charts of simulated schedules (SVG and PNG through plotters).
//!
//! One row per pipeline rank (rank 0 on top), time running right, one bar per action. The
//! bar's hue is its microbatch; its shade is its kind: forward light, input-gradient I medium,
//! full backward B dark, weight-gradient W darkest. The number in a bar (when it fits) is its
//! microbatch, with `.chunk` after it when a rank holds several model chunks (`3.1`, as the
//! ASCII timeline writes it): hues recur over many microbatches, the number never does. An overlapped DualPipe-V slot is drawn as its forward over its
//! backward in the two halves of one bar. The title gives the bubble share. Several schedules
//! are stacked on one time axis, and a legend closes the picture.
//!
//! The writers, the size check and the font are [`super::chart`]'s; the colours are
//! [`super::colors`]' (the GUI's timeline uses the same).

use crate::schedule::{ActionKind, Overlap, Program, Simulation};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

use super::chart::{self, rgb, Chart, ChartError, DrawResult};
use super::colors::{action_color, action_text_color};
use super::font::FONT;

/// Stacked Gantt charts of simulated schedules sharing one time axis.
#[derive(Debug)]
pub struct Gantt<'a>(pub &'a [(&'a Program, &'a Simulation)]);

impl Chart for Gantt<'_> {
    fn empty(&self) -> Option<&'static str> {
        self.0.is_empty().then_some("no schedule given")
    }

    /// At least 320 wide and 160 high per schedule.
    fn min_size(&self) -> (u32, u32) {
        (320, 160 * self.0.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        draw(root, self.0)
    }
}

/// A size that gives every rank row about 26 pixels.
pub fn default_size(runs: &[(&Program, &Simulation)]) -> (u32, u32) {
    let rows: u32 = runs.iter().map(|(p, _)| 90 + 26 * p.pp.min(64)).sum();
    (1400, rows + 50)
}

/// Writes an SVG Gantt chart of `runs` (stacked) of `size` pixels to `path`.
pub fn write_svg(
    path: &Path,
    runs: &[(&Program, &Simulation)],
    size: (u32, u32),
) -> Result<(), ChartError> {
    chart::write_svg(path, &Gantt(runs), size)
}

/// An SVG Gantt chart of `runs` (stacked) of `size` pixels, as a string.
pub fn svg_string(
    runs: &[(&Program, &Simulation)],
    size: (u32, u32),
) -> Result<String, ChartError> {
    chart::svg_string(&Gantt(runs), size)
}

/// Writes a PNG Gantt chart of `runs` (stacked) of `size` pixels to `path`.
pub fn write_png(
    path: &Path,
    runs: &[(&Program, &Simulation)],
    size: (u32, u32),
) -> Result<(), ChartError> {
    chart::write_png(path, &Gantt(runs), size)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(&Program, &Simulation)],
) -> DrawResult<DB::ErrorType> {
    root.fill(&WHITE)?;
    let (_, height) = root.dim_in_pixel();
    let legend_h = 44i32;
    let (charts, legend) = root.split_vertically(height as i32 - legend_h);
    let xmax = runs
        .iter()
        .map(|(_, s)| s.makespan)
        .fold(0.0f64, f64::max)
        .max(1e-12);
    // split the chart area in proportion to each schedule's row count
    let weights: Vec<f64> = runs.iter().map(|(p, _)| 3.0 + p.pp as f64).collect();
    let total: f64 = weights.iter().sum();
    let (_, ch) = charts.dim_in_pixel();
    let mut acc = 0.0;
    let mut breaks = Vec::new();
    for w in &weights[..weights.len() - 1] {
        acc += w;
        breaks.push((acc / total * ch as f64).round() as i32);
    }
    let no_x: [i32; 0] = [];
    let areas = charts.split_by_breakpoints(no_x, breaks);
    for (area, (program, sim)) in areas.iter().zip(runs) {
        draw_one(area, program, sim, xmax)?;
    }
    draw_legend(&legend, runs)?;
    Ok(())
}

fn draw_one<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    program: &Program,
    sim: &Simulation,
    xmax: f64,
) -> DrawResult<DB::ErrorType> {
    let pp = program.pp;
    let title = format!(
        "{}: pp {}, vpp {}, {} microbatches | bubble {:.1}% of ideal compute, \
         idle {:.1}% of makespan | makespan {}",
        program.kind,
        pp,
        program.vpp,
        program.microbatches,
        100.0 * sim.bubble_fraction,
        100.0 * sim.idle_over_makespan,
        short(sim.makespan)
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(6)
        .margin_right(16)
        .x_label_area_size(30)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..xmax, 0.0..pp as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .y_label_formatter(&|_| String::new())
        .x_desc("time")
        .x_label_formatter(&|x| short(*x))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 12))
        .draw()?;

    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let px_per_unit = (xr.end - xr.start) as f64 / xmax;
    let row_px = (yr.end - yr.start) as f64 / pp as f64;
    let band = |r: u32| (pp - 1 - r) as f64; // rank 0 on top
    let font_px = (row_px * 0.55).clamp(7.0, 12.0);
    let mut bars: Vec<Rectangle<(f64, f64)>> = Vec::new();
    let mut outlines: Vec<Rectangle<(f64, f64)>> = Vec::new();
    let mut labels: Vec<Text<'_, (f64, f64), String>> = Vec::new();
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        let y0 = band(r as u32) + 0.08;
        let y1 = band(r as u32) + 0.92;
        for (a, s) in acts.iter().zip(spans) {
            let (lo, hi) = match a.overlap {
                Overlap::None => (y0, y1),
                Overlap::First => ((y0 + y1) / 2.0, y1),
                Overlap::Second => (y0, (y0 + y1) / 2.0),
            };
            let color = rgb(action_color(a.microbatch, a.kind));
            bars.push(Rectangle::new([(s.start, lo), (s.end, hi)], color.filled()));
            outlines.push(Rectangle::new(
                [(s.start, lo), (s.end, hi)],
                WHITE.stroke_width(1),
            ));
            let width_px = (s.end - s.start) * px_per_unit;
            let height_px = (hi - lo) * row_px;
            let text = bar_label(program, a.microbatch, a.stage);
            let fsize = font_px.min(height_px * 0.9);
            // About 0.6 em a digit.
            if width_px >= 0.6 * fsize * text.len() as f64 + 3.0 && height_px >= 8.0 {
                let style = (FONT, fsize)
                    .into_font()
                    .color(&rgb(action_text_color(a.kind)))
                    .pos(Pos::new(HPos::Center, VPos::Center));
                labels.push(Text::new(
                    text,
                    ((s.start + s.end) / 2.0, (lo + hi) / 2.0),
                    style,
                ));
            }
        }
    }
    chart.draw_series(bars)?;
    chart.draw_series(outlines)?;
    chart.draw_series(labels)?;

    // rank names left of the rows, in the area's own pixel coordinates
    let (ox, oy) = area.get_base_pixel();
    let style = (FONT, 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for r in 0..pp {
        let y = yr.start as f64 + (r as f64 + 0.5) * row_px;
        if pp > 48 && r % (pp / 16) != 0 {
            continue;
        }
        area.draw(&Text::new(
            format!("rank {r}"),
            (xr.start - ox - 6, y.round() as i32 - oy),
            style.clone(),
        ))?;
    }
    Ok(())
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[(&Program, &Simulation)],
) -> DrawResult<DB::ErrorType> {
    let text = (FONT, 13).into_font().color(&BLACK);
    let mut x = 70;
    let y = 14;
    let kinds = [
        (ActionKind::F, "F forward"),
        (ActionKind::I, "I input grad"),
        (ActionKind::B, "B full backward"),
        (ActionKind::W, "W weight grad"),
    ];
    let split = runs.iter().any(|(p, _)| p.splits_backward());
    for (kind, name) in kinds {
        if !split && matches!(kind, ActionKind::I | ActionKind::W) {
            continue;
        }
        area.draw(&Rectangle::new(
            [(x, y), (x + 22, y + 16)],
            rgb(action_color(0, kind)).filled(),
        ))?;
        area.draw(&Text::new(name.to_string(), (x + 28, y + 2), text.clone()))?;
        x += 40 + 9 * name.len() as i32;
    }
    area.draw(&Text::new(
        "hue = microbatch:".to_string(),
        (x + 10, y + 2),
        text.clone(),
    ))?;
    x += 150;
    let m = runs.iter().map(|(p, _)| p.microbatches).max().unwrap_or(0);
    for mb in 0..m.min(16) {
        area.draw(&Rectangle::new(
            [(x, y), (x + 22, y + 16)],
            rgb(action_color(mb, ActionKind::I)).filled(),
        ))?;
        area.draw(&Text::new(
            mb.to_string(),
            (x + 11, y + 8),
            text.clone().pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        x += 26;
    }
    let number = if runs.iter().any(|(p, _)| p.vpp > 1) {
        "number in bar = microbatch.chunk"
    } else {
        "number in bar = microbatch"
    };
    area.draw(&Text::new(number.to_string(), (x + 14, y + 2), text))?;
    Ok(())
}

/// The text of a bar: its microbatch, and its chunk on the rank when there are several.
pub fn bar_label(program: &Program, microbatch: u32, stage: u32) -> String {
    if program.vpp > 1 {
        format!("{microbatch}.{}", program.chunk_of_stage(stage))
    } else {
        microbatch.to_string()
    }
}

fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}
