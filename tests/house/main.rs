//! The house rules: crate structure, documentation paths, README commands, and this test index.

mod crate_rules;
mod docs_paths;
mod readme_commands;
mod test_index;
