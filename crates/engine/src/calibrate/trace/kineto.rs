//! Kineto JSON as `torch.profiler`'s `export_chrome_trace` writes it (plain or gzipped; one
//! file per rank), read into the events a calibration needs: the GPU kernels (`cat`
//! "kernel") with their device, stream, start and duration; the CPU ops (`cat` "cpu_op") by
//! their `External id`, with their arguments (`Input Dims`, `Input type`, `Concrete Inputs`,
//! `record_param_comms`' collective fields); the runtime launches (`cat` "cuda_runtime") that
//! link a kernel's `correlation` to its CPU op; and the `ProfilerStep#N` spans. parsim's own
//! `execute --trace` writes the same shape (docs/calibration.md, "Calibrating from a trace").

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Why a trace file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a Kineto trace: {message}")]
    NotJson { path: String, message: String },
    #[error("{path}: traceEvents[{index}] ({what}): {rule}")]
    Event {
        path: String,
        index: usize,
        what: String,
        rule: String,
    },
    #[error("no kernel events (`cat` \"kernel\") in {paths}: record the trace with CUDA activities (torch.profiler's ProfilerActivity.CUDA) or, for parsim's executor, `execute --trace FILE --profile-ops`")]
    NoKernels { paths: String },
    #[error("no trace files given")]
    NoFiles,
}

/// One event as the file holds it; checked field by field in [`read`].
#[derive(Deserialize)]
struct RawEvent {
    ph: Option<String>,
    cat: Option<String>,
    name: Option<Value>,
    pid: Option<Value>,
    tid: Option<Value>,
    ts: Option<Value>,
    dur: Option<Value>,
    #[serde(default)]
    args: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct RawTrace {
    #[serde(rename = "traceEvents")]
    trace_events: Option<Vec<RawEvent>>,
    #[serde(rename = "distributedInfo")]
    distributed_info: Option<Value>,
    #[serde(rename = "traceName")]
    trace_name: Option<Value>,
}

/// A GPU kernel (or, in parsim's own trace, a timed op on its device).
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    /// The device the kernel ran on (the event's `pid`), as text.
    pub device: String,
    /// Microseconds on the trace's clock.
    pub start_us: f64,
    pub dur_us: f64,
    pub correlation: Option<u64>,
    pub external_id: Option<u64>,
    pub args: Map<String, Value>,
}

/// A CPU op: its name and arguments, the thread it ran on and its span (microseconds).
#[derive(Debug, Clone)]
pub struct CpuOp {
    pub name: String,
    pub args: Map<String, Value>,
    pub thread: (String, String),
    pub start_us: f64,
    pub end_us: f64,
}

/// A runtime launch: the thread it was made on, when, and its `External id`.
#[derive(Debug, Clone)]
pub struct Launch {
    pub thread: (String, String),
    pub ts_us: f64,
    pub external_id: Option<u64>,
}

/// A `ProfilerStep#N` span: the process it was recorded in and its extent in microseconds.
#[derive(Debug, Clone)]
pub struct StepSpan {
    pub pid: String,
    pub start_us: f64,
    pub end_us: f64,
}

/// One trace file, read.
#[derive(Debug, Clone)]
pub struct TraceFile {
    pub path: String,
    /// `distributedInfo.rank` and `.world_size`, where the file has them.
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub trace_name: Option<String>,
    pub kernels: Vec<Kernel>,
    pub cpu_ops: Vec<CpuOp>,
    /// Indices into `cpu_ops` by `External id`.
    pub by_external_id: HashMap<u64, usize>,
    /// Per thread, its CPU ops' (start, index) sorted by start.
    pub by_thread: HashMap<(String, String), Vec<(f64, usize)>>,
    /// Runtime launches by `correlation`.
    pub launches: HashMap<u64, Launch>,
    pub steps: Vec<StepSpan>,
    /// The names of CPU ops, annotations and Python functions (where the framework shows).
    pub host_names: Vec<String>,
}

impl TraceFile {
    /// The CPU op that launched `k`: the op its runtime launch's `External id` names when that
    /// op encloses the launch, else the innermost op around the launch on its thread (older
    /// traces number launches apart from ops); without a launch, the op of the kernel's own
    /// `External id` (parsim's trace).
    pub fn launching_op(&self, k: &Kernel) -> Option<&CpuOp> {
        let Some(launch) = k.correlation.and_then(|c| self.launches.get(&c)) else {
            return k
                .external_id
                .and_then(|e| self.by_external_id.get(&e))
                .map(|&i| &self.cpu_ops[i]);
        };
        let encloses = |op: &CpuOp| {
            op.thread == launch.thread && op.start_us <= launch.ts_us && launch.ts_us <= op.end_us
        };
        if let Some(op) = launch
            .external_id
            .and_then(|e| self.by_external_id.get(&e))
            .map(|&i| &self.cpu_ops[i])
            .filter(|op| encloses(op))
        {
            return Some(op);
        }
        let ops = self.by_thread.get(&launch.thread)?;
        let before = ops.partition_point(|&(start, _)| start <= launch.ts_us);
        ops[..before]
            .iter()
            .rev()
            .map(|&(_, i)| &self.cpu_ops[i])
            .find(|op| encloses(op))
    }
}

/// The file's bytes, gunzipped when they start with gzip's magic number.
fn bytes_of(path: &Path) -> Result<Vec<u8>, TraceError> {
    let shown = path.display().to_string();
    let io = |source| TraceError::Io {
        path: shown.clone(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| TraceError::NotJson {
                path: shown.clone(),
                message: format!("gzip: {e}"),
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// An integer argument (Kineto writes ids as numbers; a few writers as strings).
pub fn arg_u64(args: &Map<String, Value>, key: &str) -> Option<u64> {
    match args.get(key)? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// An id as text: `pid` and `tid` are numbers or strings.
fn id_text(v: &Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Reads and checks one trace file. Every complete event (`ph` "X") of the classes read
/// must carry a string `name`, a finite `ts` and a finite, non-negative `dur`; an error names
/// the event by index and the field.
pub fn read(path: &Path) -> Result<TraceFile, TraceError> {
    let shown = path.display().to_string();
    let bytes = bytes_of(path)?;
    let raw: RawTrace = serde_json::from_slice(&bytes).map_err(|e| TraceError::NotJson {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    let events = raw.trace_events.ok_or_else(|| TraceError::NotJson {
        path: shown.clone(),
        message: "no `traceEvents` array".into(),
    })?;
    let info = raw.distributed_info.unwrap_or(Value::Null);
    let mut file = TraceFile {
        path: shown.clone(),
        rank: info.get("rank").and_then(Value::as_u64),
        world_size: info.get("world_size").and_then(Value::as_u64),
        trace_name: raw.trace_name.and_then(|v| v.as_str().map(String::from)),
        kernels: Vec::new(),
        cpu_ops: Vec::new(),
        by_external_id: HashMap::new(),
        by_thread: HashMap::new(),
        launches: HashMap::new(),
        steps: Vec::new(),
        host_names: Vec::new(),
    };
    for (index, e) in events.into_iter().enumerate() {
        let cat = e.cat.as_deref().unwrap_or("");
        let read_here = matches!(
            cat,
            "kernel" | "cpu_op" | "cuda_runtime" | "user_annotation" | "python_function"
        );
        if e.ph.as_deref() != Some("X") || !read_here {
            continue;
        }
        let bad = |rule: String, name: &str| TraceError::Event {
            path: shown.clone(),
            index,
            what: format!("{cat} `{name}`"),
            rule,
        };
        let name = match &e.name {
            Some(Value::String(s)) => s.clone(),
            other => {
                return Err(bad(
                    format!("`name` must be a string, got {}", shown_value(other)),
                    "?",
                ))
            }
        };
        let time = |field: &str, v: &Option<Value>| -> Result<f64, TraceError> {
            let x = v.as_ref().and_then(Value::as_f64).ok_or_else(|| {
                bad(
                    format!(
                        "`{field}` must be a number of microseconds, got {}",
                        shown_value(v)
                    ),
                    &name,
                )
            })?;
            if !x.is_finite() || (field == "dur" && x < 0.0) {
                return Err(bad(
                    format!(
                        "`{field}` must be finite{}, got {x}",
                        if field == "dur" {
                            " and not negative"
                        } else {
                            ""
                        }
                    ),
                    &name,
                ));
            }
            Ok(x)
        };
        let ts = time("ts", &e.ts)?;
        let dur = time("dur", &e.dur)?;
        let args = e.args.unwrap_or_default();
        match cat {
            "kernel" => file.kernels.push(Kernel {
                name,
                device: id_text(&e.pid),
                start_us: ts,
                dur_us: dur,
                correlation: arg_u64(&args, "correlation"),
                external_id: arg_u64(&args, "External id"),
                args,
            }),
            "cuda_runtime" => {
                if let Some(c) = arg_u64(&args, "correlation") {
                    let launch = Launch {
                        thread: (id_text(&e.pid), id_text(&e.tid)),
                        ts_us: ts,
                        external_id: arg_u64(&args, "External id"),
                    };
                    file.launches.insert(c, launch);
                }
            }
            "cpu_op" => {
                file.host_names.push(name.clone());
                let i = file.cpu_ops.len();
                if let Some(x) = arg_u64(&args, "External id") {
                    file.by_external_id.insert(x, i);
                }
                let thread = (id_text(&e.pid), id_text(&e.tid));
                file.by_thread
                    .entry(thread.clone())
                    .or_default()
                    .push((ts, i));
                file.cpu_ops.push(CpuOp {
                    name,
                    args,
                    thread,
                    start_us: ts,
                    end_us: ts + dur,
                });
            }
            _ => {
                if name.starts_with("ProfilerStep#") {
                    file.steps.push(StepSpan {
                        pid: id_text(&e.pid),
                        start_us: ts,
                        end_us: ts + dur,
                    });
                }
                file.host_names.push(name);
            }
        }
    }
    for ops in file.by_thread.values_mut() {
        ops.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(file)
}

/// A value as an error shows it ("missing" when absent).
fn shown_value(v: &Option<Value>) -> String {
    match v {
        None => "nothing (missing)".into(),
        Some(v) => {
            let t = v.to_string();
            if t.len() > 40 {
                format!(
                    "{}...",
                    &t[..t.char_indices().nth(40).map_or(t.len(), |c| c.0)]
                )
            } else {
                t
            }
        }
    }
}
