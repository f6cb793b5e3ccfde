//! Measured timelines: every action a rank plays in a timed step, with its start and end on
//! the backend's clock (a monotonic clock shared by the CPU backend's rank threads), the wait
//! a receive spent blocked before its data arrived, and every collective the rank called
//! inside an action (the model's TP/SP, CP and MoE collectives as well as the optimizer's and
//! ZeRO's data-parallel ones; see the executor's `traced_comm`) with its group and bytes.
//! `parsim execute --trace` writes them as a Chrome trace beside the engine's predicted
//! timeline.

use crate::op_timing::OpKey;
use crate::plan::Action;
use serde::Serialize;

/// The track an event is drawn on (one thread per stream in the trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Stream {
    /// Forward, backward parts and the optimizer step.
    Compute,
    /// Collectives (model and data-parallel) and CP's ring messages.
    Collectives,
    /// Pipeline sends and receives (and the waits before receives).
    Pipeline,
    /// Device work inside an action recorded on its own to show what it overlaps: each
    /// attention block of the CP ring, computed while the next block's exchange is in flight.
    Kernels,
    /// Every timed op of the step (`--profile-ops` with `--trace`), keyed as its op timing.
    Ops,
}

/// What an event records.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub enum EventKind {
    /// One action of the rank's Plan (`index` into its action list).
    Action { action: Action, index: usize },
    /// Time a receive spent blocked before its message arrived (precedes the receive).
    Wait { index: usize },
    /// A collective (or a CP ring message, op `p2p_send`/`p2p_recv` with the pair as group) called
    /// inside an action.
    Collective {
        op: std::borrow::Cow<'static, str>,
        group: Vec<u32>,
        bytes: u64,
    },
    /// A piece of device work inside an action (see [`Stream::Kernels`]).
    Kernel {
        name: std::borrow::Cow<'static, str>,
    },
    /// A timed op (see [`Stream::Ops`]): its op-timing key, the seconds of its span spent
    /// waiting for other ranks (counted as [`OpKey::Wait`], not as the op's), and for a
    /// collective its group's global ranks.
    Op {
        key: OpKey,
        wait_s: f64,
        group: Vec<u32>,
    },
}

/// One recorded span; times are seconds since the run's clock origin.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct TraceEvent {
    /// Timed step (0 = the first step after warm-up).
    pub step: u32,
    pub stream: Stream,
    pub kind: EventKind,
    pub start_s: f64,
    pub end_s: f64,
}

impl TraceEvent {
    /// Seconds the span lasted.
    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }
}

/// One rank's recorded timeline over the timed steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RankTrace {
    /// Start and end of each timed step (seconds since the clock origin).
    pub steps: Vec<(f64, f64)>,
    pub events: Vec<TraceEvent>,
}

/// The stream an action of the Plan runs on.
pub fn stream_of(a: &Action) -> Stream {
    match a {
        Action::Forward { .. }
        | Action::Backward { .. }
        | Action::BackwardInput { .. }
        | Action::BackwardWeight { .. }
        | Action::OptimizerStep => Stream::Compute,
        _ => Stream::Pipeline,
    }
}
