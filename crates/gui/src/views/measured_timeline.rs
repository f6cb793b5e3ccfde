//! The measured timeline under the predicted one, on one time axis: a row per predicted
//! pipeline rank, then a row per measured rank, one bar per compute action of the first timed
//! step, misses (measured more than half off the prediction) outlined in red.

use crate::measured::{MeasuredTimeline, Track};
use egui::{Color32, CornerRadius, Pos2, Rect, Sense, Stroke, StrokeKind, Ui, Vec2};

const ROW_HEIGHT: f32 = 18.0;
const LABEL_WIDTH: f32 = 330.0;

fn color(kind: &str) -> Color32 {
    match kind {
        "F" => Color32::from_rgb(76, 114, 176),
        "B" => Color32::from_rgb(85, 168, 104),
        "I" => Color32::from_rgb(221, 132, 82),
        _ => Color32::from_rgb(129, 114, 179),
    }
}

fn row(ui: &mut Ui, t: &Track, end_s: f64, measured: bool) {
    ui.horizontal(|ui| {
        let label = if measured {
            format!(
                "{}: {} actions, {} misses",
                t.label,
                t.bars.len(),
                t.misses()
            )
        } else {
            format!("{}: {} actions", t.label, t.bars.len())
        };
        ui.add_sized(
            [LABEL_WIDTH, ROW_HEIGHT],
            egui::Label::new(label).truncate(),
        );
        let width = (ui.available_width() - 8.0).max(100.0);
        let (rect, _) = ui.allocate_exact_size(Vec2::new(width, ROW_HEIGHT), Sense::hover());
        let painter = ui.painter_at(rect);
        let x = |s: f64| rect.left() + (s / end_s.max(f64::MIN_POSITIVE)) as f32 * width;
        for b in &t.bars {
            let r = Rect::from_min_max(
                Pos2::new(x(b.start_s), rect.top() + 1.0),
                Pos2::new(x(b.end_s).max(x(b.start_s) + 1.0), rect.bottom() - 1.0),
            );
            painter.rect_filled(r, CornerRadius::same(2), color(&b.kind));
            if b.is_miss() {
                painter.rect_stroke(
                    r,
                    CornerRadius::same(2),
                    Stroke::new(2.0, Color32::RED),
                    StrokeKind::Inside,
                );
            }
        }
    });
}

/// Draws `m`: predicted rows, then measured rows.
pub fn ui(ui: &mut Ui, m: &MeasuredTimeline) {
    ui.label(format!(
        "{}: predicted (top) and measured (bottom) compute actions of the first timed step, 0 to {:.2} ms; red outline: measured more than 50% off the prediction",
        m.path,
        m.end_s * 1e3
    ));
    for t in &m.predicted {
        row(ui, t, m.end_s, false);
    }
    ui.separator();
    for t in &m.measured {
        row(ui, t, m.end_s, true);
    }
}
