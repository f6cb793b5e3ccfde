//! Small labelled controls shared by the panels: each is one row (a fixed-width label, then the
//! control) with the engine's violations for its field printed right under it.
//!
//! The label is linked to the control (`labelled_by`), so assistive technology (and the
//! egui_kittest tests) find a control by its label.

use crate::fields;
use crate::state::Problems;
use egui::{Align, ComboBox, DragValue, Layout, Response, RichText, Ui};

/// Width of the label column, in points.
pub const LABEL_WIDTH: f32 = 118.0;

/// A fixed-width, left-aligned label; returns its response for `labelled_by`.
pub fn label(ui: &mut Ui, text: &str, tooltip: &str) -> Response {
    let h = ui.spacing().interact_size.y;
    let r = ui
        .allocate_ui_with_layout(
            egui::vec2(LABEL_WIDTH, h),
            Layout::left_to_right(Align::Center),
            |ui| ui.label(text),
        )
        .inner;
    if tooltip.is_empty() {
        r
    } else {
        r.on_hover_text(tooltip)
    }
}

/// The engine's violations for `field`, in the error colour, wrapped under the control.
pub fn errors(ui: &mut Ui, problems: Option<&Problems>, field: &str) {
    for v in fields::at(problems, field) {
        let color = ui.visuals().error_fg_color;
        ui.add(egui::Label::new(RichText::new(fields::message(v)).color(color)).wrap());
    }
}

/// One row: label, control, then the violations of `field`. Returns whether the control
/// changed its value.
pub fn row(
    ui: &mut Ui,
    text: &str,
    tooltip: &str,
    field: &str,
    problems: Option<&Problems>,
    control: impl FnOnce(&mut Ui) -> Response,
) -> bool {
    let changed = ui
        .horizontal(|ui| {
            let l = label(ui, text, tooltip);
            control(ui).labelled_by(l.id).changed()
        })
        .inner;
    errors(ui, problems, field);
    changed
}

/// A drag value for an integer in `range`, snapped to a multiple of `step` (>= 1) so that
/// dragging or typing only lands on values that can be valid.
pub fn stepped<T>(
    value: &mut T,
    range: std::ops::RangeInclusive<u64>,
    step: u64,
) -> impl egui::Widget + '_
where
    T: Copy + TryFrom<u64> + Into<u64>,
{
    let step = step.max(1);
    let (lo, hi) = (*range.start(), *range.end());
    let speed = (step as f64).max(((*value).into() as f64) / 200.0);
    DragValue::from_get_set(move |v: Option<f64>| {
        if let Some(v) = v {
            let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
            let snapped = ((v / step as f64).round() as u64).saturating_mul(step);
            // Never `clamp` (it panics on an empty range): the step may exceed the range.
            let (bottom, top) = (lo.div_ceil(step).saturating_mul(step), hi / step * step);
            let x = if bottom <= top {
                snapped.max(bottom).min(top)
            } else {
                snapped.max(lo).min(hi)
            };
            if let Ok(x) = T::try_from(x) {
                *value = x;
            }
        }
        (*value).into() as f64
    })
    .speed(speed)
    .max_decimals(0)
}

/// A drop-down over `options`, showing `text(option)`; marks the response changed when the
/// user picks another value.
pub fn choice<T: PartialEq + Copy>(
    ui: &mut Ui,
    id: &str,
    value: &mut T,
    options: &[T],
    text: impl Fn(T) -> String,
) -> Response {
    let before = *value;
    let mut r = ComboBox::from_id_salt(id)
        .selected_text(text(*value))
        .width(150.0)
        .show_ui(ui, |ui| {
            for &o in options {
                ui.selectable_value(value, o, text(o));
            }
        })
        .response;
    if *value != before {
        r.mark_changed();
    }
    r
}

/// Divisors of `n` in increasing order (O(sqrt n)).
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// `options` with `current` added (sorted, without duplicates), so a drop-down always shows
/// the value in effect even when a loaded file holds one the filters would not offer.
pub fn with_current(mut options: Vec<u32>, current: u32) -> Vec<u32> {
    options.push(current);
    options.sort_unstable();
    options.dedup();
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_in_order() {
        assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), [1]);
        assert_eq!(divisors(16), [1, 2, 4, 8, 16]);
        assert!(divisors(0).is_empty());
    }
}
