//! Errors across the boundary: every failure of the engine becomes `parsim.ConfigError` with
//! the message the CLI prints (the error and its causes), and a panic becomes
//! `parsim.InternalError` instead of crossing into Python.

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;
use pyo3::PyResult;
use std::panic::{catch_unwind, AssertUnwindSafe};

create_exception!(
    parsim,
    ConfigError,
    PyValueError,
    "A configuration parsim cannot model: the message names the field and the rule, as the CLI's."
);
create_exception!(
    parsim,
    InternalError,
    PyRuntimeError,
    "parsim failed internally (a bug: please report it with the configuration)."
);

/// The error and each cause not already in its text, joined by ": " (the CLI prints the
/// causes on lines of their own).
pub fn message(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text = format!("{text}: {line}");
        }
        cause = c.source();
    }
    text
}

/// `err` as `parsim.ConfigError`.
pub fn config_error<E: std::error::Error>(err: E) -> PyErr {
    ConfigError::new_err(message(&err))
}

/// Runs `f`, turning a panic into `parsim.InternalError`: the last guard at the edge, so that
/// no `PanicException` reaches the caller.
pub fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(InternalError::new_err(format!(
                "parsim failed internally (please report it with the configuration): {what}"
            )))
        }
    }
}
