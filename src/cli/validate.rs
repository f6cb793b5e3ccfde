//! `parsim validate`: every public measured source at each row's published settings, with the
//! figures per source and per (model, system), the accuracy guards and the goals beside them
//! (the engine's `validate` module does the work; this file parses flags and prints).

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parsim::validate::{self, guards, markdown, stats, GuardFile, Options, Source};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Only these sources (repeat or separate by commas): megatron-bridge, vtrain, bloom-tr11,
    /// narayanan-2021, megatron-core-2024, llm-foundry. Default: every source.
    #[arg(long = "source", value_name = "NAME", value_delimiter = ',')]
    pub sources: Vec<String>,
    /// List every row: its settings, measured and predicted step, error, interval and notes.
    #[arg(long)]
    pub rows: bool,
    /// Print JSON: per source and per (model, system) figures, guards, goals and every row.
    #[arg(long)]
    pub json: bool,
    /// Keep every K-th row of each source: a quick look whose figures are not the published
    /// ones (the guards are not checked on a sample).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// Rewrite the generated section of the accuracy page (default docs/accuracy.md) with
    /// today's figures: every source, every row.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "docs/accuracy.md")]
    pub write_docs: Option<PathBuf>,
}

/// The `--json` document.
#[derive(Serialize)]
struct Json<'a> {
    sources: Vec<SourceJson>,
    guards: Vec<guards::GuardCheck>,
    misses: Vec<guards::MissCheck>,
    goals: Vec<guards::GoalCheck>,
    remarks: &'a [String],
    sample_every: usize,
    rows: &'a [validate::Row],
}

#[derive(Serialize)]
struct SourceJson {
    source: Source,
    name: &'static str,
    usage: validate::Use,
    defaults: &'static str,
    figures: stats::Stats,
    not_expressible: Vec<(String, usize)>,
    groups: Vec<GroupJson>,
}

#[derive(Serialize)]
struct GroupJson {
    model: String,
    system: String,
    figures: stats::Stats,
}

fn sources(args: &ValidateArgs) -> anyhow::Result<Vec<Source>> {
    if args.sources.is_empty() {
        return Ok(Source::ALL.to_vec());
    }
    args.sources
        .iter()
        .map(|s| {
            Source::parse(s).with_context(|| {
                format!(
                    "--source '{s}' is not a source: use one of {}",
                    Source::ALL.map(Source::key).join(", ")
                )
            })
        })
        .collect()
}

pub fn run(args: ValidateArgs) -> anyhow::Result<()> {
    let opts = Options {
        sources: sources(&args)?,
        every: args.sample as usize,
    };
    if args.write_docs.is_some() && (opts.every != 1 || opts.sources.len() != Source::ALL.len()) {
        anyhow::bail!(
            "--write-docs writes every source's figures: leave out --source and --sample"
        );
    }
    let file = GuardFile::shipped()?;
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} validating [{bar:40}] {pos}/{len} rows ({eta})")
            .context("progress template")?
            .progress_chars("=> "),
    );
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
    let report = validate::run(&opts, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report?;
    let (checks, misses) = guards::check(&file, &report);
    if args.json {
        let doc = Json {
            sources: report
                .sources
                .iter()
                .map(|&s| SourceJson {
                    source: s,
                    name: s.name(),
                    usage: s.usage(),
                    defaults: s.defaults(),
                    figures: stats::Stats::of(report.of(s)),
                    not_expressible: stats::not_expressible(&report, s),
                    groups: stats::by_group(&report, s)
                        .into_iter()
                        .map(|((model, system), figures)| GroupJson {
                            model,
                            system,
                            figures,
                        })
                        .collect(),
                })
                .collect(),
            guards: checks.clone(),
            misses: misses.clone(),
            goals: guards::goals(&file, &report),
            remarks: &report.remarks,
            sample_every: report.every,
            rows: &report.rows,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", validate::text::report(&report, &file, args.rows));
    }
    if let Some(path) = &args.write_docs {
        let doc =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let new = markdown::replace_section(&doc, &markdown::section(&report, &file))
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the validation section of {}", path.display());
    }
    let failed = guards::failures(&checks, &misses);
    if !failed.is_empty() {
        anyhow::bail!(
            "{} accuracy guards do not hold ({}):\n  {}",
            failed.len(),
            guards::PATH,
            failed.join("\n  ")
        );
    }
    Ok(())
}
