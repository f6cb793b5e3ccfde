//! Headline figures as cards (parameters, FLOPs per step, step time, tokens/s, TFLOP/s per GPU,
//! MFU, and the pipeline bubble's three parts as the CLI splits them), the verdict, and communication per parallel group.

use egui::{vec2, Frame, Grid, RichText, TextStyle, TextWrapMode, Ui, WidgetText};
use parsim::estimate::{breakdown, Estimate};
use parsim::planning::RunReport;
use parsim::report::format::{bytes, count, flops, seconds};
use parsim::report::run_table;
use parsim::report::table::share;

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

/// The share of the step of one breakdown term, as the CLI's time table prints it.
pub fn share_of(e: &Estimate, key: &str) -> String {
    breakdown::terms(&e.time)
        .iter()
        .find(|t| t.key == key)
        .map_or_else(|| "-".into(), |t| share(t.share))
}

/// The run cards' titles and values (`--train-tokens`), in the JSON section's order.
pub fn run_card_values(r: &RunReport) -> Vec<(&'static str, String)> {
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
pub fn run_ui(ui: &mut Ui, run: Option<&Result<RunReport, String>>) {
    match run {
        None => {}
        Some(Err(e)) => {
            ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
        }
        Some(Ok(r)) => {
            ui.add_space(4.0);
            ui.horizontal_wrapped(|ui| {
                for (t, v) in run_card_values(r) {
                    card(ui, t, &v);
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
fn card(ui: &mut Ui, title: &str, value: &str) {
    let title = WidgetText::from(RichText::new(title).small().weak());
    let value = WidgetText::from(RichText::new(value).size(19.0).strong());
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
    let frame = Frame::group(ui.style()).inner_margin(8.0);
    let content = vec2(
        t.x.max(v.x).max(CARD_MIN_WIDTH),
        t.y + ui.spacing().item_spacing.y + v.y,
    );
    ui.allocate_ui(content + frame.total_margin().sum(), |ui| {
        frame.show(ui, |ui| {
            ui.set_min_width(CARD_MIN_WIDTH);
            ui.vertical(|ui| {
                ui.label(title);
                ui.label(value);
            });
        });
    });
}

/// How the GPUs sit in NVLink domains (as `parsim layout` says it): domains of how many
/// GPUs over how many nodes, or the node as the domain.
pub fn nvlink_domains(e: &Estimate) -> String {
    let c = &e.config.cluster;
    let per_node = c.gpus_per_node.max(1);
    let domain = c.nvlink_domain_size.unwrap_or(per_node).max(1);
    if domain == per_node {
        return format!("NVLink domains: each node of {per_node} GPUs");
    }
    format!(
        "NVLink domains: {} of {domain} GPUs ({} nodes of {per_node} each)",
        c.num_gpus.div_ceil(domain),
        domain / per_node
    )
}

/// Draws the cards, the verdict, the NVLink domains, the communication table and the engine's warnings.
pub fn ui(ui: &mut Ui, e: &Estimate) {
    ui.horizontal_wrapped(|ui| {
        for (t, v) in card_values(e) {
            card(ui, t, &v);
        }
    });
    ui.add_space(4.0);
    ui.label(RichText::new(&e.verdict).italics());
    ui.add_space(4.0);
    ui.label(nvlink_domains(e));
    let c = &e.communication.per_step_bytes_per_gpu;
    let g = &e.time.exposed_comm_by_group_s;
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
                    let size = |name: &str| {
                        e.communication
                            .groups
                            .iter()
                            .find(|gi| gi.group.as_str().eq_ignore_ascii_case(name))
                            .map(|gi| {
                                format!(
                                    "{}{}",
                                    gi.size,
                                    if gi.crosses_nodes {
                                        " (across NVLink domains)"
                                    } else {
                                        ""
                                    }
                                )
                            })
                            .unwrap_or_default()
                    };
                    for (name, b, s) in [
                        ("TP", c.tp, g.tp),
                        ("CP", c.cp, g.cp),
                        ("PP", c.pp, g.pp),
                        ("DP", c.dp, g.dp),
                        ("EP", c.ep, g.ep),
                        ("expert_TP", c.expert_tp, g.expert_tp),
                    ] {
                        ui.label(name);
                        ui.label(size(name));
                        ui.label(bytes(b as f64));
                        ui.label(seconds(s));
                        ui.end_row();
                    }
                });
        });
    for w in &e.warnings {
        ui.label(RichText::new(format!("note: {w}")).small().weak());
    }
}
