//! `parsim calibrate`: fit a hardware profile to measurements gathered elsewhere (a JSONL file
//! of configuration + measured step time + measured peak memory), report predicted vs measured
//! before and after, and write the fitted profile.

use anyhow::Context;
use clap::Args;
use parsim::calibrate::loop_fit::{fit_with_tables, FittedTables, LoopFit};
use parsim::calibrate::measurements;
use parsim::calibrate::op_report::{compare, ClassRow, Predicted};
use parsim::calibrate::profile_fit::ProfileFit;
use parsim::calibrate::table_fit::{Reproduction, REPRODUCTION_BOUND};
use parsim::config::tables::TableProvenance;
use parsim::config::GpuProfile;
use parsim::report::format::{gib, seconds};
use parsim::report::table::table;
use parsim_plan::op_timing::OpTiming;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Measurements, one JSON object per line: {"config": {...}, "step_s": 1.2, "peak_bytes": 123, "holdout": false}.
    #[arg(long, value_name = "FILE.jsonl", required_unless_present = "trace")]
    pub measurements: Option<PathBuf>,
    /// Profiler traces of a real run instead (PyTorch's Kineto JSON, gzipped or not, one file
    /// per rank; or `parsim execute --trace FILE --profile-ops`): fit the profile's rate
    /// tables from their kernels and name what they could not place (docs/calibration.md).
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["measurements", "report", "png", "ops_png"])]
    pub trace: Vec<PathBuf>,
    /// The profile to start from (a shipped name such as h100-sxm, or a profile TOML).
    #[arg(long, value_name = "BASE", visible_alias = "gpu")]
    pub profile: String,
    /// Where to write the fitted profile (TOML).
    #[arg(long, value_name = "NEW.toml")]
    pub out: Option<PathBuf>,
    /// Print every measurement, predicted before and after, and per op class the lines' op
    /// timings (`ops`) against the op time predicted before and after.
    #[arg(long)]
    pub report: bool,
    /// Draw predicted vs measured step time (before and after) as a PNG scatter plot.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Draw predicted vs measured time per call of every op timing in the lines' `ops` (before
    /// and after, one colour per op class) as a PNG scatter plot.
    #[arg(long, value_name = "FILE")]
    pub ops_png: Option<PathBuf>,
    /// Print the fit as JSON.
    #[arg(long)]
    pub json: bool,
}

fn pct(x: Option<(f64, f64)>) -> String {
    x.map_or("-".into(), |(m, w)| {
        format!("median {:.1}%, worst {:.1}%", 100.0 * m, 100.0 * w)
    })
}

fn print_fit(f: &ProfileFit, report: bool) {
    let mut t = table(&["parameter", "before", "after", "95% CI", "identifiable"]);
    let num = |v: f64| {
        if v != 0.0 && v.abs() < 1e-3 {
            format!("{v:.3e}")
        } else {
            format!("{v:.4}")
        }
    };
    for p in &f.params {
        let fitted = p.note.starts_with("fitted");
        t.add_row(vec![
            p.name.clone(),
            num(p.before),
            num(p.after),
            p.ci95
                .map_or("n/a".into(), |(a, b)| format!("[{}, {}]", num(a), num(b))),
            match (p.identifiable, fitted) {
                _ if p.measured => "measured: kept".into(),
                (true, true) => "yes".into(),
                (true, false) => "yes, but not fitted: more parameters than measurements".into(),
                (false, _) => "NO: kept at base".to_string(),
            },
        ]);
    }
    t.add_row(vec![
        "runtime_overhead_bytes".to_string(),
        gib(f.runtime_overhead_bytes.0) + " GiB",
        gib(f.runtime_overhead_bytes.1) + " GiB",
        "n/a".into(),
        if f.rows.iter().any(|r| r.measured_peak_bytes.is_some()) {
            "yes".into()
        } else {
            "NO: no peak_bytes given".into()
        },
    ]);
    println!("{t}");
    // With no degrees of freedom the fit passes through its points: R^2 says nothing.
    let r2 = if f.degrees_of_freedom > 0 && f.r2.is_finite() {
        format!("{:.4}", f.r2)
    } else {
        "n/a".into()
    };
    println!(
        "fit: R^2 {r2} on log step time, residual spread {:.2}% (rms), {} degrees of freedom",
        100.0 * f.residual_rms,
        f.degrees_of_freedom
    );
    for role in ["fit", "held out"] {
        println!(
            "{role:9} step time before: {} | after: {}   peak memory before: {} | after: {}",
            pct(f.summary(role, false, false)),
            pct(f.summary(role, false, true)),
            pct(f.summary(role, true, false)),
            pct(f.summary(role, true, true))
        );
    }
    let outliers: Vec<String> = f
        .rows
        .iter()
        .filter(|r| r.role == "outlier")
        .map(|r| format!("line {}", r.line))
        .collect();
    if !outliers.is_empty() {
        println!(
            "outliers set aside (beyond 3 MADs): {}",
            outliers.join(", ")
        );
    }
    if report {
        let mut t = table(&[
            "line",
            "label",
            "role",
            "measured",
            "before",
            "after",
            "peak measured",
            "before",
            "after",
        ]);
        for r in &f.rows {
            t.add_row(vec![
                r.line.to_string(),
                r.label.clone(),
                r.role.to_string(),
                seconds(r.measured_s),
                format!(
                    "{} ({:+.1}%)",
                    seconds(r.before_s),
                    100.0 * r.step_error(false)
                ),
                format!(
                    "{} ({:+.1}%)",
                    seconds(r.after_s),
                    100.0 * r.step_error(true)
                ),
                r.measured_peak_bytes
                    .map_or("-".into(), |b| gib(b) + " GiB"),
                r.peak_error(false).map_or(gib(r.before_peak_bytes), |e| {
                    format!("{} ({:+.1}%)", gib(r.before_peak_bytes), 100.0 * e)
                }),
                r.peak_error(true).map_or(gib(r.after_peak_bytes), |e| {
                    format!("{} ({:+.1}%)", gib(r.after_peak_bytes), 100.0 * e)
                }),
            ]);
        }
        println!("{t}");
    }
}

/// The provenance of tables fitted by `parsim calibrate` from the lines of `origin`.
fn table_provenance(base: &GpuProfile, origin: &str) -> TableProvenance {
    TableProvenance {
        date: parsim::host::utc_date(),
        device: format!(
            "{} (the profile fitted: the measurement lines do not name their device)",
            base.description
        ),
        driver: "not recorded in the measurement lines".into(),
        software: format!(
            "parsim {} `calibrate` from the op timings in {origin}",
            env!("CARGO_PKG_VERSION")
        ),
    }
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    let Some(measurements_path) = args.measurements.as_deref() else {
        return super::calibrate_trace::run(super::calibrate_trace::TraceArgs {
            traces: &args.trace,
            profile: &args.profile,
            out: args.out.as_deref(),
            json: args.json,
        });
    };
    let base = GpuProfile::load(&args.profile)?;
    let ms = measurements::read(measurements_path)?;
    let origin = measurements_path.display().to_string();
    for w in measurements::peak_warnings(&ms, &origin) {
        eprintln!("warning: {w}");
    }
    let ops: Vec<OpTiming> = ms.iter().flat_map(|m| m.ops.iter().cloned()).collect();
    if ops.is_empty() && args.ops_png.is_some() {
        anyhow::bail!(
            "--ops-png: no line of {origin} carries `ops` (op timings: `execute --profile-ops`, docs/calibration.md)"
        );
    }
    // The profile as given, for the op classes' "before". Tables first (from the fitting
    // lines' timings only), so the scalar fit starts from them and fits only what they leave.
    let given = base.clone();
    let LoopFit { fit, tables } =
        fit_with_tables(&base, &ms, &origin, &table_provenance(&base, &origin))
            .with_context(|| origin.clone())?;
    let op_tables = tables.map(|t| t.reproduction);
    let op_report = (!ops.is_empty()).then(|| compare(&ops, &given, &fit.profile));
    if args.json {
        let mut v = fit_json(&fit, op_tables.as_deref())?;
        if let (Some(r), Some(obj)) = (&op_report, v.as_object_mut()) {
            obj.insert("op_classes".into(), serde_json::to_value(&r.rows)?);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_fit(&fit, args.report);
        if let Some(rows) = &op_tables {
            super::calibrate_trace::print_reproduction(
                rows,
                "rate tables fitted from the fitting lines' op timings, against those timings (the class's seconds, and each timing's error)",
            );
        }
        if args.report {
            match &op_report {
                Some(r) => print!("{}", op_class_text(&r.rows)),
                None => println!(
                    "op classes: no line of {origin} carries `ops` (op timings), so there is no per-class table"
                ),
            }
            print_held_out_families(&given, &ms, &fit, &origin)?;
        }
    }
    for r in op_tables.iter().flatten() {
        if !r.within_bound() {
            eprintln!(
                "warning: the {} table gives its timings' seconds {:+.1}% off (bound {:.0}%)",
                r.class,
                100.0 * r.total_error,
                100.0 * REPRODUCTION_BOUND
            );
        }
    }
    if let Some(path) = &args.png {
        parsim::calibrate::plot::write_fit_png(path, &fit)?;
        eprintln!("wrote {}", path.display());
    }
    if let (Some(path), Some(r)) = (&args.ops_png, &op_report) {
        parsim::calibrate::plot::write_ops_png(path, r)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.out {
        let text = toml::to_string(&fit.profile).context("serializing the fitted profile")?;
        let header = format!(
            "# {}: fitted by `parsim calibrate` from {origin}; provenance below.\n",
            fit.profile.name
        );
        std::fs::write(path, header + &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--report`'s leave-one-family-out figures beside the in-family held-out ones.
fn print_held_out_families(
    given: &GpuProfile,
    ms: &[measurements::Measurement],
    fit: &ProfileFit,
    origin: &str,
) -> anyhow::Result<()> {
    let held = parsim::calibrate::profile_fit::held_out_lines(ms);
    let in_family: Vec<OpTiming> = ms
        .iter()
        .zip(&held)
        .filter(|(_, h)| **h)
        .flat_map(|(m, _)| m.ops.iter().cloned())
        .collect();
    let in_family = compare(&in_family, given, &fit.profile).rows;
    let lofo = parsim::calibrate::family::leave_one_family_out(
        given,
        ms,
        origin,
        &table_provenance(given, origin),
    )
    .with_context(|| format!("leave-one-family-out fits of {origin}"))?;
    super::closed_loop::print_lofo(fit, &lofo, &in_family);
    // Lines of `execute --calibrate --closed-loop` (held out, labelled "unseen: ").
    let unseen = parsim::calibrate::closed_loop::ClosedLoop::of(ms, fit, given);
    if !unseen.rows.is_empty() {
        super::closed_loop::print_closed_loop(&unseen);
    }
    Ok(())
}

/// A prediction's seconds and relative error ("n/a" where it has none) for a class of
/// `timings` timings.
fn predicted_cells(p: &Predicted, timings: usize) -> [String; 2] {
    if p.unpredicted == timings {
        return ["not predicted".into(), "n/a".into()];
    }
    [
        seconds(p.predicted_s),
        p.error()
            .map_or("n/a".into(), |e| format!("{:+.1}%", 100.0 * e)),
    ]
}

/// `--report`'s op-class table: per class the measured op time of the lines' timings against
/// the time the profile predicts for them, before and after the fit.
fn op_class_text(rows: &[ClassRow]) -> String {
    let mut t = table(&[
        "op class",
        "timings",
        "measured",
        "before",
        "error",
        "after",
        "error",
        "not predicted",
    ]);
    for r in rows {
        if r.timings == 0 {
            t.add_row(vec![
                r.class.to_string(),
                "absent from the lines".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
            ]);
            continue;
        }
        let [before, before_error] = predicted_cells(&r.before, r.timings);
        let [after, after_error] = predicted_cells(&r.after, r.timings);
        t.add_row(vec![
            r.class.to_string(),
            r.timings.to_string(),
            seconds(r.measured_s),
            before,
            before_error,
            after,
            after_error,
            format!("{} / {}", r.before.unpredicted, r.after.unpredicted),
        ]);
    }
    format!(
        "op classes: the lines' op timings (calls x seconds, summed) against the profile's \
         prediction as given (before) and fitted (after); error over the timings it predicts:\n{t}\n"
    )
}

/// The fit as `--json` prints it, with the tables' reproduction of the op timings as
/// `op_tables` when the lines carry them.
fn fit_json(
    fit: &ProfileFit,
    op_tables: Option<&[Reproduction]>,
) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(fit)?;
    if let (Some(rows), Some(obj)) = (op_tables, v.as_object_mut()) {
        obj.insert("op_tables".into(), serde_json::to_value(rows)?);
    }
    Ok(v)
}

/// Writes the sweep's measurements beside the profile `out` names (`.jsonl`, readable by
/// `parsim calibrate`) before any fit, so that a fit that fails leaves them; their path.
fn write_measurements(
    out: Option<&std::path::Path>,
    ms: &[measurements::Measurement],
) -> anyhow::Result<Option<PathBuf>> {
    let Some(jsonl) = out.map(|o| o.with_extension("jsonl")) else {
        return Ok(None);
    };
    std::fs::write(&jsonl, parsim::calibrate::sweep::to_jsonl(ms))
        .with_context(|| format!("cannot write {}", jsonl.display()))?;
    Ok(Some(jsonl))
}

/// `execute --calibrate`'s report of its fit: the fit and, with op timings, the tables'
/// reproduction of them (`--json`: the fit with `op_tables`).
fn print_sweep_fit(
    fit: &ProfileFit,
    tables: Option<&FittedTables>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let v = fit_json(fit, tables.map(|t| t.reproduction.as_slice()))?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_fit(fit, true);
        if let Some(t) = tables {
            super::calibrate_trace::print_reproduction(
                &t.reproduction,
                "rate tables fitted from the fitting lines' op timings, against those timings (the class's seconds, and each timing's error)",
            );
        }
    }
    Ok(())
}

/// The CPU backend's seconds per synchronisation on this host now: the median of five rounds
/// of 400 one-element all-reduces between two threads (every measurement line's `rendezvous_s`).
fn rendezvous_s() -> anyhow::Result<f64> {
    let mut rounds = (0..5)
        .map(|_| parsim_executor::backend::cpu::rendezvous::rendezvous_s(400))
        .collect::<Result<Vec<f64>, _>>()
        .context("timing the CPU backend's rendezvous")?;
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[rounds.len() / 2])
}

/// Runs of each sweep point in `parsim execute --calibrate` (the fastest is kept: interference
/// from other work only ever adds time).
const REPEATS: u32 = 3;

/// `parsim execute --calibrate`: run the sweep on the CPU backend, fit the CPU profile, write
/// it (and the measurements beside it, as its provenance).
pub fn run_execute_calibrate(
    sweep: Option<&std::path::Path>,
    closed_loop: bool,
    out: Option<&std::path::Path>,
    steps: u32,
    warmup: u32,
    json: bool,
) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use parsim::calibrate::sweep;
    let mut points = match sweep {
        Some(p) => sweep::read_sweep(p)?,
        None => sweep::default_cpu_sweep(),
    };
    anyhow::ensure!(!points.is_empty(), "the sweep has no points");
    if closed_loop {
        points.extend(parsim::calibrate::closed_loop::unseen_cpu_points());
    }
    let started = std::time::Instant::now();
    let bar = ProgressBar::new(REPEATS as u64 * points.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} measuring [{bar:30}] {pos}/{len} runs")
            .context("progress template")?
            .progress_chars("=> "),
    );
    let mut ms = sweep::measure_all(
        &points,
        steps,
        warmup,
        REPEATS,
        &parsim_executor::runner::run_cpu_for,
        |_| bar.inc(1),
    )?;
    bar.finish_and_clear();
    // The host's synchronisation as the sweep ran, written into every line: the fit reads it
    // from the lines, so a refit of the JSONL gives the profile this run writes.
    let rendezvous = rendezvous_s()?;
    for m in &mut ms {
        m.rendezvous_s = Some(rendezvous);
    }
    let base = GpuProfile::load("cpu")?;
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    let host = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let jsonl_path = write_measurements(out, &ms)?;
    let origin = format!(
        "{} (CPU backend sweep, {}, {})",
        jsonl_path
            .as_ref()
            .map_or("the sweep".into(), |p| p.display().to_string()),
        date.trim(),
        host
    );
    let provenance = TableProvenance {
        date: date.trim().to_string(),
        device: host.clone(),
        driver: "none: the CPU backend (threads)".into(),
        software: format!(
            "parsim {} `execute --calibrate --backend cpu`",
            env!("CARGO_PKG_VERSION")
        ),
    };
    let LoopFit { mut fit, tables } = fit_with_tables(&base, &ms, &origin, &provenance)?;
    // The CPU tracker counts only the run's own tensors: keep its runtime overhead at zero.
    fit.profile.runtime_overhead_bytes = 0;
    fit.profile.provenance.remove("runtime_overhead_bytes");
    let unseen =
        closed_loop.then(|| parsim::calibrate::closed_loop::ClosedLoop::of(&ms, &fit, &base));
    match &unseen {
        // One JSON document: the fit with the unseen configurations as `closed_loop`.
        Some(l) if json => {
            let mut v = fit_json(&fit, tables.as_ref().map(|t| t.reproduction.as_slice()))?;
            v["closed_loop"] = serde_json::to_value(l)?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Some(l) => {
            print_sweep_fit(&fit, tables.as_ref(), false)?;
            super::closed_loop::print_closed_loop(l);
        }
        None => print_sweep_fit(&fit, tables.as_ref(), json)?,
    }
    if closed_loop {
        eprintln!(
            "measured {} runs in {:.0} s",
            REPEATS as usize * points.len(),
            started.elapsed().as_secs_f64()
        );
    }
    if let (Some(path), Some(jsonl)) = (out, jsonl_path) {
        let header = format!(
            "# {}: fitted by `parsim execute --calibrate` from {origin}; provenance below.\n",
            fit.profile.name
        );
        std::fs::write(path, header + &toml::to_string(&fit.profile)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {} and {}", path.display(), jsonl.display());
    }
    Ok(())
}

/// `parsim execute --calibrate --backend cuda`: the sweep on the GPUs at hand (every run in
/// this process, bf16 mixed precision), the fit starting from the profile `base` (the
/// configuration's `cluster.gpu`), written with the GPU's name and the date as provenance.
/// Without a driver or a GPU it fails before the first run, naming what is missing.
/// The CUDA driver as the provenance names it: its CUDA version and the library file (whose
/// name carries the kernel driver's version, e.g. libcuda.so.580.159.04).
fn cuda_driver_note() -> String {
    let r = parsim_executor::backend::cuda::diag::doctor::report_libraries();
    let lib = r
        .iter()
        .find(|l| l.library == "CUDA driver")
        .and_then(|l| l.path.clone())
        .unwrap_or_else(|| "driver library not found".into());
    match parsim_executor::backend::cuda::diag::doctor::driver_version_string() {
        Some(v) => format!("driver CUDA {v} ({lib})"),
        None => format!("driver {lib}"),
    }
}

pub fn run_execute_calibrate_cuda(
    sweep: Option<&std::path::Path>,
    out: Option<&std::path::Path>,
    base: &str,
    steps: u32,
    warmup: u32,
    json: bool,
) -> anyhow::Result<()> {
    use parsim::calibrate::sweep;
    use parsim_executor::backend::cuda::device::context;
    use parsim_executor::runner::{run_cuda, CudaWorld};
    let gpus = context::visible_gpus()?;
    let gpu_name = context::gpu_name(0)?;
    let base_profile = GpuProfile::load(base)
        .with_context(|| format!("--gpu {base}: the profile the CUDA calibration starts from"))?;
    let points: Vec<sweep::SweepPoint> = match sweep {
        Some(p) => sweep::read_sweep(p)?,
        None => sweep::default_gpu_sweep(),
    }
    .into_iter()
    .map(|mut p| {
        p.config = sweep::for_cuda(p.config, base);
        p
    })
    .collect();
    anyhow::ensure!(!points.is_empty(), "the sweep has no points");
    let started = std::time::Instant::now();
    let ms = sweep::measure_all(
        &points,
        steps,
        warmup,
        REPEATS,
        &|plan, l| Ok(run_cuda(plan, &l.into(), CudaWorld::SingleProcess)?),
        |i| {
            eprintln!(
                "measured {} ({} of {}), {:.0} s in",
                points[i].label,
                i + 1,
                points.len(),
                started.elapsed().as_secs_f64()
            );
        },
    )?;
    let jsonl_path = write_measurements(out, &ms)?;
    let driver = cuda_driver_note();
    let origin = format!(
        "{} (CUDA backend sweep on {gpus} x {gpu_name}, {driver}, {} UTC, from the {base} profile)",
        jsonl_path
            .as_ref()
            .map_or("the sweep".into(), |p| p.display().to_string()),
        parsim::host::utc_date(),
    );
    let provenance = TableProvenance {
        date: parsim::host::utc_date(),
        device: format!("{gpus} x {gpu_name}"),
        driver,
        software: format!(
            "parsim {} `execute --calibrate --backend cuda`",
            env!("CARGO_PKG_VERSION")
        ),
    };
    let LoopFit { fit, tables } = fit_with_tables(&base_profile, &ms, &origin, &provenance)?;
    print_sweep_fit(&fit, tables.as_ref(), json)?;
    if let (Some(path), Some(jsonl)) = (out, jsonl_path) {
        let header = format!(
            "# {}: fitted by `parsim execute --calibrate --backend cuda` from {origin}; provenance below.\n",
            fit.profile.name
        );
        std::fs::write(path, header + &toml::to_string(&fit.profile)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {} and {}", path.display(), jsonl.display());
    }
    Ok(())
}
