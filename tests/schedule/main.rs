//! Pipeline schedules: the simulator, its closed forms, validity, layouts, outputs and `parsim schedule`.

mod cli;
mod closed_forms;
mod extrapolate;
mod outputs;
mod pipeline_layouts;
mod simulator;
mod validity;
