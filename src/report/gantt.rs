//! Gantt charts of simulated schedules (SVG and PNG through plotters).
//!
//! One row per pipeline rank (rank 0 on top), time running right, one bar per action. The
//! bar's hue is its microbatch; its shade is its kind: forward light, input-gradient I medium,
//! full backward B dark, weight-gradient W darkest. The number in a bar (when it fits) is the
//! model chunk on that rank. An overlapped DualPipe-V slot is drawn as its forward over its
//! backward in the two halves of one bar. The title gives the bubble share. Several schedules
//! are stacked on one time axis, and a legend closes the picture.
//!
//! Text needs a font (PNG to render it, SVG to measure it): the DejaVu Sans shipped in `assets/fonts` is registered with
//! plotters (feature `ab_glyph`) before drawing, since the system font path is not built in.

use crate::schedule::{ActionKind, Overlap, Program, Simulation};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use thiserror::Error;

use super::font::FONT;

/// Why a chart could not be drawn.
#[derive(Debug, Error)]
pub enum GanttError {
    /// No schedule given.
    #[error("nothing to draw: no schedule given")]
    Empty,
    /// The requested size is too small to hold the chart.
    #[error("chart size {width}x{height} is too small (at least 320x160 per schedule)")]
    TooSmall { width: u32, height: u32 },
    /// The requested size is beyond [`MAX_SIDE_PX`] (the bitmap alone would take gigabytes).
    #[error(
        "chart size {width}x{height} is too large (--size: at most {MAX_SIDE_PX} pixels a side)"
    )]
    TooLarge { width: u32, height: u32 },
    /// The shipped font could not be loaded.
    #[error("the shipped font assets/fonts/DejaVuSans.ttf could not be loaded")]
    Font,
    /// plotters failed (for example, the file could not be written).
    #[error("cannot draw the chart to {path}: {message}")]
    Draw { path: String, message: String },
}

/// Registers the shipped font ([`super::font`]).
fn ensure_font() -> Result<(), GanttError> {
    if super::font::ensure() {
        Ok(())
    } else {
        Err(GanttError::Font)
    }
}

/// The widest and tallest chart drawn, in pixels: an 8192 x 8192 PNG is 200 MB of RGB
/// before encoding; plotters panics on sizes near 65536.
pub const MAX_SIDE_PX: u32 = 8192;

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
) -> Result<(), GanttError> {
    check(runs, size)?;
    // SVG text is measured for layout, which needs the font as well.
    ensure_font()?;
    let root = SVGBackend::new(path, size).into_drawing_area();
    draw(&root, runs).map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

/// Writes a PNG Gantt chart of `runs` (stacked) of `size` pixels to `path`.
pub fn write_png(
    path: &Path,
    runs: &[(&Program, &Simulation)],
    size: (u32, u32),
) -> Result<(), GanttError> {
    check(runs, size)?;
    ensure_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    draw(&root, runs).map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

fn check(runs: &[(&Program, &Simulation)], size: (u32, u32)) -> Result<(), GanttError> {
    if runs.is_empty() {
        return Err(GanttError::Empty);
    }
    if size.0 > MAX_SIDE_PX || size.1 > MAX_SIDE_PX {
        return Err(GanttError::TooLarge {
            width: size.0,
            height: size.1,
        });
    }
    if size.0 < 320 || (size.1 as u64) < 160 * runs.len() as u64 {
        return Err(GanttError::TooSmall {
            width: size.0,
            height: size.1,
        });
    }
    Ok(())
}

fn draw_err<E: std::error::Error + Send + Sync>(
    path: &Path,
    e: DrawingAreaErrorKind<E>,
) -> GanttError {
    GanttError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Colour of an action: hue from the microbatch, shade from the kind.
pub fn action_color(microbatch: u32, kind: ActionKind) -> HSLColor {
    let hue = (microbatch as f64 * 0.618_033_988_75).fract();
    let light = match kind {
        ActionKind::F => 0.80,
        ActionKind::I => 0.60,
        ActionKind::B => 0.42,
        ActionKind::W => 0.28,
    };
    HSLColor(hue, 0.65, light)
}

fn text_color(kind: ActionKind) -> RGBColor {
    match kind {
        ActionKind::F | ActionKind::I => BLACK,
        ActionKind::B | ActionKind::W => WHITE,
    }
}

type DrawResult<E> = Result<(), DrawingAreaErrorKind<E>>;

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
    let mut labels: Vec<Text<(f64, f64), String>> = Vec::new();
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        let y0 = band(r as u32) + 0.08;
        let y1 = band(r as u32) + 0.92;
        for (a, s) in acts.iter().zip(spans) {
            let (lo, hi) = match a.overlap {
                Overlap::None => (y0, y1),
                Overlap::First => ((y0 + y1) / 2.0, y1),
                Overlap::Second => (y0, (y0 + y1) / 2.0),
            };
            let color = action_color(a.microbatch, a.kind);
            bars.push(Rectangle::new([(s.start, lo), (s.end, hi)], color.filled()));
            outlines.push(Rectangle::new(
                [(s.start, lo), (s.end, hi)],
                WHITE.stroke_width(1),
            ));
            let width_px = (s.end - s.start) * px_per_unit;
            let height_px = (hi - lo) * row_px;
            if width_px >= 9.0 && height_px >= 8.0 {
                let fsize = font_px.min(height_px * 0.9);
                let style = (FONT, fsize)
                    .into_font()
                    .color(&text_color(a.kind))
                    .pos(Pos::new(HPos::Center, VPos::Center));
                labels.push(Text::new(
                    program.chunk_of_stage(a.stage).to_string(),
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
            action_color(0, kind).filled(),
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
            action_color(mb, ActionKind::I).filled(),
        ))?;
        area.draw(&Text::new(
            mb.to_string(),
            (x + 11, y + 8),
            text.clone().pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        x += 26;
    }
    area.draw(&Text::new(
        "number in bar = chunk on the rank".to_string(),
        (x + 14, y + 2),
        text,
    ))?;
    Ok(())
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
