//! Per-GPU memory as a stacked bar chart (SVG and PNG through plotters): one bar per pipeline
//! rank, stacked weights, gradients, optimizer states, activations and buffers, in GiB, with a
//! line at the GPU's capacity. Bars over the capacity get a red outline and the title turns
//! red when the most loaded GPU does not fit.
//!
//! The writers, the size check and the font are [`super::chart`]'s; the component colours
//! are [`super::colors::MEMORY_PARTS`] (the GUI's memory chart uses the same).

use crate::estimate::MemoryReport;
use crate::memory::StageMemory;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

use super::chart::{self, rgb, Chart, ChartError, DrawResult};
use super::colors::MEMORY_PARTS;
use super::font::FONT;
const GIB: f64 = (1u64 << 30) as f64;

/// The per-GPU memory chart of one estimate.
#[derive(Debug)]
pub struct MemoryChart<'a>(pub &'a MemoryReport);

impl Chart for MemoryChart<'_> {
    fn empty(&self) -> Option<&'static str> {
        self.0
            .stages
            .is_empty()
            .then_some("the memory report has no stages")
    }

    fn min_size(&self) -> (u32, u32) {
        (320, 200)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        draw(root, self.0)
    }
}

/// Bytes of each component of one stage, in [`MEMORY_PARTS`] order.
pub fn stage_parts(s: &StageMemory) -> [u64; 5] {
    [
        s.weights,
        s.gradients,
        s.optimizer,
        s.activations,
        s.buffers,
    ]
}

/// The title line: the most loaded GPU against the capacity, in GiB, with the caching
/// allocator's reserved peak where it exceeds the allocated one (what "fits" is decided on).
pub fn headline(m: &MemoryReport) -> String {
    let reserved = match m.reserved_peak_bytes() {
        Some(r) => format!(" ({:.2} GiB reserved)", r as f64 / GIB),
        None => String::new(),
    };
    format!(
        "Peak memory per GPU: {:.2} GiB{reserved} of {:.2} GiB ({})",
        m.per_gpu_max_bytes as f64 / GIB,
        m.capacity_bytes as f64 / GIB,
        if m.fits { "fits" } else { "does not fit" }
    )
}

/// A size that gives every pipeline rank about 60 pixels (at least 640 wide).
pub fn default_size(m: &MemoryReport) -> (u32, u32) {
    ((160 + 60 * m.stages.len().min(64) as u32).max(640), 480)
}

/// Writes an SVG chart of `m` of `size` pixels to `path`.
pub fn write_svg(path: &Path, m: &MemoryReport, size: (u32, u32)) -> Result<(), ChartError> {
    chart::write_svg(path, &MemoryChart(m), size)
}

/// An SVG chart of `m` of `size` pixels, as a string.
pub fn svg_string(m: &MemoryReport, size: (u32, u32)) -> Result<String, ChartError> {
    chart::svg_string(&MemoryChart(m), size)
}

/// Writes a PNG chart of `m` of `size` pixels to `path`.
pub fn write_png(path: &Path, m: &MemoryReport, size: (u32, u32)) -> Result<(), ChartError> {
    chart::write_png(path, &MemoryChart(m), size)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    m: &MemoryReport,
) -> DrawResult<DB::ErrorType> {
    root.fill(&WHITE)?;
    let capacity = m.capacity_bytes as f64 / GIB;
    let top = m
        .stages
        .iter()
        .map(|s| s.total as f64 / GIB)
        .fold(capacity, f64::max)
        * 1.1;
    let n = m.stages.len();
    let title = headline(m);
    let title_color = if m.fits { BLACK } else { RED };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 18).into_font().color(&title_color))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..top)?;
    let step = (n / 16).max(1);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.min(17))
        .x_label_formatter(&|x| {
            let r = x.round();
            if (x - r).abs() < 1e-6 && r >= 0.0 && (r as usize) % step == 0 {
                format!("{}", r as usize)
            } else {
                String::new()
            }
        })
        .x_desc("pipeline rank")
        .y_desc("GiB")
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;

    for (i, (name, color)) in MEMORY_PARTS.iter().enumerate() {
        let color = rgb(*color);
        let bars = m.stages.iter().enumerate().map(|(k, s)| {
            let parts = stage_parts(s);
            let below: u64 = parts[..i].iter().sum();
            let y0 = below as f64 / GIB;
            let y1 = (below + parts[i]) as f64 / GIB;
            let x = k as f64;
            Rectangle::new([(x - 0.35, y0), (x + 0.35, y1)], color.filled())
        });
        chart
            .draw_series(bars)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    let over = m
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.total > m.capacity_bytes)
        .map(|(k, s)| {
            let x = k as f64;
            Rectangle::new(
                [(x - 0.35, 0.0), (x + 0.35, s.total as f64 / GIB)],
                RED.stroke_width(2),
            )
        });
    chart.draw_series(over)?;
    let line = if m.fits { BLACK } else { RED };
    chart
        .draw_series(LineSeries::new(
            [(-0.5, capacity), (n as f64 - 0.5, capacity)],
            line.stroke_width(2),
        ))?
        .label(format!("capacity {capacity:.1} GiB"))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], line.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 12))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(total_gib: &[u64], capacity_gib: u64) -> MemoryReport {
        let stages: Vec<StageMemory> = total_gib
            .iter()
            .enumerate()
            .map(|(i, &t)| StageMemory {
                stage: i as u32,
                weights: t << 29,
                gradients: t << 28,
                optimizer: t << 28,
                activations: 0,
                buffers: 0,
                total: t << 30,
                ..StageMemory::default()
            })
            .collect();
        MemoryReport {
            per_gpu_max_bytes: total_gib.iter().max().copied().unwrap_or(0) << 30,
            capacity_bytes: capacity_gib << 30,
            fits: total_gib.iter().all(|&t| t <= capacity_gib),
            margin_fraction: 0.0,
            usable_bytes: capacity_gib << 30,
            stages,
            ..MemoryReport::default()
        }
    }

    #[test]
    fn writes_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let m = report(&[30, 40, 90, 20], 80);
        let svg = dir.path().join("m.svg");
        write_svg(&svg, &m, default_size(&m)).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("does not fit"));
        assert!(text.contains("capacity 80.0 GiB"));
        let png = dir.path().join("m.png");
        write_png(&png, &m, (640, 400)).unwrap();
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    }

    #[test]
    fn rejects_empty_and_tiny() {
        let m = report(&[], 80);
        assert!(matches!(
            write_svg(Path::new("x.svg"), &m, (640, 480)),
            Err(ChartError::Empty { .. })
        ));
        let m = report(&[1], 80);
        assert!(matches!(
            write_svg(Path::new("x.svg"), &m, (100, 100)),
            Err(ChartError::TooSmall { .. })
        ));
    }
}
