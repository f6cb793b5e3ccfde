//! `parsim search --gpus LOW..HIGH`: the best mix at each GPU count of a range, the smallest
//! count where one fits, as a table, CSV, JSON or a PNG of step time and tokens/s.

use super::ranked::{cancel_on_ctrl_c, csv_fields, nvlink_domain_lines, CSV_COLUMNS};
use super::row_command::UserFlags;
use super::Outcome;
use anyhow::Context;
use parsim::report::csv::Csv;
use parsim::report::format::{gib, seconds};
use parsim::report::{scaling_chart, table};
use parsim::scaling::{search_range, GpuRange, ScalingResult};
use parsim::search::SearchSpec;

/// How to print a range search.
pub struct Output<'a> {
    pub json: bool,
    pub csv: bool,
    /// Draw the sweep as a PNG here.
    pub png: Option<&'a std::path::Path>,
}

/// Searches every count of `range` and prints the result as `args` asks.
pub fn run(
    spec: &SearchSpec,
    range: GpuRange,
    args: &Output<'_>,
    user: &UserFlags,
) -> anyhow::Result<Outcome> {
    let cancel = cancel_on_ctrl_c();
    let progress = |i: usize, n: usize| {
        if !args.json && !args.csv {
            eprintln!("searching {} of {n} GPU counts", i + 1);
        }
    };
    let mut result = search_range(spec, range, &progress, &cancel)?;
    user.fill(
        result.points.iter_mut().filter_map(|p| p.best.as_mut()),
        &spec.base,
    );
    if let Some(path) = args.png {
        scaling_chart::write_png(path, &result, scaling_chart::DEFAULT_SIZE)
            .with_context(|| format!("--png {}", path.display()))?;
    }
    let outcome = if result.interrupted {
        Outcome::Interrupted
    } else if result.smallest_fitting_gpus.is_none() {
        Outcome::DoesNotFit
    } else {
        Outcome::Ok
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else if args.csv {
        print!("{}", csv(&result));
    } else {
        print!("{}", text(spec, &result));
    }
    Ok(outcome)
}

fn csv(result: &ScalingResult) -> String {
    let mut c = Csv::new(&[&["gpus", "fits"], CSV_COLUMNS].concat());
    for p in &result.points {
        let mut row = vec![p.gpus.to_string(), p.best.is_some().to_string()];
        match &p.best {
            Some(b) => row.extend(csv_fields(b)),
            None => row.extend(CSV_COLUMNS.iter().map(|_| String::new())),
        }
        c.row(row);
    }
    c.finish()
}

fn text(spec: &SearchSpec, result: &ScalingResult) -> String {
    let m = &spec.base.model;
    let mut t = table::table(&[
        "GPUs",
        "best mix",
        "step",
        "tokens/s",
        "tokens/s/GPU",
        "MFU",
        "GiB",
    ]);
    for p in &result.points {
        match &p.best {
            Some(b) => {
                let e = &b.estimate;
                t.add_row(vec![
                    p.gpus.to_string(),
                    b.label.clone(),
                    seconds(e.time.step_s),
                    format!("{:.0}", e.throughput.tokens_per_s),
                    format!("{:.0}", e.throughput.tokens_per_s / p.gpus as f64),
                    format!("{:.1}%", 100.0 * e.throughput.mfu),
                    gib(e.memory.per_gpu_max_bytes),
                ]);
            }
            None => {
                t.add_row(vec![p.gpus.to_string(), "no mix fits".to_string()]);
            }
        }
    }
    // Counts that fill no racks of the profile's NVLink domain say so.
    let mut notes = String::new();
    for p in &result.points {
        let mut cluster = spec.base.cluster.clone();
        cluster.num_gpus = p.gpus;
        for line in nvlink_domain_lines(&cluster, false) {
            notes.push_str(&format!("{} GPUs: {line}\n", p.gpus));
        }
    }
    let smallest = match result.smallest_fitting_gpus {
        Some(n) => format!("smallest GPU count that fits: {n}"),
        None => format!(
            "no GPU count from {} to {} fits: a GPU with more memory, a shorter sequence or a larger range",
            result.range.low, result.range.high
        ),
    };
    let mut commands = String::from("each row as a command (it gives the row's figures):\n");
    for p in &result.points {
        if let Some(b) = &p.best {
            let text = b
                .command
                .clone()
                .unwrap_or_else(|| UserFlags::explain(b, &spec.base));
            commands.push_str(&format!("  {:>5} GPUs  {text}\n", p.gpus));
        }
    }
    format!(
        "search: {} on {}..{} x {} ({} per node), seq {}, global batch {}; GPU counts: the powers of two in the range and both ends\n{t}\n{notes}{smallest}{}\n{commands}",
        m.name,
        result.range.low,
        result.range.high,
        spec.base.cluster.gpu,
        spec.base.cluster.per_node(),
        spec.base.training.seq_length,
        spec.base.training.global_batch_size,
        if result.interrupted { " -- INTERRUPTED, partial results" } else { "" }
    )
}
