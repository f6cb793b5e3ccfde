//! Per-GPU memory as a stacked bar per pipeline rank (weights, gradients, optimizer states,
//! activations, buffers) against a line at the GPU's capacity, in GiB; red when the most
//! loaded GPU does not fit.

use egui::{Color32, RichText, Ui};
use egui_plot::{Bar, BarChart, HLine, Legend, Plot};
use parsim::estimate::Estimate;
use parsim::report::colors::MEMORY_PARTS;
use parsim::report::memory_chart::{self, stage_parts};

/// Bytes in a GiB (2^30, as nvidia-smi and PyTorch report).
pub const GIB: f64 = (1u64 << 30) as f64;

/// The headline line: the most loaded GPU against the capacity (the engine's chart title).
pub fn headline(e: &Estimate) -> String {
    memory_chart::headline(&e.memory)
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
    Plot::new("memory_chart")
        .height(height)
        .legend(Legend::default())
        .allow_zoom(false)
        .allow_drag(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .show_crosshair(false)
        .show_x(false)
        .include_y(0.0)
        .include_y(top * 1.08)
        .include_x(-0.6)
        .include_x(m.stages.len() as f64 - 0.4)
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
}
