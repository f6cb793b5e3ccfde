//! Why a torchtitan job could not be imported: each error names the job's TOML path (or the
//! override) and the rule.

use super::super::error::ConfigError;

/// A torchtitan job file or override that parsim refuses.
#[derive(Debug, thiserror::Error)]
pub enum TorchtitanError {
    /// The file does not parse as TOML (with its line and column).
    #[error(transparent)]
    Parse(#[from] ConfigError),
    /// A table that torchtitan's `JobConfig` does not have.
    #[error("{origin}: [{path}]: unknown section (not one of torchtitan's JobConfig)")]
    UnknownSection { origin: String, path: String },
    /// A key that its section does not have.
    #[error("{origin}: {path}: unknown key (torchtitan's JobConfig has no such field)")]
    UnknownKey { origin: String, path: String },
    /// A value of the wrong type.
    #[error("{origin}: {path}: must be {expected}, got {got}")]
    Type {
        origin: String,
        path: String,
        expected: &'static str,
        got: String,
    },
    /// A value torchtitan accepts that changes memory or time in a way parsim does not model.
    #[error("{origin}: {path} = {value}: not modelled: {reason}")]
    Unmodelled {
        origin: String,
        path: String,
        value: String,
        reason: String,
    },
    /// A value torchtitan itself would refuse (its own rule, cited).
    #[error("{origin}: {path}: {rule}")]
    Invalid {
        origin: String,
        path: String,
        rule: String,
    },
    /// An override that is not `section.field=value`.
    #[error("torchtitan override '{text}': {rule}")]
    Override { text: String, rule: String },
}
