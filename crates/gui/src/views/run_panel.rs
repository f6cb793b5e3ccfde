//! The run controls: tokens to train, the price of a GPU-hour and a deadline (the `[run]`
//! table; the figures appear as cards under the estimate's).

use egui::{DragValue, Ui};
use parsim::config::Config;

/// Billions of tokens offered when the run is switched on (Chinchilla's 20 tokens a parameter
/// for an 8B model is 160B; any value is the user's to change).
const START_BILLIONS: f64 = 160.0;

/// Draws the controls; the price stays unset (no cost) until the user gives one above zero.
pub fn ui(ui: &mut Ui, c: &mut Config) {
    let mut on = c.run.train_tokens.is_some();
    ui.checkbox(&mut on, "Time to train a token budget");
    if !on {
        c.run.train_tokens = None;
        return;
    }
    let mut billions = c
        .run
        .train_tokens
        .map_or(START_BILLIONS, |t| t as f64 / 1e9);
    ui.horizontal(|ui| {
        ui.label("Tokens");
        ui.add(
            DragValue::new(&mut billions)
                .range(0.001..=1.0e6)
                .speed(1.0)
                .suffix(" B"),
        );
    });
    c.run.train_tokens = Some(((billions * 1e9).round() as u64).max(1));
    let mut price = c.run.price_per_gpu_hour_usd.unwrap_or(0.0);
    ui.horizontal(|ui| {
        ui.label("Price per GPU-hour");
        ui.add(
            DragValue::new(&mut price)
                .range(0.0..=1.0e4)
                .speed(0.05)
                .prefix("$"),
        )
        .on_hover_text("0: no price, no cost (there is no default price)");
    });
    c.run.price_per_gpu_hour_usd = (price > 0.0).then_some(price);
    let mut days = c.run.deadline_days.unwrap_or(0.0);
    ui.horizontal(|ui| {
        ui.label("Deadline");
        ui.add(
            DragValue::new(&mut days)
                .range(0.0..=36_500.0)
                .speed(1.0)
                .suffix(" days"),
        )
        .on_hover_text("0: no deadline; a card says by how much the run meets or misses it");
    });
    c.run.deadline_days = (days > 0.0).then_some(days);
}
