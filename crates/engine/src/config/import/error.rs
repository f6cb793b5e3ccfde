//! Why an import refuses its input: the file does not parse, or a field, named by its path
//! (and the file, where the import knows it), breaks a rule.

use super::super::error::ConfigError;

/// A torchtitan job, DeepSpeed configuration or other framework's file that parsim refuses.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file does not parse (with its line and column).
    #[error(transparent)]
    Parse(#[from] ConfigError),
    /// `at` names the field (`file: section.key`, or the key's JSON path); `rule` says why:
    /// an unknown key, a wrong type, a value parsim does not model, or the framework's own
    /// rule.
    #[error("{at}: {rule}")]
    Field { at: String, rule: String },
}

impl ImportError {
    /// The field at `at` breaks `rule`.
    pub fn field(at: impl Into<String>, rule: impl Into<String>) -> Self {
        ImportError::Field {
            at: at.into(),
            rule: rule.into(),
        }
    }
}
