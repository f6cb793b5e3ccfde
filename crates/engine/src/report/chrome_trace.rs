//! Chrome trace-event JSON of simulated schedules, loadable in Perfetto (ui.perfetto.dev) or
//! `chrome://tracing`.
//!
//! One process per schedule, one thread (track) per pipeline rank, one complete event
//! (`"ph": "X"`) per action. Simulated times are taken as seconds and written in
//! microseconds, the format's unit. The two halves of an overlapped DualPipe-V slot are two
//! events with the same start and duration.

use crate::schedule::{Program, Simulation};
use serde_json::{json, Value};

/// The trace of one or more simulated schedules (stacked as separate processes).
pub fn chrome_trace(runs: &[(&Program, &Simulation)]) -> Value {
    let mut events = Vec::new();
    for (pid, (program, sim)) in runs.iter().enumerate() {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": pid,
            "args": {"name": format!("{} (pp {}, vpp {}, m {})",
                program.kind, program.pp, program.vpp, program.microbatches)}
        }));
        events.push(json!({
            "name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}
        }));
        for (r, (acts, spans)) in program.ranks.iter().zip(&sim.timeline).enumerate() {
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": pid, "tid": r,
                "args": {"name": format!("rank {r}")}
            }));
            events.push(json!({
                "name": "thread_sort_index", "ph": "M", "pid": pid, "tid": r,
                "args": {"sort_index": r}
            }));
            for (a, s) in acts.iter().zip(spans) {
                let chunk = program.chunk_of_stage(a.stage);
                events.push(json!({
                    "name": format!("{}{} c{}", a.kind, a.microbatch, chunk),
                    "cat": a.kind.letter(),
                    "ph": "X",
                    "pid": pid,
                    "tid": r,
                    "ts": s.start * 1e6,
                    "dur": (s.end - s.start) * 1e6,
                    "args": {
                        "kind": a.kind.letter(),
                        "stage": a.stage,
                        "chunk": chunk,
                        "microbatch": a.microbatch,
                        "overlapped": a.overlap != crate::schedule::Overlap::None,
                    }
                }));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}
