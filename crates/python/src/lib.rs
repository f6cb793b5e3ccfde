//! parsim from Python (`import parsim`): estimate, search, compare, layout and schedule a
//! configuration, returning the JSON contract of docs/design.md as plain dicts (the very
//! text the CLI's `--json` prints, read by Python's `json`), and the launcher's pre-flight
//! check. Every engine error raises `parsim.ConfigError` with the CLI's message; a panic
//! raises `parsim.InternalError`, never a `PanicException`.

mod errors;
mod fit_check;
mod search_thread;
mod source;

use errors::{config_error, guarded, ConfigError, InternalError};
use parsim::config::{Resolved, ScheduleKind};
use parsim::layout::Layout;
use parsim::report::contract;
use parsim::search::{RankBy, SearchRequest};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// JSON text as Python objects (dicts keep the text's key order).
fn loads(py: Python<'_>, text: &str) -> PyResult<PyObject> {
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// The configuration, merged and validated.
fn resolve(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<Resolved> {
    let cfg = source::load_config(py, config, overrides)?;
    Resolved::new(cfg).map_err(config_error)
}

/// `parsim estimate --json`: parameters, FLOPs, memory, communication and step time.
#[pyfunction]
#[pyo3(signature = (config, *, overrides = None))]
fn estimate(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyObject> {
    guarded(|| {
        let est =
            parsim::estimate::estimate(&resolve(py, config, overrides)?).map_err(config_error)?;
        loads(py, &contract::estimate_json(&est).map_err(config_error)?)
    })
}

/// `parsim compare --json`: two or more configurations side by side.
#[pyfunction]
#[pyo3(signature = (configs, *, labels = None, overrides = None))]
fn compare(
    py: Python<'_>,
    configs: Vec<Bound<'_, PyAny>>,
    labels: Option<Vec<String>>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyObject> {
    guarded(|| {
        if configs.len() < 2 {
            return Err(ConfigError::new_err(format!(
                "configs: compare needs at least two configurations, got {}",
                configs.len()
            )));
        }
        let labels = match labels {
            Some(l) if l.len() != configs.len() => {
                return Err(ConfigError::new_err(format!(
                    "labels: one label per configuration ({} configurations, {} labels)",
                    configs.len(),
                    l.len()
                )))
            }
            Some(l) => l,
            None => configs
                .iter()
                .enumerate()
                .map(|(i, c)| label_of(c, i))
                .collect(),
        };
        let mut estimates = Vec::new();
        for (c, label) in configs.iter().zip(&labels) {
            let est = resolve(py, c, overrides)
                .and_then(|r| parsim::estimate::estimate(&r).map_err(config_error))
                .map_err(|e| {
                    // The column's label first, as the CLI names the column that failed.
                    if e.is_instance_of::<ConfigError>(py) {
                        ConfigError::new_err(format!("{label}: {}", e.value(py)))
                    } else {
                        e
                    }
                })?;
            estimates.push(est);
        }
        let cmp = contract::compared(labels, estimates).map_err(config_error)?;
        loads(py, &cmp.json().map_err(config_error)?)
    })
}

/// A column's label: a path's file name (as the CLI labels files), else its position.
fn label_of(config: &Bound<'_, PyAny>, i: usize) -> String {
    match config.extract::<std::path::PathBuf>() {
        Ok(p) if !config.is_instance_of::<pyo3::types::PyList>() => p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        _ => format!("#{}", i + 1),
    }
}

/// `parsim layout --json`: every rank's coordinates and process groups.
#[pyfunction]
#[pyo3(signature = (config, *, overrides = None))]
fn layout(config: &Bound<'_, PyAny>, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<PyObject> {
    let py = config.py();
    guarded(|| {
        let resolved = resolve(py, config, overrides)?;
        let layout = Layout::of(&resolved);
        if layout.world() > contract::MAX_LISTED_RANKS {
            return Err(ConfigError::new_err(format!(
                "cluster.num_gpus: layout lists every rank's groups: at most {} ranks (the world has {})",
                contract::MAX_LISTED_RANKS,
                layout.world()
            )));
        }
        loads(
            py,
            &contract::layout_json(&resolved, &layout).map_err(config_error)?,
        )
    })
}

/// `parsim schedule --config FILE --json`: the configuration's pipeline schedule simulated with
/// the engine's stage costs; with `schedules`, a list with each of them on the configuration.
#[pyfunction]
#[pyo3(signature = (config, *, schedules = None, overrides = None))]
fn schedule(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    schedules: Option<Vec<String>>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyObject> {
    guarded(|| {
        let cfg = source::load_config(py, config, overrides)?;
        let kinds: Vec<Option<ScheduleKind>> = match &schedules {
            None => vec![None],
            Some(names) if names.is_empty() => {
                return Err(ConfigError::new_err(
                    "schedules: give at least one schedule name (or leave it out)",
                ))
            }
            Some(names) => names
                .iter()
                .map(|n| {
                    n.parse::<ScheduleKind>()
                        .map(Some)
                        .map_err(|e| ConfigError::new_err(format!("schedules: {e}")))
                })
                .collect::<PyResult<_>>()?,
        };
        let runs = kinds
            .into_iter()
            .map(|k| contract::configured_schedule(cfg.clone(), k).map_err(config_error))
            .collect::<PyResult<Vec<_>>>()?;
        let refs: Vec<_> = runs.iter().map(|(p, s, _)| (p, s)).collect();
        loads(
            py,
            &contract::schedule_json(&refs, schedules.is_some()).map_err(config_error)?,
        )
    })
}

/// The options of `parsim.search` besides the configuration (the keyword arguments of the
/// Python wrapper in python/parsim/__init__.py, passed as one dict).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct SearchOptions {
    mbs_max: u64,
    top: usize,
    constraints: Vec<String>,
    exhaustive: bool,
    all_schedules: bool,
    rank_by: String,
}

/// `parsim search --json`: every valid parallel mix ranked. The GIL is released while it runs;
/// `progress(done, total)` is called from the caller's thread at most ten times a second.
#[pyfunction]
#[pyo3(signature = (config, options, overrides = None, progress = None))]
fn search(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    options: SearchOptions,
    overrides: Option<&Bound<'_, PyDict>>,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyObject> {
    guarded(|| {
        let base = search_thread::base_of(source::load_config(py, config, overrides)?)?;
        let request = SearchRequest {
            mbs_max: options.mbs_max,
            top: options.top,
            constraints: options.constraints,
            exhaustive: options.exhaustive,
            all_schedules: options.all_schedules,
        };
        let (spec, _) = request.spec(base).map_err(config_error)?;
        let rank_by = RankBy::parse(&options.rank_by).map_err(config_error)?;
        let result = search_thread::run(py, &spec, rank_by, progress)?;
        let text = serde_json::to_string_pretty(&result)
            .map_err(|e| InternalError::new_err(e.to_string()))?;
        loads(py, &text)
    })
}

/// The launcher's check before it asks for GPUs: fits or not with the memory margin (at the
/// pessimistic end of the memory estimate) and the predicted step time with its interval.
#[pyfunction]
#[pyo3(signature = (megatron_args = None, *, gpu = None, margin = None, config = None,
    overrides = None))]
fn preflight(
    py: Python<'_>,
    megatron_args: Option<&Bound<'_, PyAny>>,
    gpu: Option<String>,
    margin: Option<f64>,
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyObject> {
    guarded(|| {
        let source = match (megatron_args, config) {
            (Some(a), None) => a,
            (None, Some(c)) => c,
            _ => {
                return Err(ConfigError::new_err(
                    "preflight: give exactly one of megatron_args (a script path or an argument list such as sys.argv) and config",
                ))
            }
        };
        let layer = PyDict::new(py);
        if let Some(o) = overrides {
            layer.update(o.as_mapping())?;
        }
        let cluster = PyDict::new(py);
        if let Some(g) = gpu {
            cluster.set_item("gpu", g)?;
        }
        if let Some(m) = margin {
            cluster.set_item("memory_margin_fraction", m)?;
        }
        if !cluster.is_empty() {
            match layer.get_item("cluster")? {
                Some(existing) => existing
                    .downcast::<PyDict>()?
                    .update(cluster.as_mapping())?,
                None => layer.set_item("cluster", cluster)?,
            }
        }
        let est = parsim::estimate::estimate(&resolve(py, source, Some(&layer))?)
            .map_err(config_error)?;
        let text = serde_json::to_string(&fit_check::verdict(&est))
            .map_err(|e| InternalError::new_err(e.to_string()))?;
        loads(py, &text)
    })
}

/// The native half of the `parsim` package (python/parsim/__init__.py re-exports it).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(estimate, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(layout, m)?)?;
    m.add_function(wrap_pyfunction!(schedule, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(preflight, m)?)?;
    Ok(())
}
