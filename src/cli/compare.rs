//! `parsim compare`: two or more configurations side by side (memory by category, time
//! breakdown, throughput), from files or from flag sets.

use super::config_args::ConfigArgs;
use super::Outcome;
use anyhow::Context;
use clap::{Args, Parser};
use parsim::report::compare;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Configuration files (TOML, or JSON by extension), one column each.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// A set of `estimate` flags, one column each, e.g. `--set "--tp 4 --pp 2"` (repeatable;
    /// split at whitespace, no shell quoting). Flags set with --base apply under it.
    #[arg(long = "set", value_name = "FLAGS", allow_hyphen_values = true)]
    pub sets: Vec<String>,
    /// `estimate` flags shared by every column (under each file and flag set), e.g.
    /// `--base "--model llama3-70b --gpus 64"`.
    #[arg(
        long,
        value_name = "FLAGS",
        allow_hyphen_values = true,
        default_value = ""
    )]
    pub base: String,
    /// Print `{labels, mixes, metrics: [{section, name, unit, values, differs}], estimates}` as JSON.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print one CSV row per quantity, values unrounded (bytes, seconds, fractions).
    #[arg(long)]
    pub csv: bool,
}

/// A flag set parsed as `estimate` parses its flags.
#[derive(Debug, Parser)]
#[command(name = "--set", no_binary_name = true)]
struct FlagSet {
    #[command(flatten)]
    config: ConfigArgs,
}

/// Parses `flags` (the shared ones first, then the column's).
fn parse(base: &str, flags: &str) -> anyhow::Result<ConfigArgs> {
    let words = base.split_whitespace().chain(flags.split_whitespace());
    let set = FlagSet::try_parse_from(words).with_context(|| format!("--set \"{flags}\""))?;
    Ok(set.config)
}

pub fn run(args: CompareArgs) -> anyhow::Result<Outcome> {
    let mut columns: Vec<(String, ConfigArgs)> = Vec::new();
    for f in &args.files {
        let mut c = parse(&args.base, "")?;
        c.source.config = Some(f.clone());
        let label = f.file_name().map_or_else(
            || f.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        columns.push((label, c));
    }
    for s in &args.sets {
        columns.push((s.trim().to_string(), parse(&args.base, s)?));
    }
    if columns.len() < 2 {
        anyhow::bail!(
            "compare needs at least two configurations (files and --set flag sets), got {}",
            columns.len()
        );
    }
    let mut labels = Vec::new();
    let mut estimates = Vec::new();
    // Each column's warnings, printed once each with the columns they concern.
    let mut warned: Vec<(String, Vec<usize>)> = Vec::new();
    let n = columns.len();
    for (i, (label, c)) in columns.into_iter().enumerate() {
        let mut warnings = Vec::new();
        let cfg = c
            .load_noting(&mut warnings)
            .with_context(|| label.clone())?;
        for w in warnings {
            match warned.iter_mut().find(|(t, _)| *t == w) {
                Some((_, idx)) => idx.push(i),
                None => warned.push((w, vec![i])),
            }
        }
        let r = parsim::config::Resolved::new(cfg).with_context(|| label.clone())?;
        estimates.push(parsim::estimate::estimate(&r).with_context(|| label.clone())?);
        labels.push(label);
    }
    for (w, idx) in &warned {
        let cols = compare::columns_of(idx, n);
        match w.split_once(": ") {
            Some((kind, rest)) => eprintln!("{kind}{cols}: {rest}"),
            None => eprintln!("{w}{cols}"),
        }
    }
    let all_fit = estimates.iter().all(|e| e.memory.fits);
    let cmp = parsim::report::contract::compared(labels, estimates)?;
    if args.json {
        println!("{}", cmp.json()?);
    } else if args.csv {
        print!("{}", compare::csv(&cmp.comparison));
        if cmp.any_run() {
            eprintln!(
                "note: the run (--train-tokens) is in the table and --json output, not the CSV"
            );
        }
    } else {
        print!("{}", compare::text(&cmp.comparison));
        if cmp.any_run() {
            print!(
                "\n{}",
                parsim::report::run_table::runs_text(&cmp.labels, &cmp.runs)
            );
        }
    }
    Ok(if all_fit {
        Outcome::Ok
    } else {
        Outcome::DoesNotFit
    })
}
