//! Human tables, JSON, SVG/PNG charts (plotters) and Chrome-trace timelines.

pub mod format;
pub mod layout;
pub mod table;
