//! `parsim calibrate --trace FILE...`: fit a profile's rate tables from profiler traces of a
//! real run (PyTorch's Kineto JSON, one file per rank, or `parsim execute --trace
//! --profile-ops`), and report what the traces covered and what they could not place.

use anyhow::Context;
use parsim::calibrate::table_fit::{merge_tables, Reproduction, REPRODUCTION_BOUND};
use parsim::calibrate::trace::{fit_trace, read_traces, TraceFit, TraceOps};
use parsim::config::tables::TableProvenance;
use parsim::config::GpuProfile;
use parsim::report::format::seconds;
use parsim::report::table::table;
use std::path::{Path, PathBuf};

/// Unplaced kernel names are shown up to this many characters (C++ template names run long).
const NAME_CHARS: usize = 90;

/// What `calibrate --trace` was asked.
pub struct TraceArgs<'a> {
    pub traces: &'a [PathBuf],
    pub profile: &'a str,
    pub out: Option<&'a Path>,
    pub json: bool,
}

fn short(name: &str) -> String {
    match name.char_indices().nth(NAME_CHARS) {
        Some((i, _)) => format!("{}...", &name[..i]),
        None => name.to_string(),
    }
}

/// The report: files, frameworks, per op class what the traces gave, the unplaced kernels by
/// name and time, and the tables' reproduction of the timings.
fn print_report(ops: &TraceOps, fit: &TraceFit) {
    for f in &ops.files {
        let rank = match (f.rank, f.world_size) {
            (Some(r), Some(w)) => format!("rank {r} of {w}"),
            (None, Some(w)) => format!("{w} ranks"),
            _ => "rank not recorded".into(),
        };
        let frameworks: Vec<String> = f
            .frameworks
            .iter()
            .map(|(fw, by)| format!("{fw} (`{}`)", short(by)))
            .collect();
        println!(
            "{}: {rank}, {} kernels, {} of kernel time; framework: {}",
            f.path,
            f.kernels,
            seconds(f.kernel_s),
            if frameworks.is_empty() {
                "not told by the trace".to_string()
            } else {
                frameworks.join(", ")
            }
        );
    }
    let share = if ops.kernel_s > 0.0 {
        100.0 * ops.placed_s / ops.kernel_s
    } else {
        0.0
    };
    println!(
        "placed {} of {} kernel time ({share:.1}%) on parsim's op classes",
        seconds(ops.placed_s),
        seconds(ops.kernel_s)
    );
    let mut t = table(&["op class", "keys", "calls", "seconds", "covered"]);
    for c in ops.coverage() {
        t.add_row(vec![
            c.class.to_string(),
            c.keys.to_string(),
            c.calls.to_string(),
            if c.keys > 0 {
                seconds(c.total_s)
            } else {
                "-".into()
            },
            if c.keys > 0 {
                "yes"
            } else {
                "no: not in the trace"
            }
            .to_string(),
        ]);
    }
    println!("{t}");
    if ops.unplaced.is_empty() {
        println!("every kernel was placed");
    } else {
        let mut t = table(&["kernel not placed", "calls", "seconds", "why"]);
        for u in &ops.unplaced {
            t.add_row(vec![
                short(&u.name),
                u.calls.to_string(),
                seconds(u.total_s),
                u.reason.clone(),
            ]);
        }
        println!("{t}");
    }
    print_reproduction(
        &fit.reproduction,
        "rate tables fitted from the traces, against the traces' timings",
    );
}

/// `parsim calibrate --trace`.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let mut profile = GpuProfile::load(args.profile).with_context(|| {
        format!(
            "--gpu {}: the profile the trace is fitted into",
            args.profile
        )
    })?;
    let ops = read_traces(args.traces, u64::from(profile.gpus_per_node))?;
    let origin: Vec<String> = args
        .traces
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let origin = origin.join(", ");
    let provenance = TableProvenance {
        date: parsim::host::utc_date(),
        device: format!(
            "{} (the profile fitted: a Kineto trace does not name its device's model)",
            profile.description
        ),
        driver: "not recorded in the trace".into(),
        software: format!(
            "parsim {} `calibrate --trace` from {origin}; framework: {}",
            env!("CARGO_PKG_VERSION"),
            match ops.frameworks() {
                f if f.is_empty() => "not told by the trace".to_string(),
                f => f.join(", "),
            }
        ),
    };
    let fit = fit_trace(&ops, &profile, &provenance).with_context(|| origin.clone())?;
    if args.json {
        let v = serde_json::json!({
            "files": ops.files,
            "frameworks": ops.frameworks(),
            "kernel_s": ops.kernel_s,
            "placed_s": ops.placed_s,
            "op_classes": ops.coverage(),
            "unplaced": ops.unplaced,
            "timings": ops.timings,
            "tables": fit.tables,
            "op_tables": fit.reproduction,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(&ops, &fit);
    }
    for r in &fit.reproduction {
        if !r.within_bound() {
            eprintln!(
                "warning: the {} table gives its timings' seconds {:+.1}% off (bound {:.0}%)",
                r.class,
                100.0 * r.total_error,
                100.0 * REPRODUCTION_BOUND
            );
        }
    }
    if let Some(path) = args.out {
        merge_tables(&mut profile.tables, fit.tables);
        let header = format!(
            "# {}: rate tables fitted by `parsim calibrate --trace` from {origin}; provenance below.\n",
            profile.name
        );
        std::fs::write(path, header + &toml::to_string(&profile)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Per op class, how closely the fitted tables give back the timings they came from (the
/// executor's op timings or a trace's), under `heading`.
pub(crate) fn print_reproduction(rows: &[Reproduction], heading: &str) {
    let mut t = table(&[
        "op class",
        "timings",
        "not covered",
        "class total",
        "median timing",
        "worst timing",
    ]);
    for r in rows {
        t.add_row(vec![
            r.class.to_string(),
            r.ops.to_string(),
            r.uncovered.to_string(),
            format!("{:+.1}%", 100.0 * r.total_error),
            format!("{:.1}%", 100.0 * r.median_error),
            format!("{:.1}%", 100.0 * r.worst_error),
        ]);
    }
    println!("{heading}:\n{t}");
}
