//! Step time, closed form: compute at an efficiency of peak, the textbook pipeline bubble, TP
//! and EP communication exposed, DP/CP/PP communication assumed hidden, and the optimizer
//! step bandwidth-bound. The time-model issue replaces this with the op-level model and the
//! schedule simulator; until then `estimate` says so in its warnings.

use crate::config::{Resolved, ScheduleKind};
use crate::layout::{GroupKind, Layout};
use crate::model::GroupBytes;
use serde::Serialize;

/// Step time and its parts, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepTime {
    pub step_s: f64,
    pub compute_s: f64,
    pub exposed_comm_s: f64,
    pub bubble_s: f64,
    pub optimizer_s: f64,
}

/// Per-microbatch compute of the slowest stage, split as zero-bubble schedules split it.
#[derive(Debug, Clone, Copy, Default)]
pub struct StageWork {
    pub fwd_s: f64,
    pub dgrad_s: f64,
    pub wgrad_s: f64,
}

/// Closed-form pipeline bubble, idle time per rank. 1F1B and GPipe: (p-1)(F+B) (Narayanan et al.
/// 2021); interleaved: that over v; ZB-H1: (p-1)(F+B-2W) (DualPipe README, ZB1P); ZB-V: the
/// same with chunk-sized times; DualPipe-V: (p/2-1)(F&B+B-3W) with F&B = F+B (no overlap gain).
pub fn bubble_s(kind: ScheduleKind, p: u32, v: u32, w: &StageWork) -> f64 {
    let pm1 = (p - 1) as f64;
    let (f, b, wg) = (w.fwd_s, w.dgrad_s + w.wgrad_s, w.wgrad_s);
    match kind {
        ScheduleKind::Gpipe | ScheduleKind::OneFOneB => pm1 * (f + b),
        ScheduleKind::Interleaved1F1B => pm1 * (f + b) / v as f64,
        ScheduleKind::ZbH1 => pm1 * (f + b - 2.0 * wg),
        ScheduleKind::ZbV => pm1 * (f + b - 2.0 * wg) / 2.0,
        ScheduleKind::DualPipeV => {
            ((p as f64 / 2.0 - 1.0).max(0.0)) * ((f + b) / 2.0 + b / 2.0 - 1.5 * wg)
        }
    }
}

/// Seconds to move `bytes` over the link class the group uses.
fn link_s(r: &Resolved, layout: &Layout, kind: GroupKind, bytes: f64) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    let link = if layout.group_crosses_nodes(kind, 0) {
        &r.gpu.links.inter_node
    } else {
        &r.gpu.links.intra_node
    };
    bytes / (link.bandwidth_bytes_per_s * link.efficiency)
}

/// The closed-form step time of the slowest pipeline rank.
pub fn step_time(
    r: &Resolved,
    layout: &Layout,
    work: &StageWork,
    comm: &GroupBytes,
    optimizer_bytes: f64,
) -> StepTime {
    let peak = r
        .gpu
        .peak_flops_for(r.config.training.precision)
        .unwrap_or(r.gpu.peak_flops.bf16);
    let _ = peak;
    let m = r.microbatches as f64;
    let compute_s = m * (work.fwd_s + work.dgrad_s + work.wgrad_s);
    let p = r.config.parallel.pp;
    let bubble = if p > 1 {
        bubble_s(r.config.parallel.schedule, p, r.config.parallel.vpp, work)
    } else {
        0.0
    };
    let exposed =
        link_s(r, layout, GroupKind::Tp, comm.tp) + link_s(r, layout, GroupKind::Ep, comm.ep);
    let optimizer_s = optimizer_bytes / (r.gpu.hbm_bytes_per_s * r.gpu.efficiency.memory_bound);
    StepTime {
        step_s: compute_s + bubble + exposed + optimizer_s,
        compute_s,
        exposed_comm_s: exposed,
        bubble_s: bubble,
        optimizer_s,
    }
}
