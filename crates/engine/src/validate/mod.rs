//! Validation against every public measured source, at each row's published settings (never a
//! searched stand-in): `parsim validate` and the tables of docs/accuracy.md. Each source's
//! reader turns a row into a configuration at the settings the row prints, takes what the row
//! does not print from the framework's defaults or the source's notes (each source says which,
//! [`Source::defaults`]), or counts the row as not expressible with the reason. Every
//! expressible row is estimated; the fitted sources' rows are predicted by a fit that never saw
//! their table (leave-one-source-out, [`crate::calibrate::loso`]). [`stats`] summarises per
//! source and per (model, system); [`guards`] holds the accuracy guards and goals of
//! `calibration/accuracy-guards.toml`.

pub mod bloom;
pub mod bridge_models;
pub mod coverage;
pub mod data;
pub mod deepspeed_gpt;
pub mod guards;
pub mod markdown;
pub mod megatron_bridge;
pub mod predict;
pub mod residuals;
pub mod stats;
pub mod text;
pub mod throughput;
pub mod vtrain;

pub use guards::GuardFile;
use serde::Serialize;

/// A public source of measured training runs (serialized as its [`Source::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// NVIDIA Megatron-Bridge performance summary, containers 25.09-26.08 (validation only).
    MegatronBridge,
    /// vTrain's single-node ground truth: Megatron-DeepSpeed on A100 (fitting allowed).
    Vtrain,
    /// BigScience BLOOM tr11 topology sweeps (fitting allowed; memory and OOM labels).
    BloomTr11,
    /// Narayanan et al. 2021, Table 1 (fitted: predicted leave-one-source-out).
    Narayanan2021,
    /// The Megatron-LM README's Megatron-Core r0.8.0 weak scaling (fitted).
    MegatronCore2024,
    /// MosaicML llm-foundry's benchmarks README (fitted).
    LlmFoundry,
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.key())
    }
}

/// How the efficiencies may use a source, and how they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Use {
    /// Never fitted to: every prediction is out of sample.
    ValidationOnly,
    /// Fitting is allowed, but no efficiency is fitted to it today: every prediction is out of
    /// sample (so it counts as held out).
    NotFitted,
    /// The shipped efficiencies are fitted to it: its rows are predicted by a fit without it.
    Fitted,
}

impl Source {
    pub const ALL: [Source; 6] = [
        Source::MegatronBridge,
        Source::Vtrain,
        Source::BloomTr11,
        Source::Narayanan2021,
        Source::MegatronCore2024,
        Source::LlmFoundry,
    ];

    /// The name `--source` takes and the guard file uses.
    pub fn key(self) -> &'static str {
        match self {
            Source::MegatronBridge => "megatron-bridge",
            Source::Vtrain => "vtrain",
            Source::BloomTr11 => "bloom-tr11",
            Source::Narayanan2021 => "narayanan-2021",
            Source::MegatronCore2024 => "megatron-core-2024",
            Source::LlmFoundry => "llm-foundry",
        }
    }

    /// The source named `key` (as [`Source::key`] spells it, any case).
    pub fn parse(key: &str) -> Option<Source> {
        Source::ALL
            .into_iter()
            .find(|s| s.key().eq_ignore_ascii_case(key.trim()))
    }

    /// A short display name.
    pub fn name(self) -> &'static str {
        match self {
            Source::MegatronBridge => "Megatron-Bridge 25.09-26.08",
            Source::Vtrain => "vTrain single-node",
            Source::BloomTr11 => "BLOOM tr11 sweeps",
            Source::Narayanan2021 => "Narayanan 2021",
            Source::MegatronCore2024 => "Megatron-Core 2024",
            Source::LlmFoundry => "llm-foundry",
        }
    }

    pub fn usage(self) -> Use {
        match self {
            Source::MegatronBridge => Use::ValidationOnly,
            Source::Vtrain | Source::BloomTr11 => Use::NotFitted,
            Source::Narayanan2021 | Source::MegatronCore2024 | Source::LlmFoundry => Use::Fitted,
        }
    }

    /// The settings its rows do not print and where parsim takes them from.
    pub fn defaults(self) -> &'static str {
        match self {
            Source::MegatronBridge => megatron_bridge::DEFAULTS,
            Source::Vtrain => vtrain::DEFAULTS,
            Source::BloomTr11 => bloom::DEFAULTS,
            Source::Narayanan2021 | Source::MegatronCore2024 | Source::LlmFoundry => {
                throughput::DEFAULTS
            }
        }
    }

    /// The `source` its residuals carry in calibration/residuals.json: the fitted tables'
    /// short names (as calibrate writes them), else the key.
    pub fn residual_source(self) -> &'static str {
        self.published().map_or(self.key(), |p| p.short())
    }

    /// The published-throughput source this is, for the fitted ones.
    pub fn published(self) -> Option<crate::calibrate::published::Source> {
        use crate::calibrate::published::Source as P;
        match self {
            Source::Narayanan2021 => Some(P::Narayanan2021),
            Source::MegatronCore2024 => Some(P::MegatronCore2024),
            Source::LlmFoundry => Some(P::LlmFoundry),
            _ => None,
        }
    }
}

/// What a row measured. Absent figures are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Measured {
    /// Seconds per training step (iteration).
    pub step_s: Option<f64>,
    /// Peak memory of the most loaded GPU as the source labels it, bytes.
    pub memory_bytes: Option<u64>,
    /// The run fitted in memory (it ran), or ran out of memory (`false`).
    pub fits: Option<bool>,
    /// The memory figure contradicts another row of the same settings in the source (a single
    /// snapshot that cannot both be right): listed with its note, left out of the memory error's
    /// median and worst.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub memory_contradicted: bool,
}

/// parsim's estimate of an expressible row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Predicted {
    pub step_s: f64,
    /// The estimate's p10-p90 step time, where the estimate carries it.
    pub step_s_p10: Option<f64>,
    pub step_s_p90: Option<f64>,
    /// The measured step lies inside the row's interval, from the residual model without any
    /// residual of the row's source (leave-one-source-out).
    pub covered: Option<bool>,
    /// parsim finds the configuration fits in GPU memory (with its margin).
    pub fits: bool,
    /// Predicted peak memory of the most loaded GPU, bytes.
    pub peak_bytes: u64,
    /// The step-time regime of the estimate (what its interval is looked up by).
    #[serde(skip)]
    pub regime: Option<crate::interval::Regime>,
}

/// What became of a row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "detail")]
pub enum Outcome {
    Predicted(Predicted),
    /// parsim cannot describe the row at its published settings (the reason).
    NotExpressible(String),
    /// Expressible but left out of the figures, with why (a fitted source's out-of-scope or
    /// self-contradicting row, as `calibrate` sorts them).
    Excluded(String),
}

/// One published row and what parsim makes of it.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub source: Source,
    /// The row's position in its table.
    pub index: usize,
    /// Model, system and settings in a few words.
    pub label: String,
    /// The sub-group the row is summarised in: model (and task) ...
    pub model: String,
    /// ... and system (GPU).
    pub system: String,
    pub measured: Measured,
    pub outcome: Outcome,
    /// Settings this row took from defaults or notes beyond its source's, and other remarks.
    pub notes: Vec<String>,
    /// The row's tensor- and pipeline-parallel degrees and micro batch, where it has a
    /// configuration (the figures are also broken down by them).
    pub degrees: Option<Degrees>,
}

/// A row's tensor- and pipeline-parallel degrees and micro batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Degrees {
    pub tp: u32,
    pub pp: u32,
    pub mbs: u64,
}

impl Degrees {
    /// The degrees of a configuration overlay (absent ones are 1, as the defaults' are not
    /// read here: every reader sets all three).
    pub fn of_overlay(v: &serde_json::Value) -> Option<Degrees> {
        let get = |section: &str, key: &str| v.get(section)?.get(key)?.as_u64();
        Some(Degrees {
            tp: u32::try_from(get("parallel", "tp")?).ok()?,
            pp: u32::try_from(get("parallel", "pp")?).ok()?,
            mbs: get("training", "micro_batch_size")?,
        })
    }
}

impl Row {
    pub fn predicted(&self) -> Option<&Predicted> {
        match &self.outcome {
            Outcome::Predicted(p) => Some(p),
            _ => None,
        }
    }

    /// Measured over predicted step time - 1: parsim's throughput over the published one - 1
    /// (positive: parsim is too fast).
    pub fn error(&self) -> Option<f64> {
        let p = self.predicted()?;
        Some(self.measured.step_s? / p.step_s - 1.0)
    }

    /// Predicted over measured peak memory - 1 (none where the measured figure contradicts
    /// another row of the source).
    pub fn memory_error(&self) -> Option<f64> {
        let p = self.predicted()?;
        let m = self
            .measured
            .memory_bytes
            .filter(|_| !self.measured.memory_contradicted)?;
        (m > 0).then(|| p.peak_bytes as f64 / m as f64 - 1.0)
    }

    /// parsim's fits verdict agrees with the measured one (it ran, or ran out of memory).
    pub fn fits_agrees(&self) -> Option<bool> {
        Some(self.predicted()?.fits == self.measured.fits?)
    }
}

/// A row of a source as its reader makes it: the configuration overlay (a document shaped like
/// a configuration file) or why none describes the row.
#[derive(Debug, Clone)]
pub struct SourceRow {
    pub index: usize,
    pub label: String,
    pub model: String,
    pub system: String,
    pub measured: Measured,
    pub setup: Result<serde_json::Value, data::RowError>,
    pub notes: Vec<String>,
}

/// Why validation could not run.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(transparent)]
    Data(#[from] data::RowError),
    #[error(transparent)]
    Residuals(#[from] crate::interval::IntervalError),
    #[error(transparent)]
    Calibrate(#[from] crate::calibrate::CalibrateError),
    #[error("{path}: {message}")]
    Guards { path: String, message: String },
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub sources: Vec<Source>,
    /// Keep every `every`-th row of each source (1: all). A sample's figures are not the
    /// published ones; fitted sources still fit on every row.
    pub every: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sources: Source::ALL.to_vec(),
            every: 1,
        }
    }
}

/// Every row of the sources run, in source order.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub sources: Vec<Source>,
    pub every: usize,
    pub rows: Vec<Row>,
    /// Remarks on the run as a whole (a stale residual file, for one).
    pub remarks: Vec<String>,
}

/// Reads the rows of a source that is not fitted (its reader's output).
fn read(source: Source) -> Result<Vec<SourceRow>, ValidateError> {
    match source {
        Source::MegatronBridge => megatron_bridge::rows(),
        Source::Vtrain => vtrain::rows(),
        Source::BloomTr11 => bloom::rows(),
        _ => Ok(Vec::new()),
    }
    .map_err(ValidateError::Data)
}

/// Runs the sources of `opts`; `progress(done, total)` is called as rows finish.
pub fn run(opts: &Options, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Report, ValidateError> {
    let mut read_rows = Vec::new();
    for &s in &opts.sources {
        if s.usage() != Use::Fitted {
            let rows = read(s)?;
            read_rows.extend(
                rows.into_iter()
                    .filter(|r| r.index % opts.every.max(1) == 0)
                    .map(|r| (s, r)),
            );
        }
    }
    let fitted: Vec<Source> = opts
        .sources
        .iter()
        .copied()
        .filter(|s| s.usage() == Use::Fitted)
        .collect();
    // The fitted tables' leave-one-source-out fits run beside the other sources' estimates.
    let (mut rows, fitted_rows) = rayon::join(
        || predict::all(&read_rows, progress),
        || {
            if fitted.is_empty() {
                Ok((Vec::new(), Vec::new()))
            } else {
                throughput::rows(&fitted, opts.every)
            }
        },
    );
    let (more, remarks) = fitted_rows?;
    coverage::leave_source_out(&mut rows)?;
    rows.extend(more);
    rows.sort_by_key(|r| (r.source, r.index));
    let mut sources = opts.sources.clone();
    sources.sort();
    sources.dedup();
    Ok(Report {
        sources,
        every: opts.every.max(1),
        rows,
        remarks,
    })
}

impl Report {
    /// The rows of `source`.
    pub fn of(&self, source: Source) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(move |r| r.source == source)
    }
}
