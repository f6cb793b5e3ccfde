//! The scatter plot of docs/accuracy.png: predicted vs published TFLOP/s per GPU, one colour
//! per source, held-out rows filled and fitting rows hollow, with the y = x line and the
//! +-10% and +-25% bands. Text uses the DejaVu Sans shipped in `assets/fonts` (registered with
//! plotters, as `report::gantt` does).

use super::{CalibrateError, Evaluation, Role};
use crate::calibrate::published::Source;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

fn ensure_font() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE
        .get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok())
}

/// Axis labels (TFLOP/s).
const TICKS: [f64; 10] = [
    100.0, 125.0, 150.0, 200.0, 300.0, 400.0, 500.0, 700.0, 1000.0, 1500.0,
];

fn colour(s: Source) -> RGBColor {
    match s {
        Source::Narayanan2021 => RGBColor(31, 119, 180),
        Source::MegatronCore2024 => RGBColor(214, 39, 40),
        Source::LlmFoundry => RGBColor(44, 160, 44),
    }
}

/// Writes the scatter plot (PNG) of every predicted row of `e` to `path`.
pub fn write_png(path: &Path, e: &Evaluation) -> Result<(), CalibrateError> {
    let err = |m: String| CalibrateError::Plot {
        path: path.display().to_string(),
        message: m,
    };
    if !ensure_font() {
        return Err(err("the shipped font could not be loaded".into()));
    }
    let points: Vec<(f64, f64, Source, bool, bool)> = e
        .rows
        .iter()
        .filter_map(|r| {
            let p = r.prediction.as_ref().ok()?;
            let held = r.role == Role::HeldOut;
            let excluded = matches!(r.role, Role::OutOfScope(_) | Role::Inconsistent(_));
            Some((
                r.case.published_tflops,
                p.tflops,
                r.case.source,
                held,
                excluded,
            ))
        })
        .collect();
    let hi = points
        .iter()
        .map(|p| p.0.max(p.1))
        .fold(100.0_f64, f64::max)
        * 1.05;
    let lo = points.iter().map(|p| p.0.min(p.1)).fold(hi, f64::min) * 0.95;
    let root = BitMapBackend::new(path, (900, 820)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| err(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("parsim vs published TFLOP/s per GPU (log axes)", (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(TICKS.to_vec()),
            (lo..hi).log_scale().with_key_points(TICKS.to_vec()),
        )
        .map_err(|x| err(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("published TFLOP/s per GPU (source's FLOPs convention)")
        .y_desc("predicted TFLOP/s per GPU")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(|x| err(x.to_string()))?;
    for (k, style, label) in [
        (1.0, BLACK.stroke_width(2), "y = x"),
        (1.10, RGBColor(120, 120, 120).stroke_width(1), "+-10%"),
        (0.90, RGBColor(120, 120, 120).stroke_width(1), ""),
        (1.25, RGBColor(200, 200, 200).stroke_width(1), "+-25%"),
        (0.75, RGBColor(200, 200, 200).stroke_width(1), ""),
    ] {
        let s = chart
            .draw_series(LineSeries::new([(lo, lo * k), (hi, hi * k)], style))
            .map_err(|x| err(x.to_string()))?;
        if !label.is_empty() {
            s.label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    for src in Source::ALL {
        let c = colour(src);
        let held: Vec<_> = points
            .iter()
            .filter(|p| p.2 == src && p.3)
            .map(|p| (p.0, p.1))
            .collect();
        chart
            .draw_series(held.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(|x| err(x.to_string()))?
            .label(format!("{} held out", src.short()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
        let fitted: Vec<_> = points
            .iter()
            .filter(|p| p.2 == src && !p.3 && !p.4)
            .map(|p| (p.0, p.1))
            .collect();
        chart
            .draw_series(fitted.iter().map(|&p| Circle::new(p, 4, c.stroke_width(1))))
            .map_err(|x| err(x.to_string()))?
            .label(format!("{} fitting", src.short()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.stroke_width(1)));
    }
    let grey = RGBColor(150, 150, 150);
    let excluded: Vec<_> = points.iter().filter(|p| p.4).map(|p| (p.0, p.1)).collect();
    chart
        .draw_series(
            excluded
                .iter()
                .map(|&p| Cross::new(p, 4, grey.stroke_width(1))),
        )
        .map_err(|x| err(x.to_string()))?
        .label("out of scope (fp8) / inconsistent")
        .legend(move |(x, y)| Cross::new((x + 10, y), 4, grey.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| err(x.to_string()))?;
    root.present().map_err(|x| err(x.to_string()))
}
