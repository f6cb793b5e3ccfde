//! parsim-gui: a desktop app for what-if sizing of LLM training layouts, with the pipeline
//! schedule drawn for the configuration being sized.
//!
//! The crate only draws: every figure comes from the `parsim` engine library, called directly
//! (no subprocesses). [`state`] holds the configuration and the engine's answer for it,
//! [`views`] draws one area each as `ui(ui, &mut Options, &Data)`, and [`app`] lays the
//! areas out in one window. File I/O is in [`export`], the `parsim estimate` command line in
//! [`command_line`], and the background search in [`search_task`].

pub mod app;
pub mod bench;
pub mod command_line;
pub mod export;
pub mod fields;
pub mod measured;
pub mod search_task;
pub mod state;
pub mod views;

pub use app::ParsimApp;
