//! The pipeline timeline: pipeline ranks as rows, time along the axis, one bar per action.
//!
//! A bar's hue is its microbatch and its shade its kind (forward light, input-gradient I
//! medium, full backward B dark, weight-gradient W darkest), as in the CLI's Gantt charts;
//! the number in a bar is the model chunk on that rank. Idle time is the grey row background
//! left uncovered. Hovering a bar shows its rank, chunk, stage, microbatch, start and end;
//! the scroll wheel (or ctrl-scroll, or a pinch) zooms around the pointer, dragging pans, a
//! double click fits the whole step. A second schedule can be drawn underneath on the same
//! time axis.
//!
//! Drawing follows puffin's flamegraph: a per-frame [`Canvas`] (rect, painter, visible time
//! range) maps time to x; separate functions paint the grid, the bars and handle zoom and pan.

use crate::state::Run;
use egui::{
    Align2, Color32, FontId, Painter, Pos2, Rect, Response, RichText, Sense, Stroke, StrokeKind,
    Ui, Vec2,
};
use parsim::config::ScheduleKind;
use parsim::report::colors::{self, Rgb};
use parsim::report::format::seconds;
use parsim::schedule::{ActionKind, ComputeAction, Overlap, Program, Simulation};

/// Width of the rank-label column, in points.
const LABEL_W: f32 = 58.0;
/// Height of the time axis under the last chart.
const AXIS_H: f32 = 18.0;

/// Everything the timeline remembers between frames.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineOptions {
    /// Magnification of the time axis (1 = the whole step fits).
    pub zoom: f64,
    /// Time at the left edge, in seconds.
    pub offset: f64,
    /// Preferred row height in points (rows shrink to fit the panel).
    pub row_height: f32,
    /// Draw a second schedule underneath.
    pub compare: bool,
    /// Which schedule to compare with.
    pub compare_with: ScheduleKind,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            zoom: 1.0,
            offset: 0.0,
            row_height: 36.0,
            compare: false,
            compare_with: ScheduleKind::OneFOneB,
        }
    }
}

impl TimelineOptions {
    /// Back to the whole step.
    pub fn fit(&mut self) {
        self.zoom = 1.0;
        self.offset = 0.0;
    }
}

/// One frame's drawing context for one chart: where the bars go and which times are visible.
struct Canvas<'a> {
    rect: Rect,
    painter: &'a Painter,
    t0: f64,
    span: f64,
}

impl Canvas<'_> {
    /// Screen x of time `t`.
    fn x(&self, t: f64) -> f32 {
        self.rect.left() + ((t - self.t0) / self.span) as f32 * self.rect.width()
    }

    /// Time at screen x.
    fn t(&self, x: f32) -> f64 {
        self.t0 + ((x - self.rect.left()) / self.rect.width()) as f64 * self.span
    }
}

/// One of the engine's shared colours as egui's.
fn color32(c: Rgb) -> Color32 {
    Color32::from_rgb(c.0, c.1, c.2)
}

/// Colour of an action: the engine's scheme ([`colors::action_color`]), as in the CLI's
/// Gantt charts.
pub fn action_color(microbatch: u32, kind: ActionKind) -> Color32 {
    color32(colors::action_color(microbatch, kind))
}

fn text_color(kind: ActionKind) -> Color32 {
    color32(colors::action_text_color(kind))
}

/// The header line of a run: schedule, sizes, action count, bubble and makespan.
pub fn header(program: &Program, sim: &Simulation) -> String {
    format!(
        "{} · pp {} · vpp {} · {} microbatches · {} actions · bubble {:.1}% · makespan {}",
        program.kind,
        program.pp,
        program.vpp,
        program.microbatches,
        program.num_actions(),
        100.0 * sim.bubble_fraction,
        seconds(sim.makespan)
    )
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `n` ticks over `span`.
fn tick_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f < 1.5 {
        1.0
    } else if f < 3.5 {
        2.0
    } else if f < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// Vertical grid lines at the ticks, and their labels under the chart when `axis` is set.
fn paint_grid(c: &Canvas<'_>, ui: &Ui, axis: Option<Rect>) {
    let step = tick_step(c.span, (c.rect.width() / 110.0).max(2.0) as f64);
    let first = (c.t0 / step).ceil() as i64;
    let last = ((c.t0 + c.span) / step).floor() as i64;
    let grid = ui.visuals().widgets.noninteractive.bg_stroke.color;
    let text = ui.visuals().weak_text_color();
    for k in first..=last.min(first + 200) {
        let t = k as f64 * step;
        let x = c.x(t);
        c.painter.vline(x, c.rect.y_range(), Stroke::new(1.0, grid));
        if let Some(a) = axis {
            c.painter.text(
                Pos2::new(x, a.top() + 2.0),
                Align2::CENTER_TOP,
                if k == 0 { "0".to_string() } else { seconds(t) },
                FontId::proportional(10.0),
                text,
            );
        }
    }
}

/// The vertical extent of an action's bar within its row (overlapped DualPipe-V slots take a
/// half each: the forward on top, the backward below).
fn bar_y(row: Rect, a: &ComputeAction) -> (f32, f32) {
    let (y0, y1) = (row.top() + 1.0, row.bottom() - 1.0);
    match a.overlap {
        Overlap::None => (y0, y1),
        Overlap::First => (y0, (y0 + y1) / 2.0),
        Overlap::Second => ((y0 + y1) / 2.0, y1),
    }
}

/// Bars narrower than this (in points) are merged with their neighbours into one grey "busy"
/// band, so a zoomed-out view of a long schedule draws at most about one rectangle per pixel.
const MIN_BAR: f32 = 1.5;

/// The rows' backgrounds (idle), the bars and their chunk numbers; returns the hovered action
/// as (rank, index) if the pointer is over one.
fn paint_bars(
    c: &Canvas<'_>,
    run: &Run,
    row_h: f32,
    hover: Option<Pos2>,
    dark: bool,
) -> Option<(usize, usize)> {
    let (idle, busy) = if dark {
        (Color32::from_gray(58), Color32::from_gray(150))
    } else {
        (Color32::from_gray(225), Color32::from_gray(120))
    };
    let (t_lo, t_hi) = (c.t0, c.t0 + c.span);
    let mut hovered = None;
    for (r, (acts, spans)) in run.program.ranks.iter().zip(&run.sim.timeline).enumerate() {
        let row = Rect::from_min_size(
            Pos2::new(c.rect.left(), c.rect.top() + r as f32 * row_h),
            Vec2::new(c.rect.width(), row_h),
        );
        c.painter
            .rect_filled(row.shrink2(Vec2::new(0.0, 1.0)), 0.0, idle);
        let (y0, y1) = (row.top() + 1.0, row.bottom() - 1.0);
        // A run of merged narrow bars, [x0, x1], not drawn yet.
        let mut merged: Option<(f32, f32)> = None;
        let flush = |m: &mut Option<(f32, f32)>| {
            if let Some((a, b)) = m.take() {
                let band = Rect::from_min_max(Pos2::new(a, y0), Pos2::new(b.max(a + 1.0), y1));
                c.painter.rect_filled(band, 0.0, busy);
            }
        };
        let first = spans.partition_point(|s| s.end < t_lo);
        for (k, (a, s)) in acts.iter().zip(spans).enumerate().skip(first) {
            if s.start > t_hi {
                break;
            }
            let x0 = c.x(s.start).max(c.rect.left());
            let x1 = c.x(s.end).min(c.rect.right());
            if x1 - x0 < MIN_BAR {
                merged = match merged {
                    Some((a, b)) if x0 <= b + 1.0 => Some((a, b.max(x1))),
                    other => {
                        let mut o = other;
                        flush(&mut o);
                        Some((x0, x1))
                    }
                };
                continue;
            }
            flush(&mut merged);
            let (by0, by1) = bar_y(row, a);
            let bar = Rect::from_min_max(Pos2::new(x0, by0), Pos2::new(x1, by1));
            c.painter
                .rect_filled(bar, 1.0, action_color(a.microbatch, a.kind));
            if x1 - x0 > 4.0 {
                c.painter.rect_stroke(
                    bar,
                    1.0,
                    Stroke::new(0.5, Color32::WHITE),
                    StrokeKind::Inside,
                );
            }
            let h = by1 - by0;
            let label = parsim::report::gantt::bar_label(&run.program, a.microbatch, a.stage);
            if x1 - x0 >= 4.0 + 6.0 * label.len() as f32 && h >= 9.0 {
                c.painter.text(
                    bar.center(),
                    Align2::CENTER_CENTER,
                    label,
                    FontId::proportional((h * 0.62).min(12.0)),
                    text_color(a.kind),
                );
            }
            if hover.is_some_and(|p| bar.contains(p)) {
                hovered = Some((r, k));
                c.painter.rect_stroke(
                    bar,
                    1.0,
                    Stroke::new(2.0, Color32::BLACK),
                    StrokeKind::Outside,
                );
            }
        }
        flush(&mut merged);
    }
    hovered
}

/// Scroll or pinch zooms around the pointer, horizontal scroll and drag pan, double click fits.
fn handle_zoom_pan(
    ui: &Ui,
    response: &Response,
    c: &Canvas<'_>,
    opt: &mut TimelineOptions,
    makespan: f64,
) {
    if response.double_clicked() {
        opt.fit();
        return;
    }
    let w = c.rect.width().max(1.0) as f64;
    if response.dragged() {
        opt.offset -= response.drag_delta().x as f64 / w * c.span;
    }
    if response.hovered() {
        let (scroll, pinch) = ui.input(|i| (i.smooth_scroll_delta(), i.zoom_delta()));
        let factor = pinch as f64 * (scroll.y as f64 / 240.0).exp();
        if (factor - 1.0).abs() > 1e-6 {
            if let Some(p) = response.hover_pos() {
                let t = c.t(p.x);
                opt.zoom = (opt.zoom * factor).clamp(1.0, 1e5);
                let span = makespan / opt.zoom;
                opt.offset = t - ((p.x - c.rect.left()) as f64 / w) * span;
            }
        }
        opt.offset -= scroll.x as f64 / w * c.span;
    }
    let span = makespan / opt.zoom;
    opt.offset = opt.offset.clamp(0.0, (makespan - span).max(0.0));
}

/// The tooltip of an action.
fn details(ui: &mut Ui, run: &Run, rank: usize, k: usize) {
    let a = run.program.ranks[rank][k];
    let s = run.sim.timeline[rank][k];
    let kind = match a.kind {
        ActionKind::F => "forward",
        ActionKind::B => "backward",
        ActionKind::I => "input-gradient backward",
        ActionKind::W => "weight-gradient backward",
    };
    ui.strong(format!("{} {kind}", a.kind));
    ui.label(format!("rank {rank}"));
    ui.label(format!(
        "chunk {} (stage {})",
        run.program.chunk_of_stage(a.stage),
        a.stage
    ));
    ui.label(format!("microbatch {}", a.microbatch));
    ui.label(format!("start {}", seconds(s.start)));
    ui.label(format!("end {}", seconds(s.end)));
    ui.label(format!("duration {}", seconds(s.end - s.start)));
}

/// Draws one run (header, rank labels, bars) `height` points tall, on the shared time axis.
fn chart(
    ui: &mut Ui,
    opt: &mut TimelineOptions,
    run: &Run,
    makespan: f64,
    height: f32,
    axis: bool,
) {
    let pp = run.program.pp.max(1) as f32;
    let axis_h = if axis { AXIS_H } else { 0.0 };
    let row_h = ((height - axis_h) / pp).clamp(2.0, opt.row_height);
    let size = Vec2::new(ui.available_width(), row_h * pp + axis_h);
    let (outer, response) = ui.allocate_exact_size(size, Sense::click_and_drag());
    let painter = ui.painter_at(outer);
    let rect = Rect::from_min_max(
        Pos2::new(outer.left() + LABEL_W, outer.top()),
        Pos2::new(outer.right() - 4.0, outer.bottom() - axis_h),
    );
    let span = (makespan / opt.zoom).max(f64::MIN_POSITIVE);
    let c = Canvas {
        rect,
        painter: &painter,
        t0: opt.offset,
        span,
    };
    let step = if pp > 48.0 {
        (pp / 16.0).ceil() as usize
    } else {
        1
    };
    for r in (0..run.program.pp as usize).step_by(step) {
        let y = rect.top() + (r as f32 + 0.5) * row_h;
        painter.text(
            Pos2::new(outer.left() + LABEL_W - 6.0, y),
            Align2::RIGHT_CENTER,
            format!("rank {r}"),
            FontId::proportional(row_h.clamp(8.0, 12.0)),
            ui.visuals().text_color(),
        );
    }
    let axis_rect = axis.then(|| {
        Rect::from_min_max(
            Pos2::new(rect.left(), rect.bottom()),
            Pos2::new(rect.right(), outer.bottom()),
        )
    });
    paint_grid(&c, ui, axis_rect);
    let hovered = paint_bars(&c, run, row_h, response.hover_pos(), ui.visuals().dark_mode);
    handle_zoom_pan(ui, &response, &c, opt, makespan);
    if let Some((r, k)) = hovered {
        response.on_hover_ui_at_pointer(|ui| details(ui, run, r, k));
    }
}

/// Swatches for the kinds, and what hue and numbers mean.
fn legend(ui: &mut Ui, split: bool) {
    ui.horizontal_wrapped(|ui| {
        let kinds: &[(ActionKind, &str)] = if split {
            &[
                (ActionKind::F, "F forward"),
                (ActionKind::I, "I input grad"),
                (ActionKind::B, "B full backward"),
                (ActionKind::W, "W weight grad"),
            ]
        } else {
            &[(ActionKind::F, "F forward"), (ActionKind::B, "B backward")]
        };
        for &(k, name) in kinds {
            let (r, _) = ui.allocate_exact_size(Vec2::new(16.0, 12.0), Sense::hover());
            ui.painter().rect_filled(r, 2.0, action_color(0, k));
            ui.label(RichText::new(name).small());
        }
        ui.label(
            RichText::new("· hue = microbatch · number = chunk on the rank · grey = idle")
                .small()
                .weak(),
        );
    });
}

/// Draws the timeline of `run` (and `compare` under it when given): headers, charts sharing
/// one time axis, the legend. `compare` carries its schedule and either its run or why there
/// is none.
pub fn ui(
    ui: &mut Ui,
    opt: &mut TimelineOptions,
    run: Result<&Run, &str>,
    compare: Option<(ScheduleKind, Result<&Run, &str>)>,
) {
    let makespan = [Some(run), compare.as_ref().map(|c| c.1)]
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|r| r.sim.makespan)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let split = [Some(run), compare.as_ref().map(|c| c.1)]
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|r| r.program.splits_backward());
    // Each chart takes its share (by rank count) of the height that is really left when it is
    // drawn, less what still has to come under it (headers, the time axis, the legend), so the
    // content never outgrows the panel and the panel keeps its size from frame to frame.
    let text_h = ui.text_style_height(&egui::TextStyle::Body) + ui.spacing().item_spacing.y;
    let legend_h = 20.0 + ui.spacing().item_spacing.y;
    let entries: Vec<(Option<ScheduleKind>, Result<&Run, &str>)> = std::iter::once((None, run))
        .chain(compare.map(|(k, r)| (Some(k), r)))
        .collect();
    for (i, (kind, r)) in entries.iter().enumerate() {
        let later = &entries[i + 1..];
        let last = !later.iter().any(|(_, r)| r.is_ok());
        match r {
            Ok(run) => {
                if i > 0 {
                    ui.add_space(2.0);
                }
                ui.label(RichText::new(header(&run.program, &run.sim)).strong());
                let rows_left: f32 = entries[i..]
                    .iter()
                    .filter_map(|(_, r)| r.ok())
                    .map(|r| r.program.pp as f32)
                    .sum();
                let below: f32 = later
                    .iter()
                    .map(|(_, r)| {
                        if r.is_ok() {
                            text_h + 2.0
                        } else {
                            2.0 * text_h
                        }
                    })
                    .sum();
                let avail = ui.available_height() - legend_h - below - AXIS_H - 2.0;
                let share = (avail * run.program.pp as f32 / rows_left.max(1.0)).max(0.0);
                chart(
                    ui,
                    opt,
                    run,
                    makespan,
                    share + if last { AXIS_H } else { 0.0 },
                    last,
                );
            }
            Err(why) => {
                let color = ui.visuals().error_fg_color;
                let text = match kind {
                    Some(k) => format!("{k}: {why}"),
                    None => why.to_string(),
                };
                ui.add(egui::Label::new(RichText::new(text).color(color)).wrap());
            }
        }
    }
    legend(ui, split);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors_follow_the_gantt_scheme() {
        // Hue 0 (microbatch 0), saturation 0.65: forward is a light red, W a dark one.
        let f = action_color(0, ActionKind::F);
        let w = action_color(0, ActionKind::W);
        assert!(f.r() > f.g() && f.r() > f.b());
        assert!(w.r() < f.r());
        assert_eq!(color32(colors::hsl(0.0, 0.0, 1.0)), Color32::WHITE);
        assert_eq!(
            color32(colors::hsl(0.5, 1.0, 0.5)),
            Color32::from_rgb(0, 255, 255)
        );
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(1.0, 10.0), 0.1);
        assert_eq!(tick_step(7.0, 10.0), 0.5);
        assert_eq!(tick_step(0.003, 3.0), 0.001);
    }
}
