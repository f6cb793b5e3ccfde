//! Per-GPU memory as a stacked bar per pipeline rank (weights, gradients, optimizer states,
//! activations, buffers) against a line at the GPU's capacity, in GiB; red when the most
//! loaded GPU does not fit. The y axis carries GiB ticks at a round step, and the legend sits
//! in room kept right of the last bar, never over it. Under the chart, the most loaded GPU's
//! memory line by line, each with where it comes from.

use egui::{Color32, RichText, Ui};
use egui_plot::{Bar, BarChart, Corner, GridInput, GridMark, HLine, Legend, Plot};
use parsim::estimate::Estimate;
use parsim::report::colors::MEMORY_PARTS;
use parsim::report::memory_chart::{self, stage_parts};
use parsim::report::memory_lines::{self, LineRole};

/// Bytes in a GiB (2^30, as nvidia-smi and PyTorch report).
pub const GIB: f64 = (1u64 << 30) as f64;

/// The headline line: the most loaded GPU against the capacity (the engine's chart title).
pub fn headline(e: &Estimate) -> String {
    memory_chart::headline(&e.memory)
}

/// The legend's width in points (its swatches and the longest name, "capacity 79.6 GiB").
pub const LEGEND_PT: f64 = 150.0;

/// Room right of the last of `n` bars, in bar units, for the legend on a plot `width_pt`
/// wide: the legend (at the top right) then covers no bar. The bars span n units (from -0.6
/// to n - 0.4); with room r the x range is n + r units, of which the legend takes
/// LEGEND_PT / width_pt, so r / (n + r) must be at least that share.
pub fn legend_room(n: usize, width_pt: f32) -> f64 {
    let share = (LEGEND_PT / f64::from(width_pt.max(1.0))).min(0.8);
    (share * n as f64 / (1.0 - share)).max(0.5)
}

/// The GiB between y ticks for an axis reaching `top` GiB: 1, 2 or 5 times a power of ten,
/// giving 4 to 10 ticks.
pub fn tick_step_gib(top: f64) -> f64 {
    let top = if top.is_finite() && top > 0.0 {
        top
    } else {
        1.0
    };
    let mut step = 10f64.powf((top / 10.0).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if top / (step * m) <= 10.0 {
            step *= m;
            break;
        }
    }
    step
}

/// The y ticks of the axis from `bounds`, every `step` GiB.
fn gib_marks(input: GridInput, step: f64) -> Vec<GridMark> {
    let (lo, hi) = input.bounds;
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last.max(first))
        .map(|i| GridMark {
            value: i as f64 * step,
            step_size: step,
        })
        .collect()
}

/// Draws the headline and the chart, `height` points tall.
pub fn ui(ui: &mut Ui, e: &Estimate, height: f32) {
    let m = &e.memory;
    let red = ui.visuals().error_fg_color;
    let text = RichText::new(headline(e)).strong();
    ui.label(if m.fits { text } else { text.color(red) });

    let capacity = m.capacity_bytes as f64 / GIB;
    let mut charts: Vec<BarChart> = Vec::with_capacity(MEMORY_PARTS.len());
    for (i, (name, color)) in MEMORY_PARTS.iter().enumerate() {
        let color = &Color32::from_rgb(color.0, color.1, color.2);
        let bars = m
            .stages
            .iter()
            .map(|s| {
                let over = s.total > m.capacity_bytes;
                let bar = Bar::new(s.stage as f64, stage_parts(s)[i] as f64 / GIB)
                    .width(0.7)
                    .name(format!("rank {}", s.stage));
                if over {
                    bar.fill(color.gamma_multiply(0.8)).stroke((1.5, red))
                } else {
                    bar.fill(*color)
                }
            })
            .collect();
        let chart = {
            let below: Vec<&BarChart> = charts.iter().collect();
            BarChart::new(*name, bars)
                .color(*color)
                .stack_on(&below)
                .element_formatter(Box::new(move |b, _| {
                    format!("{}\n{name}: {:.2} GiB", b.name, b.value)
                }))
        };
        charts.push(chart);
    }
    let top = m
        .stages
        .iter()
        .map(|s| s.total as f64 / GIB)
        .fold(capacity, f64::max);
    let line = if m.fits {
        ui.visuals().text_color()
    } else {
        red
    };
    let step = tick_step_gib(top * 1.08);
    let room = legend_room(m.stages.len(), ui.available_width());
    Plot::new("memory_chart")
        .height(height)
        .legend(Legend::default().position(Corner::RightTop))
        .show_axes([false, true])
        .y_grid_spacer(move |input| gib_marks(input, step))
        .y_axis_formatter(|mark, _| format!("{:.0}", mark.value))
        .y_axis_min_width(28.0)
        .allow_zoom(false)
        .allow_drag(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .show_crosshair(false)
        .show_x(false)
        .include_y(0.0)
        .include_y(top * 1.08)
        .include_x(-0.6)
        .include_x(m.stages.len() as f64 - 0.4 + room)
        .x_axis_label("pipeline rank")
        .y_axis_label("GiB")
        .show(ui, |pui| {
            for c in charts {
                pui.bar_chart(c);
            }
            pui.hline(
                HLine::new(format!("capacity {capacity:.1} GiB"), capacity)
                    .color(line)
                    .width(2.0),
            );
        });
    lines_ui(ui, m);
}

/// The most loaded GPU's memory line by line (the CLI's table: src/report/memory_lines.rs),
/// folded under the chart.
fn lines_ui(ui: &mut Ui, m: &parsim::estimate::MemoryReport) {
    let Some(worst) = memory_lines::most_loaded(m) else {
        return;
    };
    let title = format!("pipeline rank {} line by line", worst.stage);
    egui::CollapsingHeader::new(title)
        .id_salt("memory_lines")
        .show(ui, |ui| {
            egui::Grid::new("memory_lines_grid")
                .striped(true)
                .show(ui, |ui| {
                    ui.strong("line");
                    ui.strong("GiB");
                    ui.strong("from");
                    ui.end_row();
                    for l in memory_lines::lines(worst) {
                        let name = RichText::new(l.name);
                        ui.label(if l.role == LineRole::Peak {
                            name.strong()
                        } else {
                            name
                        });
                        ui.label(memory_lines::signed_gib(l.bytes));
                        ui.label(RichText::new(l.from).weak());
                        ui.end_row();
                    }
                });
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks fall on round GiB: 0-80 GiB by 10, 0-190 by 20, 0-9 by 1.
    #[test]
    fn ticks_are_round_and_few() {
        assert_eq!(tick_step_gib(86.0), 10.0);
        assert_eq!(tick_step_gib(190.0), 20.0);
        assert_eq!(tick_step_gib(9.0), 1.0);
        for top in [0.3, 7.0, 45.0, 79.6, 150.0, 1234.0] {
            let n = top / tick_step_gib(top);
            assert!((3.0..=10.0).contains(&n.floor()), "{top}: {n} ticks");
        }
    }

    /// The legend's left edge (in bar units) is right of the last bar's right edge (n - 1 +
    /// 0.35) for every bar count and plot width.
    #[test]
    fn the_legend_never_covers_the_last_bar() {
        for n in [1usize, 2, 4, 8, 16, 64] {
            for width in [300.0f32, 500.0, 900.0, 1600.0] {
                let room = legend_room(n, width);
                let (x0, x1) = (-0.6, n as f64 - 0.4 + room);
                let legend_left = x1 - LEGEND_PT / f64::from(width) * (x1 - x0);
                assert!(legend_left >= n as f64 - 1.0 + 0.35, "n {n} width {width}");
            }
        }
    }
}
