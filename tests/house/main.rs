//! The house rules: crate structure, documentation paths, README commands, feature unification, and this test index.

mod crate_rules;
mod docs_paths;
mod feature_unification;
mod readme_commands;
mod test_index;
