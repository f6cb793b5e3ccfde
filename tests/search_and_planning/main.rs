//! Search and the planner's questions: ranking, objectives, no-fit answers, printed commands, compare, time to train.

#[path = "../common/mod.rs"]
mod common;
mod no_fit;
mod objective;
mod planner;
mod printed_commands;
mod search;
mod time_to_train;
