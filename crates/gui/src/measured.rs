//! A measured trace (`parsim execute --trace FILE --trace-predicted`) read back for drawing:
//! the compute actions of the first timed step per measured rank and per predicted pipeline
//! rank, each measured action paired with its prediction (same pipeline rank and name), and
//! the misses: measured actions whose duration is off the prediction by more than
//! [`MISS_FRACTION`].

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A measured duration further than this fraction from its prediction is a miss.
pub const MISS_FRACTION: f64 = 0.5;

/// One drawn action, in seconds from the step start.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub name: String,
    /// F, B, I or W.
    pub kind: String,
    pub start_s: f64,
    pub end_s: f64,
    /// Measured bars: the predicted duration of the same action, if the prediction has it.
    pub predicted_s: Option<f64>,
}

impl Bar {
    /// Whether the measured duration misses the prediction by more than [`MISS_FRACTION`].
    pub fn is_miss(&self) -> bool {
        self.predicted_s.is_some_and(|p| {
            let d = self.end_s - self.start_s;
            (d - p).abs() > MISS_FRACTION * p
        })
    }
}

/// One track: a measured rank or a predicted pipeline rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Track {
    pub label: String,
    pub pp: u64,
    pub bars: Vec<Bar>,
}

impl Track {
    pub fn misses(&self) -> usize {
        self.bars.iter().filter(|b| b.is_miss()).count()
    }
}

/// The two timelines of a trace file, on one axis starting at the first timed step.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredTimeline {
    pub path: String,
    pub predicted: Vec<Track>,
    pub measured: Vec<Track>,
    /// The end of the last bar of either timeline.
    pub end_s: f64,
}

fn num(e: &Value, k: &str) -> Option<f64> {
    e.get(k).and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// Reads `path`; an error names the file and what is wrong with it.
pub fn load(path: &Path) -> Result<MeasuredTimeline, String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{shown}: not JSON: {e}"))?;
    let events = v["traceEvents"]
        .as_array()
        .ok_or_else(|| format!("{shown}: no traceEvents array (not a Chrome trace)"))?;
    let names: HashMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| Some((e["pid"].as_u64()?, e["args"]["name"].as_str()?.to_string())))
        .collect();
    // pid -> track, for compute events (tid 0) of timed step 0.
    let mut tracks: std::collections::BTreeMap<(bool, u64), Track> = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X" && e["tid"] == 0) {
        let args = &e["args"];
        if args["step"] != 0 || !matches!(args["kind"].as_str(), Some("F" | "B" | "I" | "W")) {
            continue;
        }
        let (Some(pid), Some(measured), Some(pp)) = (
            e["pid"].as_u64(),
            args["measured"].as_bool(),
            args["pp"].as_u64(),
        ) else {
            return Err(format!(
                "{shown}: event without pid, args.measured or args.pp (not written by parsim execute --trace): {e}"
            ));
        };
        let (Some(ts), Some(dur)) = (num(e, "ts"), num(e, "dur")) else {
            return Err(format!("{shown}: event without a finite ts or dur: {e}"));
        };
        let t = tracks.entry((measured, pid)).or_insert_with(|| Track {
            label: names
                .get(&pid)
                .cloned()
                .unwrap_or_else(|| format!("process {pid}")),
            pp,
            bars: Vec::new(),
        });
        t.bars.push(Bar {
            name: e["name"].as_str().unwrap_or("?").to_string(),
            kind: args["kind"].as_str().unwrap_or("?").to_string(),
            start_s: ts * 1e-6,
            end_s: (ts + dur) * 1e-6,
            predicted_s: None,
        });
    }
    let mut predicted = Vec::new();
    let mut measured = Vec::new();
    for ((m, _), t) in tracks {
        if m {
            measured.push(t)
        } else {
            predicted.push(t)
        }
    }
    if measured.is_empty() || predicted.is_empty() {
        return Err(format!(
            "{shown}: needs both measured and predicted compute actions (write it with parsim execute --trace FILE --trace-predicted)"
        ));
    }
    let pred: HashMap<(u64, &str), f64> = predicted
        .iter()
        .flat_map(|t| {
            t.bars
                .iter()
                .map(move |b| ((t.pp, b.name.as_str()), b.end_s - b.start_s))
        })
        .collect();
    for t in &mut measured {
        for b in &mut t.bars {
            b.predicted_s = pred.get(&(t.pp, b.name.as_str())).copied();
        }
    }
    let end_s = predicted
        .iter()
        .chain(&measured)
        .flat_map(|t| t.bars.iter().map(|b| b.end_s))
        .fold(0.0, f64::max);
    Ok(MeasuredTimeline {
        path: shown,
        predicted,
        measured,
        end_s,
    })
}
