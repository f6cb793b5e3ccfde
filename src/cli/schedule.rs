//! `parsim schedule`: generate, simulate, print and draw pipeline schedules.

use anyhow::{bail, Context, Result};
use clap::Args;
use parsim::report::contract::{configured_schedule, schedule_json};
use parsim::report::{ascii_timeline, chrome_trace, gantt, table_schedule};
use parsim::schedule::{
    generate_with, natural_vpp, simulate, Costs, GenerateOptions, Program, ScheduleKind, Simulation,
};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Simulate a pipeline schedule and show its timeline (ASCII, SVG/PNG Gantt, Chrome trace,
/// JSON), or compare several.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Pipeline ranks (parallel.pp).
    #[arg(long, default_value_t = 4)]
    pub pp: u32,

    /// Model chunks per rank (parallel.vpp). Default: 2 for interleaved-1f1b, zb-v and
    /// dualpipe-v, 1 for the others.
    #[arg(long)]
    pub vpp: Option<u32>,

    /// Microbatches per step (pp x vpp x microbatches at most 2^22 = 4194304).
    #[arg(long, default_value_t = 8)]
    pub microbatches: u32,

    /// Schedule: gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-v | dualpipe-v.
    #[arg(long, default_value = "interleaved-1f1b")]
    pub schedule: ScheduleKind,

    /// Forward time of one rank's share of the model (any unit; traces read it as seconds).
    /// With vpp chunks per rank each chunk takes 1/vpp of it, so schedules compare on the
    /// same model.
    #[arg(long, default_value_t = 1.0)]
    pub f: f64,

    /// Backward time of one rank's share of the model (split over chunks like --f). With
    /// --w it is the input-gradient part I only.
    #[arg(long, default_value_t = 2.0)]
    pub b: f64,

    /// Weight-gradient time W: the backward splits into I = b and W = w (B = b + w). Without
    /// it, split schedules use I = W = b/2.
    #[arg(long)]
    pub w: Option<f64>,

    /// Point-to-point latency of one hop between ranks.
    #[arg(long, default_value_t = 0.0)]
    pub p2p: f64,

    /// DualPipe-V overlapped F&B slot duration as a fraction of F + B, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub overlap_factor: f64,

    /// Megatron's microbatch_group_size_per_vp_stage for interleaved-1f1b (default: pp).
    #[arg(long)]
    pub microbatch_group_size: Option<u32>,

    /// Compare several schedules (comma-separated), e.g.
    /// 1f1b,interleaved-1f1b,zb-h1,zb-v,dualpipe-v.
    #[arg(long, value_delimiter = ',')]
    pub compare: Option<Vec<ScheduleKind>>,

    /// Write an SVG Gantt chart.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Write a PNG Gantt chart.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,

    /// Chart width and height in pixels (default: 1400 wide, about 26 pixels per rank row;
    /// at most 8192 a side).
    #[arg(long, value_name = "WxH", value_parser = parse_size)]
    pub size: Option<(u32, u32)>,

    /// Write a Chrome trace-event JSON (one track per rank; open in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub chrome_trace: Option<PathBuf>,

    /// Print the timelines as JSON instead of the ASCII timeline.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,

    /// Print the schedule table (one row per schedule, as --compare shows it) as CSV,
    /// numbers unrounded.
    #[arg(long)]
    pub csv: bool,

    /// Widest ASCII timeline, in time steps (at least 8).
    #[arg(long, default_value_t = 120)]
    pub max_columns: usize,
    /// Take the schedule and per-stage durations (F, I, W and hop costs, in seconds) from the
    /// engine for this configuration file instead of --pp/--vpp/--microbatches/--f/--b/--w.
    /// With --compare, each schedule runs on the file's configuration (with the chunks per
    /// rank it takes).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["f", "b", "w", "p2p", "pp", "vpp", "microbatches", "schedule"])]
    pub config: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("expected WIDTHxHEIGHT, e.g. 1400x600 (got '{s}')"))?;
    let w: u32 = w
        .trim()
        .parse()
        .map_err(|_| format!("bad width in '{s}'"))?;
    let h: u32 = h
        .trim()
        .parse()
        .map_err(|_| format!("bad height in '{s}'"))?;
    let most = parsim::report::chart::MAX_SIDE_PX;
    if w > most || h > most {
        return Err(format!(
            "{w}x{h} is too large: at most {most} pixels a side"
        ));
    }
    Ok((w, h))
}

/// The narrowest ASCII timeline drawn (a label and a few cells).
const MIN_COLUMNS: usize = 8;

/// Flags that no schedule of the run reads, each named in a warning.
fn ignored_flags(args: &ScheduleArgs, kinds: &[ScheduleKind]) -> Vec<String> {
    let mut w = Vec::new();
    if args.config.is_some() {
        return w;
    }
    let names = kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let split = |k: &ScheduleKind| {
        matches!(
            k,
            ScheduleKind::ZbH1 | ScheduleKind::ZbV | ScheduleKind::DualPipeV
        )
    };
    if args.w.is_some() && !kinds.iter().any(split) {
        w.push(format!(
            "--w ignored: {names} does not split the backward (zb-h1, zb-v and dualpipe-v do)"
        ));
    }
    if args.overlap_factor != 1.0 && !kinds.contains(&ScheduleKind::DualPipeV) {
        w.push(format!(
            "--overlap-factor ignored: only dualpipe-v overlaps a forward with a backward (running {names})"
        ));
    }
    if args.microbatch_group_size.is_some() && !kinds.contains(&ScheduleKind::Interleaved1F1B) {
        w.push(format!(
            "--microbatch-group-size ignored: only interleaved-1f1b groups microbatches (running {names})"
        ));
    }
    if let (Some(v), Some(_)) = (args.vpp, &args.compare) {
        let others: Vec<&str> = kinds
            .iter()
            .filter(|k| **k != ScheduleKind::Interleaved1F1B)
            .map(|k| k.as_str())
            .collect();
        if !others.is_empty() {
            w.push(format!(
                "--vpp {v} applies only to interleaved-1f1b in --compare: {} run with their own chunk count",
                others.join(", ")
            ));
        }
    }
    w
}

/// Runs `parsim schedule`.
pub fn run(args: ScheduleArgs) -> Result<()> {
    let kinds: Vec<ScheduleKind> = match &args.compare {
        Some(list) if !list.is_empty() => list.clone(),
        Some(_) => bail!("--compare needs at least one schedule name"),
        None => vec![args.schedule],
    };
    if args.max_columns < MIN_COLUMNS {
        bail!(
            "--max-columns must be at least {MIN_COLUMNS} (got {})",
            args.max_columns
        );
    }
    for w in ignored_flags(&args, &kinds) {
        eprintln!("warning: {w}");
    }
    let options = GenerateOptions {
        microbatch_group_size: args.microbatch_group_size,
    };
    let mut runs: Vec<(Program, Simulation, Costs)> = Vec::new();
    if let Some(path) = &args.config {
        let cfg = parsim::config::Config::from_layers(&[parsim::config::Layer::from_file(path)?])?;
        let compared = args.compare.as_deref().unwrap_or_default();
        if compared.is_empty() {
            runs.push(configured_schedule(cfg.clone(), None)?);
        }
        for &kind in compared {
            runs.push(configured_schedule(cfg.clone(), Some(kind))?);
        }
    }
    for &kind in kinds.iter().filter(|_| args.config.is_none()) {
        // In a comparison each schedule runs with its own chunk count, except that --vpp
        // applies to interleaved-1f1b.
        let vpp = match (args.vpp, kind) {
            (Some(v), _) if args.compare.is_none() => v,
            (Some(v), ScheduleKind::Interleaved1F1B) => v,
            _ => natural_vpp(kind),
        };
        let program = generate_with(kind, args.pp, vpp, args.microbatches, &options)
            .with_context(|| format!("cannot generate the {kind} schedule"))?;
        let per_chunk = 1.0 / vpp.max(1) as f64;
        let costs = Costs::uniform(
            args.pp,
            vpp,
            args.f * per_chunk,
            args.b * per_chunk,
            args.w.map(|w| w * per_chunk),
            args.p2p,
        )
        .and_then(|c| c.with_overlap_factor(args.overlap_factor))
        .context("bad --f/--b/--w/--p2p/--overlap-factor")?;
        let sim = simulate(&program, &costs)
            .with_context(|| format!("cannot simulate the {kind} schedule"))?;
        runs.push((program, sim, costs));
    }
    let refs: Vec<(&Program, &Simulation)> = runs.iter().map(|(p, s, _)| (p, s)).collect();

    let size = args.size.unwrap_or_else(|| gantt::default_size(&refs));
    if let Some(path) = &args.svg {
        gantt::write_svg(path, &refs, size)?;
        eprintln!("wrote {} ({}x{} SVG)", path.display(), size.0, size.1);
    }
    if let Some(path) = &args.png {
        gantt::write_png(path, &refs, size)?;
        eprintln!("wrote {} ({}x{} PNG)", path.display(), size.0, size.1);
    }
    if let Some(path) = &args.chrome_trace {
        let trace = chrome_trace::chrome_trace(&refs);
        std::fs::write(path, serde_json::to_vec(&trace)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!(
            "wrote {} (Chrome trace; open in ui.perfetto.dev)",
            path.display()
        );
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        writeln!(out, "{}", schedule_json(&refs, args.compare.is_some())?)?;
        return Ok(());
    }
    if args.csv {
        let with_costs: Vec<_> = runs.iter().map(|(p, s, c)| (p, s, c)).collect();
        write!(out, "{}", table_schedule::compare_csv(&with_costs))?;
        return Ok(());
    }
    if let (Some(_), Some(path)) = (&args.compare, &args.config) {
        let (p, _, _) = &runs[0];
        writeln!(
            out,
            "{}: pp {}, {} microbatches, stage costs from the engine (seconds)",
            path.display(),
            p.pp,
            p.microbatches
        )?;
        let with_costs: Vec<_> = runs.iter().map(|(p, s, c)| (p, s, c)).collect();
        writeln!(out, "{}", table_schedule::compare_table(&with_costs))?;
        return Ok(());
    }
    if args.compare.is_some() {
        writeln!(
            out,
            "pp {}, {} microbatches, per rank share: F = {}, B = {}{}, p2p = {}",
            args.pp,
            args.microbatches,
            args.f,
            args.b,
            args.w
                .map(|w| format!(" (I = {}, W = {w})", args.b))
                .unwrap_or_default(),
            args.p2p
        )?;
        let with_costs: Vec<_> = runs.iter().map(|(p, s, c)| (p, s, c)).collect();
        writeln!(out, "{}", table_schedule::compare_table(&with_costs))?;
        return Ok(());
    }
    let color = std::io::stdout().is_terminal();
    let (p, s) = refs[0];
    write!(
        out,
        "{}",
        ascii_timeline::render(p, s, color, args.max_columns)
    )?;
    writeln!(
        out,
        "makespan {} | bubble {:.1}% of ideal compute | idle {:.1}% of makespan | \
         peak live activation sets per rank: {:?}",
        s.makespan,
        100.0 * s.bubble_fraction,
        100.0 * s.idle_over_makespan,
        s.peak_inflight
    )?;
    Ok(())
}
