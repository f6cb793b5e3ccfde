//! The app's views. Each draws one area from data it is given, as `ui(ui, &mut Options,
//! &Data)`; none calls the engine or touches files.

pub mod cards;
pub mod config_panel;
pub mod controls;
pub mod measured_timeline;
pub mod memory_chart;
pub mod run_panel;
pub mod search_panel;
pub mod timeline;
