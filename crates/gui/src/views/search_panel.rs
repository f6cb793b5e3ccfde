//! The search panel: search every parallel mix for the current model and GPU count (on a
//! background thread, with a progress bar), list the fastest that fit, click one to load it.

use egui::{DragValue, ProgressBar, RichText, ScrollArea, Ui};
use parsim::report::format::seconds;
use parsim::search::{Mix, SearchResult};

/// The panel's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchOptions {
    /// How many mixes to list.
    pub top: usize,
    /// Largest micro batch tried.
    pub mbs_max: u64,
    /// Comma-separated constraints (`tp<=8, schedule!=gpipe`).
    pub constraints: String,
    /// Simulate every candidate that may fit (slower, same answer).
    pub exhaustive: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            top: 10,
            mbs_max: 2,
            constraints: String::new(),
            exhaustive: false,
        }
    }
}

/// What the search panel shows.
#[derive(Debug)]
pub struct SearchView<'a> {
    /// Progress (done, total) while a search runs.
    pub running: Option<(u64, u64)>,
    /// The last search's outcome.
    pub result: Option<&'a Result<SearchResult, String>>,
    /// What the search will cover ("llama3-8b on 8 x h100-sxm").
    pub scope: String,
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SearchAction {
    None,
    Start,
    Cancel,
    Load(Mix),
}

/// Draws the panel; returns the user's request.
pub fn ui(ui: &mut Ui, opt: &mut SearchOptions, view: &SearchView<'_>) -> SearchAction {
    let mut action = SearchAction::None;
    ui.heading("Search");
    ui.label(
        RichText::new(format!(
            "Every parallel mix for {}, fastest first.",
            view.scope
        ))
        .small(),
    );
    ui.horizontal(|ui| {
        let l = ui.label("Top");
        ui.add(DragValue::new(&mut opt.top).range(1..=100))
            .labelled_by(l.id);
        let l = ui.label("Max micro batch");
        ui.add(DragValue::new(&mut opt.mbs_max).range(1..=64))
            .labelled_by(l.id);
    });
    ui.horizontal(|ui| {
        let l = ui.label("Constraints");
        ui.add(
            egui::TextEdit::singleline(&mut opt.constraints)
                .hint_text("tp<=8, schedule!=gpipe")
                .desired_width(180.0),
        )
        .labelled_by(l.id);
    });
    ui.checkbox(&mut opt.exhaustive, "Exhaustive (no step-time pruning)");
    match view.running {
        Some((done, total)) => {
            let frac = if total > 0 {
                done as f32 / total as f32
            } else {
                0.0
            };
            ui.add(
                ProgressBar::new(frac)
                    .show_percentage()
                    .text(format!("{done} / {total}")),
            );
            if ui.button("Cancel").clicked() {
                action = SearchAction::Cancel;
            }
        }
        None => {
            if ui.button("Run search").clicked() {
                action = SearchAction::Start;
            }
        }
    }
    ui.separator();
    match view.result {
        None => {}
        Some(Err(e)) => {
            let color = ui.visuals().error_fg_color;
            ui.add(egui::Label::new(RichText::new(e.clone()).color(color)).wrap());
        }
        Some(Ok(r)) => {
            ui.label(
                RichText::new(format!(
                    "{} candidates, {} evaluated ({} do not fit), {} pruned, {:.2} s{}",
                    r.candidates,
                    r.evaluated,
                    r.pruned.memory,
                    r.pruned.unevaluated(),
                    r.elapsed_s,
                    if r.interrupted { " (cancelled)" } else { "" }
                ))
                .small(),
            );
            if r.top.is_empty() {
                ui.label("No mix fits.");
            }
            ScrollArea::vertical()
                .id_salt("search_results")
                .show(ui, |ui| {
                    for (i, t) in r.top.iter().enumerate() {
                        let e = &t.estimate;
                        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                        let text = format!(
                            "{}. {}\n      {} ({} - {}) · MFU {:.1}% · {:.1} GiB (p90 {:.1} GiB, {:.1} GiB to spare)",
                            i + 1,
                            t.label,
                            seconds(e.time.step_s),
                            seconds(e.time.step_s_p10),
                            seconds(e.time.step_s_p90),
                            100.0 * e.throughput.mfu,
                            gib(e.memory.per_gpu_max_bytes),
                            gib(e.memory.per_gpu_max_bytes_p90),
                            e.memory.margin_bytes_p90 as f64 / (1u64 << 30) as f64
                        );
                        if ui
                            .selectable_label(false, text)
                            .on_hover_text("Load this mix")
                            .clicked()
                        {
                            action = SearchAction::Load(t.mix);
                        }
                    }
                });
        }
    }
    action
}
