//! The scatter plot of docs/accuracy.png: predicted vs published TFLOP/s per GPU, one colour
//! per source, held-out rows filled and fitting rows hollow, with the y = x line and the
//! +-10% and +-25% bands; and the before/after plot of `parsim calibrate --png`. Both are
//! [`Chart`]s, as is `--ops-png`'s op-time scatter, written by `report::chart` (size check,
//! shipped font, PNG writer).

use super::op_report::{OpReport, CLASSES};
use super::profile_fit::ProfileFit;
use super::{CalibrateError, Evaluation, Role};
use crate::calibrate::published::Source;
use plotters::prelude::*;
use std::path::Path;

use crate::report::chart::{self, Chart, DrawResult};
use crate::report::font::FONT;
use plotters::coord::Shift;

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
    write(path, &AccuracyScatter(e), (900, 820))
}

/// Predicted vs published TFLOP/s of every predicted row of an evaluation.
struct AccuracyScatter<'a>(&'a Evaluation);

impl Chart for AccuracyScatter<'_> {
    fn empty(&self) -> Option<&'static str> {
        None
    }

    fn min_size(&self) -> (u32, u32) {
        (320, 320)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        draw_accuracy(root, self.0)
    }
}

fn draw_accuracy<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    e: &Evaluation,
) -> DrawResult<DB::ErrorType> {
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
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption("parsim vs published TFLOP/s per GPU (log axes)", (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(TICKS.to_vec()),
            (lo..hi).log_scale().with_key_points(TICKS.to_vec()),
        )?;
    chart
        .configure_mesh()
        .x_desc("published TFLOP/s per GPU (source's FLOPs convention)")
        .y_desc("predicted TFLOP/s per GPU")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for (k, style, label) in [
        (1.0, BLACK.stroke_width(2), "y = x"),
        (1.10, RGBColor(120, 120, 120).stroke_width(1), "+-10%"),
        (0.90, RGBColor(120, 120, 120).stroke_width(1), ""),
        (1.25, RGBColor(200, 200, 200).stroke_width(1), "+-25%"),
        (0.75, RGBColor(200, 200, 200).stroke_width(1), ""),
    ] {
        let s = chart.draw_series(LineSeries::new([(lo, lo * k), (hi, hi * k)], style))?;
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
            .draw_series(held.iter().map(|&p| Circle::new(p, 4, c.filled())))?
            .label(format!("{} held out", src.short()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
        let fitted: Vec<_> = points
            .iter()
            .filter(|p| p.2 == src && !p.3 && !p.4)
            .map(|p| (p.0, p.1))
            .collect();
        chart
            .draw_series(fitted.iter().map(|&p| Circle::new(p, 4, c.stroke_width(1))))?
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
        )?
        .label("out of scope / inconsistent")
        .legend(move |(x, y)| Cross::new((x + 10, y), 4, grey.stroke_width(1)));
    legend(&mut chart)
}

/// Writes `parsim calibrate --png`: predicted vs measured step time per configuration, before
/// the fit (grey crosses) and after (filled: fitting rows, hollow: held out), log axes.
pub fn write_fit_png(path: &Path, fit: &ProfileFit) -> Result<(), CalibrateError> {
    write(path, &FitScatter(fit), (820, 760))
}

/// Predicted (before and after the fit) vs measured step time of every configuration.
struct FitScatter<'a>(&'a ProfileFit);

impl Chart for FitScatter<'_> {
    fn empty(&self) -> Option<&'static str> {
        self.0
            .rows
            .is_empty()
            .then_some("the fit has no measurements")
    }

    fn min_size(&self) -> (u32, u32) {
        (320, 320)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        draw_fit(root, self.0)
    }
}

fn draw_fit<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fit: &ProfileFit,
) -> DrawResult<DB::ErrorType> {
    let all: Vec<f64> = fit
        .rows
        .iter()
        .flat_map(|r| [r.measured_s, r.before_s, r.after_s])
        .collect();
    let frame = SecondsFrame {
        caption: "parsim calibrate: predicted vs measured step time (log axes)",
        per: "step",
        pad: 1.2,
        label: |v| format!("{v:.3}"),
    };
    let mut chart = frame.draw(root, &all)?;
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(
            fit.rows
                .iter()
                .map(|r| Cross::new((r.measured_s, r.before_s), 5, grey.stroke_width(1))),
        )?
        .label("before the fit")
        .legend(move |(x, y)| Cross::new((x + 10, y), 5, grey.stroke_width(1)));
    let blue = RGBColor(31, 119, 180);
    chart
        .draw_series(
            fit.rows
                .iter()
                .filter(|r| r.role != "held out")
                .map(|r| Circle::new((r.measured_s, r.after_s), 5, blue.filled())),
        )?
        .label("after, fitting rows")
        .legend(move |(x, y)| Circle::new((x + 10, y), 5, blue.filled()));
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(
            fit.rows
                .iter()
                .filter(|r| r.role == "held out")
                .map(|r| Circle::new((r.measured_s, r.after_s), 6, red.stroke_width(2))),
        )?
        .label("after, held out")
        .legend(move |(x, y)| Circle::new((x + 10, y), 6, red.stroke_width(2)));
    legend(&mut chart)
}

/// Writes `parsim calibrate --ops-png`: per op timing of the measurement lines, predicted vs
/// measured seconds per call (log axes), one colour per op class: after the fit filled, before
/// it hollow; with the y = x line.
pub fn write_ops_png(path: &Path, report: &OpReport) -> Result<(), CalibrateError> {
    write(path, &OpScatter(report), OPS_PNG_SIZE)
}

/// The pixel size of [`write_ops_png`]'s plot.
pub const OPS_PNG_SIZE: (u32, u32) = (820, 760);

/// Predicted (before and after the fit) vs measured seconds per call of every op timing.
struct OpScatter<'a>(&'a OpReport);

/// The plotted pairs (measured, predicted) of `report`, both positive (log axes), before or
/// after the fit, with their class.
fn op_pairs(report: &OpReport, after: bool) -> impl Iterator<Item = (&'static str, f64, f64)> + '_ {
    report.points.iter().filter_map(move |p| {
        let predicted = if after { p.after_s } else { p.before_s }?;
        (p.measured_s > 0.0 && predicted > 0.0).then_some((p.class, p.measured_s, predicted))
    })
}

impl Chart for OpScatter<'_> {
    fn empty(&self) -> Option<&'static str> {
        (op_pairs(self.0, true).next().is_none() && op_pairs(self.0, false).next().is_none())
            .then_some("no op timing has a positive measured and predicted time")
    }

    fn min_size(&self) -> (u32, u32) {
        (320, 320)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB::ErrorType> {
        draw_ops(root, self.0)
    }
}

fn class_colour(class: &str) -> RGBColor {
    match class {
        "gemm" => RGBColor(31, 119, 180),
        "attention" => RGBColor(214, 39, 40),
        "memory" => RGBColor(44, 160, 44),
        "collective" => RGBColor(148, 103, 189),
        _ => RGBColor(255, 127, 14),
    }
}

fn draw_ops<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    report: &OpReport,
) -> DrawResult<DB::ErrorType> {
    let all: Vec<f64> = op_pairs(report, true)
        .chain(op_pairs(report, false))
        .flat_map(|(_, m, p)| [m, p])
        .collect();
    let frame = SecondsFrame {
        caption: "parsim calibrate: predicted vs measured op time (log axes)",
        per: "call",
        pad: 1.5,
        label: |v| format!("{v:.0e}"),
    };
    let mut chart = frame.draw(root, &all)?;
    for class in CLASSES {
        let c = class_colour(class);
        let of = |after| op_pairs(report, after).filter(move |p| p.0 == class);
        if of(true).next().is_none() && of(false).next().is_none() {
            continue;
        }
        chart
            .draw_series(of(false).map(|(_, m, p)| Circle::new((m, p), 4, c.stroke_width(1))))?
            .label(format!("{class}, before the fit"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.stroke_width(1)));
        chart
            .draw_series(of(true).map(|(_, m, p)| Circle::new((m, p), 4, c.filled())))?
            .label(format!("{class}, after"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
    }
    legend(&mut chart)
}

/// The frame both `calibrate` scatter plots share: log-log axes of predicted against measured
/// seconds per `per` over the values' range widened by `pad`, the mesh, and the y = x line.
struct SecondsFrame {
    caption: &'static str,
    per: &'static str,
    pad: f64,
    label: fn(&f64) -> String,
}

/// The chart a [`SecondsFrame`] draws into.
type SecondsChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

impl SecondsFrame {
    fn draw<'a, DB: DrawingBackend>(
        &self,
        root: &'a DrawingArea<DB, Shift>,
        values: &[f64],
    ) -> Result<SecondsChart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
        let hi = values.iter().copied().fold(f64::MIN_POSITIVE, f64::max) * self.pad;
        let lo = values.iter().copied().fold(hi, f64::min) / self.pad;
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .caption(self.caption, (FONT, 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(format!("measured seconds per {}", self.per))
            .y_desc(format!("predicted seconds per {}", self.per))
            .x_label_formatter(&self.label)
            .y_label_formatter(&self.label)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()?;
        chart
            .draw_series(LineSeries::new([(lo, lo), (hi, hi)], BLACK.stroke_width(2)))?
            .label("y = x")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        Ok(chart)
    }
}

/// The series legend of both plots, top left.
fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
) -> DrawResult<DB::ErrorType> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// Writes `plot` as a PNG of `size` pixels to `path`.
fn write(path: &Path, plot: &impl Chart, size: (u32, u32)) -> Result<(), CalibrateError> {
    chart::write_png(path, plot, size).map_err(|e| CalibrateError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
