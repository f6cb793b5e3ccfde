//! The timed ops of a measured run (`execute --trace --profile-ops`) in Kineto's vocabulary,
//! so that `parsim calibrate --trace` reads parsim's trace with the reader it uses for
//! PyTorch's: per op a CPU op (`cat` "cpu_op") and its kernel (`cat` "kernel") linked by
//! `External id` and `correlation`. GEMMs carry `Input Dims` ([[m, k], [k, n]]) and `Input
//! type`; collectives are `record_param_comms` with `Collective name`, `In msg nelems`, `Out
//! msg nelems`, `dtype` (sizes in bytes: `Byte`), `Group size` and `Process Group Ranks`, as
//! PyTorch writes them; attention and memory-bound ops, which Kineto describes by their aten
//! op's arguments, carry their op-timing key as `parsim op`; a wait for other ranks inside an
//! op is a `parsim::wait` span of its own, so the op's kernel is its own time.

use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{CollectiveKind, OpKey};
use serde_json::{json, Value};

/// The thread (`tid`) of the ops' CPU events and of their kernels in each rank's process.
pub const OPS_CPU_TID: u32 = 4;
pub const OPS_KERNEL_TID: u32 = 5;

/// `record_param_comms`' `Collective name` for each collective, as torch.distributed names
/// them.
fn collective_name(op: CollectiveKind) -> &'static str {
    match op {
        CollectiveKind::AllReduce => "allreduce",
        CollectiveKind::AllGather => "_allgather_base",
        CollectiveKind::ReduceScatter => "_reduce_scatter_base",
        CollectiveKind::AllToAll => "all_to_all",
        CollectiveKind::Broadcast => "broadcast",
        CollectiveKind::SendRecv => "send",
    }
}

/// The CPU op's name and Kineto arguments for `key` (with `group` for a collective).
fn cpu_op(key: &OpKey, group: &[u32]) -> (String, Value) {
    match key {
        OpKey::Gemm { m, n, k, dtype } => {
            let t = match dtype {
                DType::Bf16 => "c10::BFloat16",
                DType::F32 => "float",
                DType::U8 => "unsigned char",
            };
            (
                "parsim::gemm".into(),
                json!({"Input Dims": [[m, k], [k, n]], "Input type": [t, t]}),
            )
        }
        OpKey::Collective {
            op,
            bytes,
            group_size,
            ..
        } => {
            let g = u64::from(*group_size).max(1);
            let (input, output) = match op {
                CollectiveKind::AllGather => (bytes / g, *bytes),
                CollectiveKind::ReduceScatter => (*bytes, bytes / g),
                _ => (*bytes, *bytes),
            };
            (
                "record_param_comms".into(),
                json!({
                    "Collective name": collective_name(*op),
                    "In msg nelems": input,
                    "Out msg nelems": output,
                    "dtype": "Byte",
                    "Group size": group_size,
                    "Process Group Ranks": format!("{group:?}"),
                }),
            )
        }
        OpKey::Wait => ("parsim::wait".into(), json!({})),
        other => (
            format!("parsim::{}", other.class()),
            json!({ "parsim op": other }),
        ),
    }
}

/// The kernel's name for `key`.
fn kernel_name(key: &OpKey) -> String {
    match key {
        OpKey::Collective { op, .. } => format!("parsim::{}", op.as_str()),
        other => format!("parsim::{}", other.class()),
    }
}

/// A timed op's events for process `pid`: its wait (`wait_us` at the start, when any) and the
/// op itself, each as a CPU op and its kernel, ids from `next_id`. Times in microseconds.
pub fn op_events(
    pid: u64,
    key: &OpKey,
    group: &[u32],
    (ts_us, dur_us, wait_us): (f64, f64, f64),
    next_id: &mut u64,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut push = |key: &OpKey, ts: f64, dur: f64| {
        let id = *next_id;
        *next_id += 1;
        let (name, mut args) = cpu_op(key, group);
        args["External id"] = json!(id);
        out.push(json!({
            "ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": OPS_CPU_TID,
            "ts": ts, "dur": dur, "args": args,
        }));
        out.push(json!({
            "ph": "X", "cat": "kernel", "name": kernel_name(key), "pid": pid,
            "tid": OPS_KERNEL_TID, "ts": ts, "dur": dur,
            "args": {"External id": id, "correlation": id, "device": pid, "stream": OPS_KERNEL_TID},
        }));
    };
    let wait_us = wait_us.clamp(0.0, dur_us);
    if wait_us > 0.0 {
        push(&OpKey::Wait, ts_us, wait_us);
    }
    push(key, ts_us + wait_us, dur_us - wait_us);
    out
}
