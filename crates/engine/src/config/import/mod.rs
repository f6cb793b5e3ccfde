//! What the imports of other frameworks' configurations (a torchtitan job, a DeepSpeed JSON,
//! a Megatron-LM launch) share: the error that names a refused field by its path, the reader
//! of the field tables they keep as data, and the warning that lists what was accepted.

mod error;
mod field_table;

pub use error::ImportError;
pub use field_table::{read_rows, Row, TableError};

/// One warning line listing `items` after `what` (e.g. "accepted 3 DeepSpeed key(s) that
/// change neither memory nor step time"), or none when the list is empty.
pub fn listed(verb: &str, what: &str, items: &[String]) -> Option<String> {
    (!items.is_empty()).then(|| format!("{verb} {} {what}: {}", items.len(), items.join(", ")))
}
