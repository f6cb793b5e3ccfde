//! Measured timelines beside predicted ones: the executor's recorded actions
//! ([`parsim_plan::trace::RankTrace`]) as Chrome trace-event JSON (Perfetto,
//! `chrome://tracing`), one process per rank with one thread per stream (compute,
//! collectives, pipeline sends and receives), and optionally the engine's simulated schedule
//! for the same configuration as a second group of processes (one per pipeline rank), shifted
//! so that each timed step's prediction starts when the measured step started.

use super::kineto_ops::{op_events, OPS_CPU_TID, OPS_KERNEL_TID};
use crate::schedule::{ActionKind, Program, Simulation};
use parsim_plan::plan::{Action, Plan};
use parsim_plan::trace::{EventKind, RankTrace, Stream, TraceEvent};
use serde_json::{json, Value};

/// The thread id of a stream in the trace.
pub fn stream_tid(s: Stream) -> u32 {
    match s {
        Stream::Compute => 0,
        Stream::Collectives => 1,
        Stream::Pipeline => 2,
        Stream::Kernels => 3,
        Stream::Ops => OPS_CPU_TID,
    }
}

/// The thread of each rank's `ProfilerStep#N` spans (one per timed step).
pub const STEPS_TID: u32 = 6;

/// The schedule kind, stage and microbatch of a compute action of the Plan (`None` for
/// sends, receives and the optimizer step, which the schedule does not list).
pub fn schedule_action(a: &Action) -> Option<(ActionKind, u32, u32)> {
    match *a {
        Action::Forward { stage, mb } => Some((ActionKind::F, stage, mb)),
        Action::Backward { stage, mb } => Some((ActionKind::B, stage, mb)),
        Action::BackwardInput { stage, mb } => Some((ActionKind::I, stage, mb)),
        Action::BackwardWeight { stage, mb } => Some((ActionKind::W, stage, mb)),
        _ => None,
    }
}

/// The name of a compute action, as `parsim schedule --chrome-trace` names it: kind,
/// microbatch, chunk (e.g. `F3 c1`).
pub fn compute_name(kind: ActionKind, mb: u32, chunk: u32) -> String {
    format!("{kind}{mb} c{chunk}")
}

/// The kind of a recorded event as the comparison groups it: F, B, I, W, send, recv, wait,
/// optimizer or the collective's operation.
pub fn event_kind(e: &TraceEvent) -> &str {
    match &e.kind {
        EventKind::Action { action, .. } => match action {
            Action::SendActivation { .. } | Action::SendGrad { .. } => "send",
            Action::RecvActivation { .. } | Action::RecvGrad { .. } => "recv",
            Action::OptimizerStep => "optimizer",
            a => schedule_action(a).map_or("?", |(k, _, _)| k.letter()),
        },
        EventKind::Wait { .. } => "wait",
        EventKind::Collective { op, .. } => op,
        EventKind::Kernel { name } => name,
        EventKind::Op { key, .. } => key.class(),
    }
}

/// The display name of a recorded event.
pub fn event_name(e: &TraceEvent, program: &Program) -> String {
    match &e.kind {
        EventKind::Action { action, .. } => match *action {
            Action::SendActivation { to, stage, mb } => format!("send act s{stage} m{mb} -> {to}"),
            Action::SendGrad { to, stage, mb } => format!("send grad s{stage} m{mb} -> {to}"),
            Action::RecvActivation { from, stage, mb } => {
                format!("recv act s{stage} m{mb} <- {from}")
            }
            Action::RecvGrad { from, stage, mb } => format!("recv grad s{stage} m{mb} <- {from}"),
            Action::OptimizerStep => "optimizer".into(),
            ref a => match schedule_action(a) {
                Some((k, s, m)) => compute_name(k, m, program.chunk_of_stage(s)),
                None => "?".into(),
            },
        },
        EventKind::Wait { .. } => "wait".into(),
        EventKind::Collective { op, group, .. } => format!("{op} {group:?}"),
        EventKind::Kernel { name } => name.to_string(),
        EventKind::Op { key, .. } => key.class().to_string(),
    }
}

/// Where the trace's time axis starts: the earliest start of the first timed step.
fn origin_s(traces: &[RankTrace]) -> f64 {
    traces
        .iter()
        .filter_map(|t| t.steps.first().map(|s| s.0))
        .fold(f64::INFINITY, f64::min)
}

/// Timed step `k`'s start on the trace's axis (its earliest rank).
fn step_start_s(traces: &[RankTrace], k: usize) -> f64 {
    traces
        .iter()
        .filter_map(|t| t.steps.get(k).map(|s| s.0))
        .fold(f64::INFINITY, f64::min)
}

fn meta(pid: u64, tid: Option<u32>, name: &str, value: Value) -> Value {
    match tid {
        Some(t) => json!({"name": name, "ph": "M", "pid": pid, "tid": t, "args": value}),
        None => json!({"name": name, "ph": "M", "pid": pid, "args": value}),
    }
}

/// A process's name and its place in the viewer (its pid), as two metadata events.
fn process_meta(pid: u64, label: String) -> [Value; 2] {
    [
        meta(pid, None, "process_name", json!({ "name": label })),
        meta(
            pid,
            None,
            "process_sort_index",
            json!({ "sort_index": pid }),
        ),
    ]
}

/// The Chrome trace of a measured run (`plan` and its per-rank `traces`, rank order), with
/// `predicted` (the engine's program and its simulation) added as one process per pipeline
/// rank when given. Seconds are written as microseconds, the format's unit. It has Kineto's
/// shape (`schemaVersion`, `distributedInfo`, a `ProfilerStep#N` span per rank and timed step,
/// and the timed ops, when the run profiled them, as CPU ops and kernels: [`op_events`]), so
/// `parsim calibrate --trace` reads it as it reads PyTorch's traces.
pub fn measured_chrome_trace(
    plan: &Plan,
    traces: &[RankTrace],
    program: &Program,
    predicted: Option<&Simulation>,
) -> Value {
    let origin = origin_s(traces);
    let mut events = Vec::new();
    let mut next_id = 1u64;
    for (rp, t) in plan.ranks.iter().zip(traces) {
        let pid = rp.rank as u64;
        let c = rp.coords;
        let label = format!(
            "measured rank {} (pp {}, dp {}, tp {})",
            rp.rank, c.pp, c.dp, c.tp
        );
        events.extend(process_meta(pid, label));
        for (tid, n) in [
            (stream_tid(Stream::Compute), "compute"),
            (stream_tid(Stream::Collectives), "collectives"),
            (stream_tid(Stream::Pipeline), "pipeline sends"),
            (stream_tid(Stream::Kernels), "kernels (CP ring blocks)"),
            (OPS_CPU_TID, "timed ops (--profile-ops)"),
            (OPS_KERNEL_TID, "timed ops' kernels (--profile-ops)"),
            (STEPS_TID, "timed steps"),
        ] {
            events.push(meta(pid, Some(tid), "thread_name", json!({ "name": n })));
            events.push(meta(
                pid,
                Some(tid),
                "thread_sort_index",
                json!({ "sort_index": tid }),
            ));
        }
        for (k, &(s0, s1)) in t.steps.iter().enumerate() {
            events.push(json!({
                "ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{k}"),
                "pid": pid, "tid": STEPS_TID, "ts": (s0 - origin) * 1e6,
                "dur": (s1 - s0) * 1e6, "args": {"step": k, "measured": true},
            }));
        }
        for e in &t.events {
            if let EventKind::Op { key, wait_s, group } = &e.kind {
                let times = (
                    (e.start_s - origin) * 1e6,
                    e.duration_s() * 1e6,
                    wait_s * 1e6,
                );
                events.extend(op_events(pid, key, group, times, &mut next_id));
                continue;
            }
            let mut args = json!({
                "step": e.step, "kind": event_kind(e), "measured": true, "pp": c.pp,
            });
            match &e.kind {
                EventKind::Action { action, index } => {
                    args["index"] = json!(index);
                    if let Some((_, s, m)) = schedule_action(action) {
                        args["stage"] = json!(s);
                        args["microbatch"] = json!(m);
                    }
                }
                EventKind::Wait { index } => args["index"] = json!(index),
                EventKind::Collective { group, bytes, .. } => {
                    args["group"] = json!(group);
                    args["bytes"] = json!(bytes);
                }
                EventKind::Kernel { .. } | EventKind::Op { .. } => {}
            }
            events.push(json!({
                "name": event_name(e, program),
                "cat": event_kind(e),
                "ph": "X",
                "pid": pid,
                "tid": stream_tid(e.stream),
                "ts": (e.start_s - origin) * 1e6,
                "dur": e.duration_s() * 1e6,
                "args": args,
            }));
        }
    }
    if let Some(sim) = predicted {
        let steps = traces.iter().map(|t| t.steps.len()).max().unwrap_or(0);
        let offsets: Vec<f64> = (0..steps)
            .map(|k| step_start_s(traces, k) - origin)
            .collect();
        predicted_events(&mut events, plan.world() as u64, program, sim, &offsets);
    }
    json!({
        "schemaVersion": 1,
        "traceName": "parsim execute",
        "distributedInfo": {"backend": "parsim", "world_size": plan.world()},
        "traceEvents": events,
        "displayTimeUnit": "ms",
    })
}

/// The predicted timeline once per timed step (shifted by `offsets_s`), one process per
/// pipeline rank numbered from `first_pid`.
fn predicted_events(
    events: &mut Vec<Value>,
    first_pid: u64,
    program: &Program,
    sim: &Simulation,
    offsets_s: &[f64],
) {
    for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
        let pid = first_pid + r as u64;
        let label = format!("predicted pipeline rank {r} ({})", program.kind);
        events.extend(process_meta(pid, label));
        events.push(meta(
            pid,
            Some(0),
            "thread_name",
            json!({ "name": "compute (predicted)" }),
        ));
        for (step, off) in offsets_s.iter().enumerate() {
            for (a, s) in acts.iter().zip(spans) {
                events.push(json!({
                    "name": compute_name(a.kind, a.microbatch, program.chunk_of_stage(a.stage)),
                    "cat": a.kind.letter(),
                    "ph": "X",
                    "pid": pid,
                    "tid": 0,
                    "ts": (off + s.start) * 1e6,
                    "dur": (s.end - s.start) * 1e6,
                    "args": {
                        "step": step, "kind": a.kind.letter(), "stage": a.stage,
                        "microbatch": a.microbatch, "measured": false, "pp": r,
                    }
                }));
            }
        }
    }
}
