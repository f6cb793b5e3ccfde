//! The desktop binary: its command line and window.
//!
//! `cargo run --release -p parsim-gui` opens the window. `--config FILE` starts from a
//! configuration file; `--screenshot PATH` draws the window, saves it as PNG and exits (used by
//! scripts/screenshot.sh); `--bench` times the recompute on a large configuration.

use anyhow::{bail, Context, Result};
use clap::Parser;
use parsim::config::ScheduleKind;
use parsim_gui::app::Screenshot;
use parsim_gui::state::Session;
use parsim_gui::ParsimApp;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "parsim-gui",
    version,
    about = "What-if sizing of LLM training layouts, with the pipeline schedule drawn"
)]
struct Args {
    /// Start from this configuration file (TOML, or JSON by extension).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Save a PNG of the window to PATH once it has drawn, then exit.
    #[arg(long, value_name = "PATH")]
    screenshot: Option<PathBuf>,
    /// Open a measured trace (`parsim execute --trace FILE --trace-predicted`) and draw it
    /// under its predicted timeline.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Window size in points, WIDTHxHEIGHT.
    #[arg(long, default_value = "1600x1000", value_parser = parse_size)]
    size: (f32, f32),
    /// Draw this schedule under the configuration's own, for comparison.
    #[arg(long, value_name = "SCHEDULE")]
    compare: Option<ScheduleKind>,
    /// Open the search panel and run a search (with --screenshot: wait for it).
    #[arg(long)]
    search: bool,
    /// Time the recompute after a change on Llama-3-405B / 16,384 GPUs, print it and exit.
    #[arg(long)]
    bench: bool,
    /// Edits timed by --bench.
    #[arg(long, default_value_t = 300)]
    iterations: usize,
}

fn parse_size(s: &str) -> Result<(f32, f32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or("expected WIDTHxHEIGHT, e.g. 1600x1000")?;
    let p = |v: &str| v.trim().parse::<f32>().map_err(|e| format!("{v}: {e}"));
    let (w, h) = (p(w)?, p(h)?);
    if w < 400.0 || h < 300.0 {
        return Err("the window must be at least 400x300".into());
    }
    Ok((w, h))
}

fn bench(iterations: usize) -> Result<()> {
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let runs = [false, true]
        .into_iter()
        .map(|c| parsim_gui::bench::run(iterations, c))
        .chain(
            [false, true]
                .into_iter()
                .map(|c| parsim_gui::bench::run_frames(iterations, c)),
        );
    for r in runs {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!("after a change: {}", r.label);
        let over = r.samples.iter().filter(|d| d.as_secs_f64() > 0.016).count();
        println!(
            "  {} edits: median {:.3} ms, p95 {:.3} ms, p99 {:.3} ms, max {:.3} ms; {over} over the 16 ms budget{}",
            r.samples.len(),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.95)),
            ms(r.quantile(0.99)),
            ms(r.quantile(1.0)),
            if r.invalid > 0 {
                format!("; {} edits were invalid", r.invalid)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

pub fn main() -> Result<()> {
    let args = Args::parse();
    if args.bench {
        return bench(args.iterations);
    }
    let mut app = ParsimApp::default();
    if let Some(path) = &args.config {
        let config = parsim_gui::export::load_config(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        app = ParsimApp::new(Session::new(config.clone()));
        app.file = Some((path.clone(), config));
    }
    if let Some(kind) = args.compare {
        app.timeline.compare = true;
        app.timeline.compare_with = kind;
    }
    if args.search && args.screenshot.is_none() {
        app.show_search = true;
    }
    if let Some(path) = &args.trace {
        app.open_trace(path);
        if let Some(s) = app.status.as_ref().filter(|s| s.error) {
            anyhow::bail!("--trace: {}", s.text);
        }
    }
    if let Some(path) = args.screenshot {
        app.screenshot = Some(Screenshot::new(path, args.search));
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("parsim")
            .with_inner_size([args.size.0, args.size.1]),
        ..Default::default()
    };
    let search = args.search;
    eframe::run_native(
        "parsim",
        options,
        Box::new(move |cc| {
            if search && app.screenshot.is_none() {
                app.start_search(&cc.egui_ctx);
            }
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the window: {e}"))
}
