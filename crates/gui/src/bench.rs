//! `parsim-gui --bench`: how long the app takes to recompute after a change on a large
//! configuration (Llama-3-405B on 16,384 H100s), so the window never stutters. The budget is
//! one frame at 60 Hz, 16 ms.

use crate::state::Session;
use parsim::config::{Config, Layer, Recompute, ScheduleKind};
use std::time::Duration;

/// Llama-3-405B on 16,384 H100s: TP 8, PP 16 (7 + 14 x 8 + 7 layers), 1F1B, DP 128, global
/// batch 2048 (16 microbatches): the engine bench's configuration.
pub fn large_config() -> Config {
    Config::from_layers(&[Layer::overrides(serde_json::json!({
        "model": {"preset": "llama3-405b"},
        "cluster": {"num_gpus": 16384, "gpus_per_node": 8},
        "parallel": {"tp": 8, "cp": 1, "pp": 16, "vpp": 1, "schedule": "1f1b", "zero": 1,
                     "first_stage_layers": 7, "last_stage_layers": 7},
        "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 2048}
    }))])
    .expect("the bench configuration parses")
}

/// The edits the bench cycles through, each giving a valid configuration.
fn edit(c: &mut Config, i: usize) {
    match i % 6 {
        0 => c.parallel.zero = if c.parallel.zero == 1 { 2 } else { 1 },
        1 => {
            c.training.recompute = if c.training.recompute == Recompute::Selective {
                Recompute::Full
            } else {
                Recompute::Selective
            }
        }
        2 => {
            c.training.global_batch_size = if c.training.global_batch_size == 2048 {
                4096
            } else {
                2048
            }
        }
        3 => c.parallel.tp = if c.parallel.tp == 8 { 4 } else { 8 },
        4 => {
            c.parallel.schedule = if c.parallel.schedule == ScheduleKind::OneFOneB {
                ScheduleKind::ZbH1
            } else {
                ScheduleKind::OneFOneB
            }
        }
        _ => {
            c.cluster.gpus_per_node = Some(if c.cluster.per_node() == 8 { 4 } else { 8 });
        }
    }
}

/// Recompute times of one bench run.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub label: String,
    pub samples: Vec<Duration>,
    /// Edits that left the configuration invalid (should be 0).
    pub invalid: usize,
}

impl BenchReport {
    /// The `q` quantile (0..=1) of the samples.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort_unstable();
        if s.is_empty() {
            return Duration::ZERO;
        }
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

/// Times `iterations` edit-and-recompute cycles on [`large_config`], with the timeline's
/// comparison schedule on or off.
pub fn run(iterations: usize, compare: bool) -> BenchReport {
    let mut s = Session::new(large_config());
    s.compare = compare.then_some(ScheduleKind::ZbH1);
    s.refresh();
    let mut samples = Vec::with_capacity(iterations);
    let mut invalid = 0;
    for i in 0..iterations {
        edit(&mut s.config, i);
        assert!(s.refresh(), "an edit always changes the configuration");
        samples.push(s.last_recompute);
        invalid += usize::from(!s.is_current());
    }
    BenchReport {
        label: format!(
            "recompute, llama3-405b on 16384 x h100-sxm (tp8 pp16 dp128, 16 microbatches){}",
            if compare {
                ", comparing with zb-h1"
            } else {
                ""
            }
        ),
        samples,
        invalid,
    }
}

/// Times `iterations` whole frames after an edit, headless: the recompute, the egui pass that
/// lays out and paints every view of [`ParsimApp`](crate::ParsimApp) into a 1600 x 1000 window,
/// and tessellation into triangles (everything but the GPU upload and draw).
pub fn run_frames(iterations: usize, compare: bool) -> BenchReport {
    use std::time::Instant;
    let ctx = egui::Context::default();
    let mut app = crate::ParsimApp::new(Session::new(large_config()));
    app.timeline.compare = compare;
    app.timeline.compare_with = ScheduleKind::ZbH1;
    let input = || egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(
            egui::Pos2::ZERO,
            egui::vec2(1600.0, 1000.0),
        )),
        ..Default::default()
    };
    let frame = |app: &mut crate::ParsimApp| {
        let mut out = ctx.run_ui(input(), |ui| app.show(ui));
        let shapes = std::mem::take(&mut out.shapes);
        let ppp = out.pixels_per_point;
        // No renderer here to upload the font atlas to.
        out.drop_without_applying_deltas();
        let prims = ctx.tessellate(shapes, ppp);
        std::hint::black_box(prims);
    };
    for _ in 0..5 {
        frame(&mut app); // fonts, first layout
    }
    let mut samples = Vec::with_capacity(iterations);
    let mut invalid = 0;
    for i in 0..iterations {
        edit(&mut app.session.config, i);
        let start = Instant::now();
        frame(&mut app);
        samples.push(start.elapsed());
        invalid += usize::from(!app.session.is_current());
    }
    BenchReport {
        label: format!(
            "whole frame (recompute, egui layout and painting, tessellation; no GPU) at 1600x1000, llama3-405b on 16384 x h100-sxm{}",
            if compare { ", comparing with zb-h1" } else { "" }
        ),
        samples,
        invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bench_edit_is_valid() {
        let r = run(12, true);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.samples.len(), 12);
    }

    #[test]
    fn frames_draw_after_every_edit() {
        let r = run_frames(6, true);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.samples.len(), 6);
    }
}
