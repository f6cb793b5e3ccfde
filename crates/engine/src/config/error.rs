//! Configuration errors: each names the field, the rule and, where one exists, a fix.

use std::fmt;

/// One broken rule of a configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// Dotted field name, e.g. `parallel.tp`.
    pub field: String,
    /// What is wrong, with the offending values.
    pub rule: String,
    /// How to fix it, if there is an obvious way.
    pub hint: Option<String>,
}

impl Violation {
    pub fn new(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Violation {
            field: field.into(),
            rule: rule.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)?;
        if let Some(h) = &self.hint {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

/// Why a configuration could not be loaded or resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{origin}: field `{field}`: {message}")]
    Field {
        origin: String,
        field: String,
        message: String,
    },
    #[error("{field}: unknown value '{value}' (known: {known}; {hint})")]
    UnknownName {
        field: &'static str,
        value: String,
        known: String,
        hint: &'static str,
    },
    #[error("hardware profile {origin}: {message}")]
    Profile { origin: String, message: String },
    #[error("{origin}: {message}")]
    Import { origin: String, message: String },
    #[error("invalid configuration:\n{}", list(.0))]
    Invalid(Vec<Violation>),
}

fn list(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("  - {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}
