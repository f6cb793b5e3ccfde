//! Pipeline schedules as per-rank action lists, and an event simulator that plays them.

pub use crate::config::ScheduleKind;
