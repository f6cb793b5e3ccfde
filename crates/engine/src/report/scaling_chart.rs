//! The GPU-count sweep of `parsim search --gpus LOW..HIGH --png`: the best mix's step time
//! (top panel) and tokens per second (bottom panel) against the GPU count, on a log2 axis.
//! Counts where no mix fits are left out.

use super::chart::{self, rgb, Chart, ChartError, DrawResult};
use super::colors::Rgb;
use super::font::FONT;
use crate::scaling::ScalingResult;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// The default picture size in pixels.
pub const DEFAULT_SIZE: (u32, u32) = (800, 640);

/// Line colour of the step-time panel and of the throughput panel.
const STEP_COLOR: Rgb = Rgb(31, 119, 180);
const TOKENS_COLOR: Rgb = Rgb(214, 39, 40);

/// (GPU count, step seconds, tokens per second) of each count where a mix fits.
fn points(r: &ScalingResult) -> Vec<(u32, f64, f64)> {
    r.points
        .iter()
        .filter_map(|p| {
            let e = &p.best.as_ref()?.estimate;
            Some((p.gpus, e.time.step_s, e.throughput.tokens_per_s))
        })
        .collect()
}

struct ScalingChart<'a>(&'a ScalingResult);

impl Chart for ScalingChart<'_> {
    fn empty(&self) -> Option<&'static str> {
        points(self.0)
            .is_empty()
            .then_some("no GPU count in the range fits")
    }

    fn min_size(&self) -> (u32, u32) {
        (320, 320)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        root.fill(&WHITE)?;
        let pts = points(self.0);
        let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
        let step: Vec<(f64, f64)> = pts.iter().map(|p| ((p.0 as f64).log2(), p.1)).collect();
        let tokens: Vec<(f64, f64)> = pts.iter().map(|p| ((p.0 as f64).log2(), p.2)).collect();
        panel(
            &top,
            &step,
            "best step time against GPUs",
            "step (s)",
            STEP_COLOR,
        )?;
        panel(
            &bottom,
            &tokens,
            "tokens/s against GPUs",
            "tokens/s",
            TOKENS_COLOR,
        )?;
        Ok(())
    }
}

/// One panel: a line with points, x = log2(GPUs) labelled with the GPU count.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    data: &[(f64, f64)],
    title: &str,
    y_desc: &str,
    color: Rgb,
) -> DrawResult<DB::ErrorType> {
    let x0 = data.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x1 = data.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y1 = data.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let (x0, x1) = (x0 - 0.5, x1 + 0.5);
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let mut c = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, 0.0..y1)?;
    c.configure_mesh()
        .x_label_formatter(&|x| {
            let r = x.round();
            if (x - r).abs() < 1e-6 {
                format!("{}", 2f64.powf(r) as u64)
            } else {
                String::new()
            }
        })
        .x_desc("GPUs")
        .y_desc(y_desc)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    let color = rgb(color);
    c.draw_series(LineSeries::new(data.iter().copied(), color.stroke_width(2)))?;
    c.draw_series(data.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    Ok(())
}

/// Writes the sweep as a PNG of `size` pixels to `path`.
pub fn write_png(path: &Path, r: &ScalingResult, size: (u32, u32)) -> Result<(), ChartError> {
    chart::write_png(path, &ScalingChart(r), size)
}
