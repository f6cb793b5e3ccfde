//! Human tables, JSON, SVG/PNG charts (plotters) and Chrome-trace timelines.

pub mod ascii_timeline;
pub mod chart;
pub mod chrome_trace;
pub mod colors;
pub mod compare;
pub mod confidence;
pub mod contract;
pub mod csv;
pub mod font;
pub mod format;
pub mod gantt;
pub mod kineto_ops;
pub mod layout;
pub mod measured_trace;
pub mod memory_chart;
pub mod memory_lines;
pub mod no_fit;
pub mod run_table;
pub mod scaling_chart;
pub mod schedule_json;
pub mod table;
pub mod table_schedule;
pub mod timeline_compare;
