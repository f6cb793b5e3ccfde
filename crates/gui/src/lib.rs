//! parsim-gui: a desktop app for what-if sizing of LLM training layouts, with the pipeline
//! schedule drawn for the configuration being sized.
//!
//! The crate only draws: every figure comes from the `parsim` engine library, called directly
//! (no subprocesses). [`state`] holds the configuration and the engine's answer for it,
//! [`views`] draws one area each as `ui(ui, &mut Options, &Data)`, and [`app`] lays the
//! areas out in one window. File I/O is in [`export`], the `parsim estimate` command line in
//! [`command_line`], the background search in [`search_task`], and a configuration as a link in [`link`]. The
//! web page (wasm32) adds [`web`]: its entry, uploads, downloads and the URL.

pub mod app;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod command_line;
pub mod export;
pub mod fields;
pub mod link;
pub mod measured;
pub mod search_task;
pub mod state;
pub mod views;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use app::ParsimApp;
