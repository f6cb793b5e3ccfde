//! Accuracy against published runs: the fitted model's errors, the guards and their history, `parsim validate`.

mod feasibility;
mod guard_history;
mod published_throughput;
mod validate;
