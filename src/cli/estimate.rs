//! `parsim estimate`: parameters, FLOPs, memory, communication and step time of one configuration.

use super::config_args::{ConfigArgs, MicroBatch};
use super::Outcome;
use clap::Args;
use parsim::estimate::Estimate;
use parsim::report::format::gib;

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the JSON object of docs/design.md's output contract instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print the configuration as a Megatron-LM launch (torchrun ... pretrain_gpt.py with its
    /// flags) instead of estimating; `--megatron-args` reads it back.
    #[arg(long, conflicts_with = "json")]
    pub print_megatron_args: bool,
    /// Take the step-time interval from this residual file (the format of
    /// calibration/residuals.json, e.g. one built from your own measured runs) instead of the
    /// shipped one.
    #[arg(long, value_name = "FILE")]
    pub residuals: Option<std::path::PathBuf>,
}

/// The residual model in `path`, read and validated.
pub fn interval_model(path: &std::path::Path) -> anyhow::Result<parsim::interval::IntervalModel> {
    let file = parsim::interval::ResidualFile::read(path)?;
    Ok(parsim::interval::IntervalModel::new(&file)?)
}

pub fn run(args: EstimateArgs) -> anyhow::Result<Outcome> {
    if args.print_megatron_args {
        let resolved = args.config.resolve()?;
        // DP is derived from the GPU count on both sides; the resolved value is not a setting.
        let mut config = resolved.config;
        config.parallel.dp = None;
        print!("{}", parsim::config::megatron::to_megatron_args(&config));
        return Ok(Outcome::Ok);
    }
    let model = args.residuals.as_deref().map(interval_model).transpose()?;
    let (mut est, note) = if args.config.mbs == Some(MicroBatch::Max) {
        let (est, note) = largest_fitting_mbs(&args.config)?;
        (est, Some(note))
    } else {
        (parsim::estimate::estimate(&args.config.resolve()?)?, None)
    };
    if let Some(m) = &model {
        est.use_interval_model(m);
    }
    let run = parsim::report::contract::run_of(&est)?;
    if args.json {
        println!(
            "{}",
            parsim::report::contract::with_run_json(&est, run.as_ref())?
        );
        if let Some(note) = &note {
            eprintln!("note: {note}");
        }
    } else {
        print!("{}", parsim::report::table::estimate_text(&est));
        let best = super::evidence::published_best(&est.gpu);
        for line in parsim::report::confidence::estimate_lines(&est, best.as_ref()) {
            println!("{line}");
        }
        if let Some(note) = &note {
            println!("{note}");
        }
        if let Some(run) = &run {
            print!("\n{}", parsim::report::run_table::run_text(run));
        }
    }
    Ok(if est.memory.fits {
        Outcome::Ok
    } else {
        Outcome::DoesNotFit
    })
}

/// `--mbs max`: tries every micro batch that divides the batch per data-parallel replica, from
/// 1 up, until one does not fit (memory grows with the micro batch); returns the estimate of
/// the largest that fits (of micro batch 1 when none does) and a line saying what was found.
fn largest_fitting_mbs(config: &ConfigArgs) -> anyhow::Result<(Estimate, String)> {
    let first = config.with_mbs(1).resolve()?;
    let per_replica = first.config.training.global_batch_size / u64::from(first.dp.max(1));
    let mut best = parsim::estimate::estimate(&first)?;
    if !best.memory.fits {
        let note = format!(
            "no micro batch fits: micro batch 1 needs {} GiB of {} GiB usable",
            gib(best.memory.per_gpu_max_bytes),
            gib(best.memory.usable_bytes)
        );
        return Ok((best, note));
    }
    let mut stopped = None;
    for mbs in (2..=per_replica).filter(|b| per_replica % b == 0) {
        // A micro batch a schedule rule refuses is skipped, not an error.
        let Ok(r) = config.with_mbs(mbs).resolve() else {
            continue;
        };
        let e = parsim::estimate::estimate(&r)?;
        if !e.memory.fits {
            stopped = Some((mbs, e.memory.per_gpu_max_bytes, e.memory.usable_bytes));
            break;
        }
        best = e;
    }
    let chosen = best.config.training.micro_batch_size;
    let note = match stopped {
        Some((mbs, need, usable)) => format!(
            "largest micro batch that fits: {chosen} (micro batch {mbs} needs {} GiB of {} GiB usable)",
            gib(need),
            gib(usable)
        ),
        None => format!(
            "largest micro batch that fits: {chosen} (the whole batch per replica, {per_replica})"
        ),
    };
    Ok((best, note))
}
