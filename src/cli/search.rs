//! `parsim search`: rank every valid parallel mix for a model and a GPU count.

use super::config_args::{SourceArgs, WorkloadArgs};
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parsim::report::format::{gib, seconds};
use parsim::report::table;
use parsim::search::{search, Constraint, Ranked, SearchSpec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Search the parallel mix: the configuration file, model, cluster and training settings are
/// kept; the file's parallel section is searched.
#[derive(Debug, Args)]
pub struct SearchArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Largest micro batch size tried (powers of two from 1).
    #[arg(long, default_value_t = 4)]
    pub mbs_max: u64,
    /// How many mixes to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Filters such as `tp<=4`, `pp=1`, `schedule!=gpipe` (repeatable).
    #[arg(long = "constraint", value_name = "KNOB OP VALUE")]
    pub constraints: Vec<String>,
    /// Simulate every candidate that may fit instead of skipping those whose step-time lower
    /// bound cannot beat the leaders (slower; the same answer).
    #[arg(long)]
    pub exhaustive: bool,
    /// Print `{candidates, pruned, evaluated, elapsed_s, top: [estimates]}` as JSON.
    #[arg(long)]
    pub json: bool,
}

fn row(i: usize, r: &Ranked) -> Vec<String> {
    let e = &r.estimate;
    vec![
        (i + 1).to_string(),
        r.mix.to_string(),
        seconds(e.time.step_s),
        format!("{:.0}", e.throughput.tokens_per_s),
        format!("{:.1}%", 100.0 * e.throughput.mfu),
        gib(e.memory.per_gpu_max_bytes),
        e.verdict.split(':').next().unwrap_or("").to_string(),
    ]
}

fn ranked_table(title: &str, rows: &[Ranked]) -> String {
    let mut t = table::table(&["#", title, "step", "tokens/s", "MFU", "GiB", "bound by"]);
    for (i, r) in rows.iter().enumerate() {
        t.add_row(row(i, r));
    }
    t.to_string()
}

pub fn run(args: SearchArgs) -> anyhow::Result<()> {
    let base = args.workload.load(&args.source)?;
    let constraints = args
        .constraints
        .iter()
        .map(|c| Constraint::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = SearchSpec {
        base,
        mbs_max: args.mbs_max,
        top: args.top,
        constraints,
        exhaustive: args.exhaustive,
    };

    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = Arc::clone(&cancel);
        // A second handler cannot be installed (e.g. in tests running in one process): ignore.
        drop(ctrlc::set_handler(move || {
            cancel.store(true, Ordering::Relaxed);
        }));
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} searching [{bar:40}] {pos}/{len} mixes ({per_sec}, eta {eta})",
        )
        .context("progress template")?
        .progress_chars("=> "),
    );
    let started = Instant::now();
    let shown = AtomicBool::new(false);
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
        // The bar appears once a search has run for a second; the first thread there shows it.
        if started.elapsed() > Duration::from_secs(1) && !shown.swap(true, Ordering::Relaxed) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    };
    let result = search(&spec, &progress, &cancel)?;
    bar.finish_and_clear();

    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        exit_if_interrupted(&result);
        return Ok(());
    }
    let p = &result.pruned;
    let m = &spec.base.model;
    println!(
        "search: {} on {} x {} ({} per node), seq {}, global batch {}",
        m.name,
        spec.base.cluster.num_gpus,
        spec.base.cluster.gpu,
        spec.base.cluster.gpus_per_node,
        spec.base.training.seq_length,
        spec.base.training.global_batch_size
    );
    println!(
        "{} candidates: {} by constraints, {} invalid, {} cannot fit even with one microbatch in flight, {} cannot beat the leaders (step-time lower bound), {} simulated ({} of them do not fit) in {:.2} s ({:.0} candidates/s){}",
        result.candidates,
        p.constraint,
        p.invalid,
        p.memory_bound,
        p.time_bound,
        result.evaluated,
        p.memory,
        result.elapsed_s,
        result.candidates as f64 / result.elapsed_s.max(1e-9),
        if result.interrupted { " -- INTERRUPTED, partial results" } else { "" }
    );
    if result.top.is_empty() {
        println!("no mix fits: more GPUs, a GPU with more memory, or a shorter sequence");
        exit_if_interrupted(&result);
        return Ok(());
    }
    println!(
        "\ntop {} by step time\n{}",
        result.top.len(),
        ranked_table("mix", &result.top)
    );
    println!(
        "\nbest per schedule\n{}",
        ranked_table("mix", &result.best_per_schedule)
    );
    println!(
        "\nbest per ZeRO stage\n{}",
        ranked_table("mix", &result.best_per_zero)
    );
    println!("\nverdict for #1: {}", result.top[0].estimate.verdict);
    exit_if_interrupted(&result);
    Ok(())
}

/// Exit status 130 (the shell's code for SIGINT) once an interrupted search has printed
/// what it found, so scripts do not take partial results for a full answer.
fn exit_if_interrupted(result: &parsim::search::SearchResult) {
    if result.interrupted {
        use std::io::Write;
        // Nothing to do if stdout is gone: the exit status still tells.
        std::io::stdout().flush().ok();
        eprintln!("search interrupted: the results above cover only the mixes evaluated");
        std::process::exit(130);
    }
}
