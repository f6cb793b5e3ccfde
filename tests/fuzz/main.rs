//! Inputs no user should send: seeded random inputs, numbers at their types' edges, and every bad input once reported.

mod bad_inputs;
#[path = "../common/mod.rs"]
mod common;
mod extreme_numbers_cli;
mod extreme_numbers_rules;
mod random_configs;
mod random_inputs;
