//! Files: open and save the configuration as TOML (the CLI's `--config` format), export the
//! timeline and the memory chart as PNG or SVG (by extension) through the engine's plotters
//! charts.

use crate::state::Run;
use parsim::config::{Config, ConfigError, Layer};
use parsim::estimate::Estimate;
use parsim::report::{gantt, memory_chart};
use std::path::Path;

/// Reads a configuration file (TOML, or JSON by extension) the way `parsim --config` does.
pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    Config::from_layers(&[Layer::from_file(path)?])
}

/// Writes `config` as TOML.
pub fn save_config(path: &Path, config: &Config) -> Result<(), String> {
    std::fs::write(path, config.to_toml())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Image formats by file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Svg,
}

impl ImageFormat {
    /// The format `path`'s extension names.
    pub fn of(path: &Path) -> Result<ImageFormat, String> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("png") => Ok(ImageFormat::Png),
            Some("svg") => Ok(ImageFormat::Svg),
            _ => Err(format!(
                "{}: give the file a .png or .svg extension",
                path.display()
            )),
        }
    }
}

/// Writes the timeline of `runs` (stacked, sharing the time axis) to `path`.
pub fn export_timeline(path: &Path, runs: &[&Run]) -> Result<(), String> {
    let pairs: Vec<_> = runs.iter().map(|r| (&r.program, &r.sim)).collect();
    let size = gantt::default_size(&pairs);
    match ImageFormat::of(path)? {
        ImageFormat::Png => gantt::write_png(path, &pairs, size),
        ImageFormat::Svg => gantt::write_svg(path, &pairs, size),
    }
    .map_err(|e| e.to_string())
}

/// Writes the memory chart of `estimate` to `path`.
pub fn export_memory(path: &Path, estimate: &Estimate) -> Result<(), String> {
    let m = &estimate.memory;
    let size = memory_chart::default_size(m);
    match ImageFormat::of(path)? {
        ImageFormat::Png => memory_chart::write_png(path, m, size),
        ImageFormat::Svg => memory_chart::write_svg(path, m, size),
    }
    .map_err(|e| e.to_string())
}

/// The timeline of `runs` as an SVG document, with its size in pixels (the web build's
/// downloads: no file system there).
pub fn timeline_svg(runs: &[&Run]) -> Result<(String, (u32, u32)), String> {
    let pairs: Vec<_> = runs.iter().map(|r| (&r.program, &r.sim)).collect();
    let size = gantt::default_size(&pairs);
    let svg = gantt::svg_string(&pairs, size).map_err(|e| e.to_string())?;
    Ok((svg, size))
}

/// The memory chart of `estimate` as an SVG document, with its size in pixels.
pub fn memory_svg(estimate: &Estimate) -> Result<(String, (u32, u32)), String> {
    let m = &estimate.memory;
    let size = memory_chart::default_size(m);
    let svg = memory_chart::svg_string(m, size).map_err(|e| e.to_string())?;
    Ok((svg, size))
}

/// The simulated schedules of `runs` as a Chrome trace (chrome://tracing, Perfetto), as
/// `parsim schedule --trace` writes it.
pub fn trace_json(runs: &[&Run]) -> String {
    let pairs: Vec<_> = runs.iter().map(|r| (&r.program, &r.sim)).collect();
    parsim::report::chrome_trace::chrome_trace(&pairs).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{default_config, Session};

    #[test]
    fn toml_round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let mut c = default_config();
        c.model.num_layers = 24;
        c.parallel.zero = 2;
        c.training.recompute = parsim::config::Recompute::Full;
        save_config(&path, &c).unwrap();
        assert_eq!(load_config(&path).unwrap(), c);
    }

    #[test]
    fn exports_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        let s = Session::default();
        let r = s.last_valid.as_ref().unwrap();
        let run = r.timeline.as_ref().unwrap();
        for name in ["t.png", "t.svg"] {
            export_timeline(&dir.path().join(name), &[run]).unwrap();
        }
        for name in ["m.png", "m.svg"] {
            export_memory(&dir.path().join(name), &r.estimate).unwrap();
        }
        assert!(export_memory(&dir.path().join("m.jpg"), &r.estimate).is_err());
    }

    /// The web build's downloads are the desktop's SVG files, byte for byte, and the trace is
    /// the engine's Chrome trace of the same runs.
    #[test]
    fn web_downloads_equal_the_desktop_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = Session::default();
        let r = s.last_valid.as_ref().unwrap();
        let run = r.timeline.as_ref().unwrap();
        let (t, m) = (dir.path().join("t.svg"), dir.path().join("m.svg"));
        export_timeline(&t, &[run]).unwrap();
        export_memory(&m, &r.estimate).unwrap();
        assert_eq!(
            timeline_svg(&[run]).unwrap().0,
            std::fs::read_to_string(t).unwrap()
        );
        assert_eq!(
            memory_svg(&r.estimate).unwrap().0,
            std::fs::read_to_string(m).unwrap()
        );
        let trace: serde_json::Value = serde_json::from_str(&trace_json(&[run])).unwrap();
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        // One complete event per action of the program (report/chrome_trace.rs).
        let complete = events.iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(complete, run.program.num_actions());
    }
}
