//! Headline figures as cards (parameters, FLOPs per step, step time, tokens/s, TFLOP/s per GPU,
//! MFU, and the pipeline bubble's three parts as the CLI splits them), with the step-time
//! interval as a band on the step time, tokens/s and MFU cards; the verdict, and communication
//! per parallel group.

use egui::{vec2, Frame, Grid, RichText, TextStyle, TextWrapMode, Ui, WidgetText};
use parsim::estimate::{breakdown, Estimate};
use parsim::planning::RunForecast;
use parsim::report::format::{bytes, count, flops, seconds};
use parsim::report::run_table;
use parsim::report::table::{comm_rows, share};

/// The cards' titles and values, in display order.
pub fn card_values(e: &Estimate) -> Vec<(&'static str, String)> {
    vec![
        ("Parameters", count(e.params.total as f64)),
        ("FLOPs per step", flops(e.flops.per_step_model)),
        ("Step time", seconds(e.time.step_s)),
        ("Tokens/s", count(e.throughput.tokens_per_s)),
        (
            "TFLOP/s per GPU",
            format!("{:.0}", e.throughput.tflops_per_gpu),
        ),
        ("MFU", format!("{:.1}%", 100.0 * e.throughput.mfu)),
        ("Bubble", share_of(e, "warmup_cooldown_s")),
        ("Stage imbalance", share_of(e, "imbalance_s")),
        ("PP waits", share_of(e, "pp_wait_s")),
    ]
}

/// A card's interval: the lower and upper value of the step-time interval (p10 and p90 of the
/// estimate's regime residuals) around the predicted one, drawn as a band under the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub low: f64,
    pub point: f64,
    pub high: f64,
    /// `p10 4.72 s - p90 7.80 s`.
    pub label: String,
}

/// The bands of the step time, tokens/s and MFU cards (by card title).
pub fn card_bands(e: &Estimate) -> Vec<(&'static str, Band)> {
    let (t, th) = (&e.time, &e.throughput);
    let pair = parsim::report::table::percentile_pair(e);
    let (lo, hi) = pair.split_once('-').unwrap_or(("p10", "p90"));
    let band = |low: f64, point: f64, high: f64, f: &dyn Fn(f64) -> String| Band {
        low,
        point,
        high,
        label: format!("{lo} {} - {hi} {}", f(low), f(high)),
    };
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    vec![
        (
            "Step time",
            band(t.step_s_p10, t.step_s, t.step_s_p90, &seconds),
        ),
        (
            "Tokens/s",
            band(
                th.tokens_per_s_p10,
                th.tokens_per_s,
                th.tokens_per_s_p90,
                &count,
            ),
        ),
        ("MFU", band(th.mfu_p10, th.mfu, th.mfu_p90, &pct)),
    ]
}

/// The share of the step of one breakdown term, as the CLI's time table prints it.
pub fn share_of(e: &Estimate, key: &str) -> String {
    breakdown::terms(&e.time)
        .iter()
        .find(|t| t.key == key)
        .map_or_else(|| "-".into(), |t| share(t.share))
}

/// The run cards' titles and values (`--train-tokens`), in the JSON section's order.
pub fn run_card_values(r: &RunForecast) -> Vec<(&'static str, String)> {
    let mut cards = vec![
        ("Train tokens", run_table::tokens(r.tokens)),
        ("Wall time", format!("{:.1} days", r.wall_days)),
        ("GPU-hours", count(r.gpu_hours)),
        (
            "Energy",
            r.energy_mwh.map_or("-".into(), |e| format!("{e:.1} MWh")),
        ),
        (
            "Cost",
            r.cost_usd.map_or("-".into(), |c| format!("${}", count(c))),
        ),
        ("Goodput", share(r.goodput_fraction)),
        ("Checkpoint every", seconds(r.checkpoint_interval_s)),
        ("Interruptions", format!("{:.1}", r.expected_interruptions)),
    ];
    if let (Some(d), Some(m)) = (r.deadline_days, r.deadline_margin_days) {
        cards.push(("Deadline", run_table::deadline_verdict(d, m)));
    }
    cards
}

/// Draws the run cards and their notes when the configuration asks for a run.
pub fn run_ui(ui: &mut Ui, run: Option<&Result<RunForecast, String>>) {
    match run {
        None => {}
        Some(Err(e)) => {
            ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
        }
        Some(Ok(r)) => {
            ui.add_space(4.0);
            ui.horizontal_wrapped(|ui| {
                for (t, v) in run_card_values(r) {
                    card(ui, t, &v, None);
                }
            });
            for n in &r.notes {
                ui.label(RichText::new(format!("note: {n}")).small().weak());
            }
        }
    }
}

/// The narrowest card, in points.
const CARD_MIN_WIDTH: f32 = 112.0;

/// One card. A wrapping row places a widget by the size it asks for before it is drawn, so
/// the card asks for its whole measured size: one that does not fit starts the next row
/// instead of running past the panel's edge (and widening everything drawn under it).
fn card(ui: &mut Ui, title: &str, value: &str, band: Option<&Band>) {
    let title = WidgetText::from(RichText::new(title).small().weak());
    let value = WidgetText::from(RichText::new(value).size(19.0).strong());
    let note = band.map(|b| WidgetText::from(RichText::new(&b.label).small().weak()));
    let measure = |t: &WidgetText| {
        t.clone()
            .into_galley(
                ui,
                Some(TextWrapMode::Extend),
                f32::INFINITY,
                TextStyle::Body,
            )
            .size()
    };
    let (t, v) = (measure(&title), measure(&value));
    let n = note.as_ref().map_or(vec2(0.0, 0.0), measure);
    let frame = Frame::group(ui.style()).inner_margin(8.0);
    let gap = ui.spacing().item_spacing.y;
    let band_extra = if band.is_some() {
        2.0 * gap + BAND_HEIGHT + n.y
    } else {
        0.0
    };
    let content = vec2(
        t.x.max(v.x).max(n.x).max(CARD_MIN_WIDTH),
        t.y + gap + v.y + band_extra,
    );
    ui.allocate_ui(content + frame.total_margin().sum(), |ui| {
        frame.show(ui, |ui| {
            ui.set_min_width(CARD_MIN_WIDTH);
            ui.vertical(|ui| {
                ui.label(title);
                ui.label(value);
                if let (Some(b), Some(note)) = (band, note) {
                    draw_band(ui, b, content.x);
                    ui.label(note);
                }
            });
        });
    });
}

/// Height of a card's interval band, in points.
const BAND_HEIGHT: f32 = 8.0;

/// The interval as a bar from its low to its high value with a tick at the prediction, on an
/// axis spanning all three (a tenth of the span of margin each side).
fn draw_band(ui: &mut Ui, b: &Band, width: f32) {
    let (rect, _) = ui.allocate_exact_size(vec2(width, BAND_HEIGHT), egui::Sense::hover());
    let (lo, hi) = (b.low.min(b.point), b.high.max(b.point));
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let (axis_lo, axis_span) = (lo - 0.1 * span, 1.2 * span);
    let x = |v: f64| rect.left() + (((v - axis_lo) / axis_span) as f32) * rect.width();
    let visuals = ui.visuals();
    let painter = ui.painter();
    painter.rect_filled(rect, 2.0, visuals.extreme_bg_color);
    let bar = egui::Rect::from_x_y_ranges(x(b.low)..=x(b.high), rect.y_range());
    painter.rect_filled(bar, 2.0, visuals.selection.bg_fill);
    painter.vline(
        x(b.point),
        rect.y_range(),
        egui::Stroke::new(2.0, visuals.strong_text_color()),
    );
}

/// How the GPUs sit in NVLink domains (as `parsim layout` says it): domains of how many
/// GPUs over how many nodes, or the node as the domain, and how the size was chosen where
/// the engine says more than "each node".
pub fn nvlink_domains(e: &Estimate) -> String {
    let c = &e.config.cluster;
    let per_node = c.per_node().max(1);
    let domain = c.nvlink_domain_size.unwrap_or(per_node).max(1);
    let how = e
        .nvlink_domain
        .as_ref()
        .map_or(String::new(), |d| format!("; {}", d.reason));
    if domain == per_node {
        return format!("NVLink domains: each node of {per_node} GPUs{how}");
    }
    format!(
        "NVLink domains: {} of {domain} GPUs ({} nodes of {per_node} each){how}",
        c.num_gpus.div_ceil(domain),
        domain.div_ceil(per_node)
    )
}

/// Draws the cards, the verdict, the NVLink domains, the communication table and the engine's warnings.
pub fn ui(ui: &mut Ui, e: &Estimate) {
    let bands = card_bands(e);
    ui.horizontal_wrapped(|ui| {
        for (t, v) in card_values(e) {
            let band = bands.iter().find(|(bt, _)| *bt == t).map(|(_, b)| b);
            card(ui, t, &v, band);
        }
    });
    ui.add_space(4.0);
    ui.label(RichText::new(&e.verdict).italics());
    ui.add_space(4.0);
    ui.label(nvlink_domains(e));
    egui::CollapsingHeader::new("Communication per step, per GPU")
        .default_open(true)
        .show(ui, |ui| {
            Grid::new("comm")
                .striped(true)
                .num_columns(4)
                .show(ui, |ui| {
                    ui.strong("group");
                    ui.strong("size");
                    ui.strong("sent");
                    ui.strong("exposed");
                    ui.end_row();
                    for row in comm_rows(e) {
                        let across = if row.crosses_nodes {
                            " (across NVLink domains)"
                        } else {
                            ""
                        };
                        ui.label(row.kind.info().name);
                        ui.label(format!("{}{across}", row.size));
                        ui.label(bytes(row.sent_bytes as f64));
                        ui.label(seconds(row.exposed_s));
                        ui.end_row();
                    }
                });
        });
    for w in &e.warnings {
        ui.label(RichText::new(format!("note: {w}")).small().weak());
    }
}
