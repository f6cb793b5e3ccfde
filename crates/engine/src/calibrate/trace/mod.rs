//! Calibration from a profiler trace (`parsim calibrate --trace FILE...`): PyTorch's Kineto
//! JSON of a real training run (one file per rank, gzipped or not), or the same shape written
//! by `parsim execute --trace --profile-ops`. Each kernel is placed on parsim's op classes
//! ([`classify`]), summed by op key into the op timings `execute --profile-ops` gives, with the
//! host gaps between kernels ([`gaps`]), and fitted into rate tables exactly as from the
//! executor's timings ([`super::table_fit::fit_tables`]). The report names every kernel it
//! could not place, with its time, and the framework the trace shows ([`framework`]).

pub mod classify;
pub mod framework;
pub mod gaps;
pub mod kineto;

pub use kineto::TraceError;

use super::table_fit::{fit_tables, reproduce, Reproduction, TableFitError};
use crate::config::tables::{RateTables, TableProvenance};
use crate::config::GpuProfile;
use parsim_plan::op_timing::{OpKey, OpTiming, OP_CLASSES};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Kernels of one name that could not be placed, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnplacedKernel {
    pub name: String,
    pub reason: String,
    pub calls: u64,
    pub total_s: f64,
}

/// One file read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileSummary {
    pub path: String,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub kernels: usize,
    pub kernel_s: f64,
    /// Frameworks the file shows, each with the name that shows it.
    pub frameworks: Vec<(String, String)>,
}

/// What the trace gave one op class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassCoverage {
    pub class: &'static str,
    /// Distinct op keys.
    pub keys: usize,
    pub calls: u64,
    pub total_s: f64,
}

/// The traces as op timings, with what could not be placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceOps {
    pub files: Vec<FileSummary>,
    /// Summed by op key over every file (the host gap and waits included).
    pub timings: Vec<OpTiming>,
    pub unplaced: Vec<UnplacedKernel>,
    /// Kernel seconds in all, and the part placed on an op class.
    pub kernel_s: f64,
    pub placed_s: f64,
}

impl TraceOps {
    /// Per op class (in [`OP_CLASSES`] order), the keys, calls and seconds the trace gave;
    /// classes it did not cover have none.
    pub fn coverage(&self) -> Vec<ClassCoverage> {
        OP_CLASSES
            .iter()
            .map(|&class| {
                let of: Vec<&OpTiming> = self
                    .timings
                    .iter()
                    .filter(|t| t.key.class() == class)
                    .collect();
                ClassCoverage {
                    class,
                    keys: of.len(),
                    calls: of.iter().map(|t| t.calls).sum(),
                    total_s: of.iter().map(|t| t.total_s).sum(),
                }
            })
            .collect()
    }

    /// Every framework the files show, once.
    pub fn frameworks(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (f, _) in self.files.iter().flat_map(|s| &s.frameworks) {
            if !out.contains(f) {
                out.push(f.clone());
            }
        }
        out
    }
}

/// Reads `paths` (one trace per rank) and places their kernels; `gpus_per_node` places the
/// collectives' groups on nodes. A trace with no kernel at all, in every file, is refused.
pub fn read_traces<P: AsRef<Path>>(
    paths: &[P],
    gpus_per_node: u64,
) -> Result<TraceOps, TraceError> {
    if paths.is_empty() {
        return Err(TraceError::NoFiles);
    }
    let mut timings: BTreeMap<OpKey, (u64, f64)> = BTreeMap::new();
    let mut unplaced: BTreeMap<(String, String), (u64, f64)> = BTreeMap::new();
    let mut files = Vec::new();
    let (mut kernel_s, mut placed_s) = (0.0, 0.0);
    for path in paths {
        let file = kineto::read(path.as_ref())?;
        let mut file_s = 0.0;
        for k in &file.kernels {
            let s = k.dur_us * 1e-6;
            file_s += s;
            match classify::classify(k, file.launching_op(k), gpus_per_node) {
                Ok(key) => {
                    let e = timings.entry(key).or_default();
                    e.0 += 1;
                    e.1 += s;
                    placed_s += s;
                }
                Err(reason) => {
                    let e = unplaced.entry((k.name.clone(), reason)).or_default();
                    e.0 += 1;
                    e.1 += s;
                }
            }
        }
        kernel_s += file_s;
        let (gap_calls, gap_s) = gaps::host_gaps(&file);
        if gap_calls > 0 {
            let e = timings.entry(OpKey::HostGap).or_default();
            e.0 += gap_calls;
            e.1 += gap_s;
        }
        files.push(FileSummary {
            path: file.path.clone(),
            rank: file.rank,
            world_size: file.world_size,
            kernels: file.kernels.len(),
            kernel_s: file_s,
            frameworks: framework::detect(&file),
        });
    }
    if files.iter().all(|f| f.kernels == 0) {
        return Err(TraceError::NoKernels {
            paths: files
                .iter()
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut out_timings = Vec::new();
    for (key, (calls, total_s)) in timings {
        // A key whose kernels all took no measurable time gives no rate: say so by name.
        if total_s <= 0.0 && !matches!(key, OpKey::HostGap | OpKey::Wait) {
            let name = serde_json::to_string(&key).unwrap_or_else(|_| format!("{key:?}"));
            unplaced.insert(
                (name, "took no measurable time (0 us in the trace)".into()),
                (calls, 0.0),
            );
            continue;
        }
        out_timings.push(OpTiming {
            key,
            calls,
            total_s,
        });
    }
    let mut unplaced: Vec<UnplacedKernel> = unplaced
        .into_iter()
        .map(|((name, reason), (calls, total_s))| UnplacedKernel {
            name,
            reason,
            calls,
            total_s,
        })
        .collect();
    unplaced.sort_by(|a, b| b.total_s.total_cmp(&a.total_s));
    Ok(TraceOps {
        files,
        timings: out_timings,
        unplaced,
        kernel_s,
        placed_s,
    })
}

/// Rate tables fitted from a trace, and how closely they give back its timings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceFit {
    pub tables: RateTables,
    pub reproduction: Vec<Reproduction>,
}

/// Fits the trace's timings into rate tables over `gpu`'s peaks, as from the executor's op
/// timings ([`fit_tables`]), each table with `provenance`.
pub fn fit_trace(
    ops: &TraceOps,
    gpu: &GpuProfile,
    provenance: &TableProvenance,
) -> Result<TraceFit, TableFitError> {
    let tables = fit_tables(&ops.timings, gpu, provenance)?;
    let reproduction = reproduce(&ops.timings, &tables, gpu);
    Ok(TraceFit {
        tables,
        reproduction,
    })
}
