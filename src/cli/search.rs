//! `parsim search`: rank every valid parallel mix for a model and a GPU count.

use super::config_args::{SourceArgs, TrainingArgs, WorkloadArgs};
use super::ranked::{cancel_on_ctrl_c, csv_fields, nvlink_domain_lines, CSV_COLUMNS};
use super::row_command::{commands_text, write_configs, UserFlags};
use super::search_range::Output;
use super::Outcome;
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parsim::report::csv::Csv;
use parsim::report::format::{gib, seconds};
use parsim::report::table;
use parsim::search::{
    parse_deadline_s, search, search_by_memory_p90, search_by_p90, Objective, ObjectiveError,
    RankBy, Ranked, SearchRequest, SearchSpec, POOL,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Search the parallel mix: the configuration file, model, cluster and training settings are
/// kept; the file's parallel section is searched.
#[derive(Debug, Args)]
pub struct SearchArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Training settings kept for every candidate; `--recompute` limits the search to that
    /// recomputation.
    #[command(flatten)]
    pub training: TrainingArgs,
    /// Largest micro batch size tried (powers of two from 1, and this value if it is not one).
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
    /// Print `{candidates, pruned, evaluated, elapsed_s, top: [estimates]}` as JSON (with a
    /// GPU range: `{range, smallest_fitting_gpus, points: [{gpus, best}]}`).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print the ranking (with a GPU range: the best mix per count) as CSV, numbers unrounded.
    #[arg(long)]
    pub csv: bool,
    /// With --gpus LOW..HIGH: draw the best step time and tokens/s against GPUs as a PNG.
    #[arg(long, value_name = "FILE")]
    pub png: Option<std::path::PathBuf>,
    /// With --train-tokens: rank by the run's wall time (time), cost (needs --gpu-hour-price)
    /// or energy, showing the run columns; without it only time (step time) is accepted.
    #[arg(long, value_name = "time|cost|energy")]
    pub objective: Option<String>,
    /// With --train-tokens (and --gpus LOW..HIGH): the cheapest cluster and mix (by cost when
    /// priced, else the fewest GPUs) that trains the tokens within this, such as 60d or 36h.
    #[arg(long, value_name = "DAYSd|HOURSh")]
    pub deadline: Option<String>,
    /// Rank by the predicted step time (step), by the upper end of its interval (p90, the
    /// pessimistic figure: a mix whose regime the model has missed by more ranks lower), or
    /// by the pessimistic peak memory (memory-p90: the most room left at p90 first).
    #[arg(long, value_name = "step|p90|memory-p90", default_value = "step")]
    pub rank_by: String,
    /// Take the step-time intervals from this residual file instead of the shipped one
    /// (calibration/residuals.json's format).
    #[arg(long, value_name = "FILE")]
    pub residuals: Option<std::path::PathBuf>,
    /// Rank every pipeline schedule, also those the configuration's framework does not run
    /// (Megatron-Core runs 1f1b and interleaved-1f1b only; docs/planning.md).
    #[arg(long)]
    pub all_schedules: bool,
    /// Write each top row's whole configuration to DIR/rank-NN.toml: `parsim estimate --config
    /// DIR/rank-01.toml` gives row 1's figures, as its printed command does.
    #[arg(long, value_name = "DIR")]
    pub write_configs: Option<std::path::PathBuf>,
}

/// A row's run columns (wall days, cost) when the search has a token budget.
fn run_cells(r: &Ranked) -> Option<Vec<String>> {
    let run = parsim::report::contract::run_of(&r.estimate)
        .ok()
        .flatten()?;
    Some(vec![
        format!("{:.2}", run.wall_days),
        run.cost_usd.map_or("-".to_string(), |c| format!("{c:.0}")),
    ])
}

fn row(i: usize, r: &Ranked, with_run: bool) -> Vec<String> {
    let e = &r.estimate;
    let mut cells = vec![
        (i + 1).to_string(),
        r.label.clone(),
        seconds(e.time.step_s),
        format!(
            "{} - {}",
            seconds(e.time.step_s_p10),
            seconds(e.time.step_s_p90)
        ),
        format!("{:.0}", e.throughput.tokens_per_s),
        format!("{:.1}%", 100.0 * e.throughput.mfu),
        gib(e.memory.per_gpu_max_bytes),
    ];
    if with_run {
        cells.extend(run_cells(r).unwrap_or_else(|| vec!["-".into(), "-".into()]));
    }
    cells.push(e.verdict.split(':').next().unwrap_or("").to_string());
    cells
}

/// A table of ranked mixes; with a token budget (`--train-tokens`), each row's run too.
fn ranked_table(title: &str, rows: &[Ranked], with_run: bool) -> String {
    let mut header = vec!["#", title, "step", "p10 - p90", "tokens/s", "MFU", "GiB"];
    if with_run {
        header.extend(["wall days", "cost $"]);
    }
    header.push("bound by");
    let mut t = table::table(&header);
    for (i, r) in rows.iter().enumerate() {
        t.add_row(row(i, r, with_run));
    }
    t.to_string()
}

/// `--objective` and `--deadline`, parsed and checked against the token budget.
fn run_flags(
    args: &SearchArgs,
    base: &parsim::config::Config,
) -> anyhow::Result<(Option<Objective>, Option<f64>)> {
    let objective = args
        .objective
        .as_deref()
        .map(Objective::parse)
        .transpose()?;
    let deadline_s = args.deadline.as_deref().map(parse_deadline_s).transpose()?;
    if deadline_s.is_some() && base.run.train_tokens.is_none() {
        return Err(ObjectiveError::DeadlineNoTokens.into());
    }
    // The deadline answers the cheapest cluster: by cost when priced, else the fewest GPUs.
    if let (Some(o), Some(_)) = (objective, deadline_s) {
        if o != Objective::Cost {
            anyhow::bail!("--objective {}: with --deadline the answer is the cheapest cluster that finishes (by cost with --gpu-hour-price, else the fewest GPUs); give --objective cost or leave --objective out", o.as_str());
        }
    }
    Ok((objective, deadline_s))
}

/// `--rank-by` (p90 ranks one GPU count, without a run objective) and the residual model the
/// intervals come from (`--residuals`, else the shipped one).
fn interval_flags(
    args: &SearchArgs,
    by_run: bool,
) -> anyhow::Result<(RankBy, parsim::interval::IntervalModel)> {
    let rank_by = RankBy::parse(&args.rank_by)?;
    if rank_by == RankBy::P90 && (by_run || args.workload.gpu_range().is_some()) {
        anyhow::bail!("--rank-by p90 ranks the mixes of one GPU count by their upper step time: not with --objective, --deadline or --gpus LOW..HIGH");
    }
    if rank_by == RankBy::MemoryP90 && (by_run || args.workload.gpu_range().is_some()) {
        anyhow::bail!("--rank-by memory-p90 ranks the mixes of one GPU count by their pessimistic peak memory: not with --objective, --deadline or --gpus LOW..HIGH");
    }
    let model = match &args.residuals {
        Some(path) => super::estimate::interval_model(path)?,
        None => parsim::interval::shipped()?.clone(),
    };
    Ok((rank_by, model))
}

pub fn run(args: SearchArgs) -> anyhow::Result<Outcome> {
    let base = args
        .workload
        .load(&args.source, &args.training)?
        .with_profile_defaults()?;
    let (objective, deadline_s) = run_flags(&args, &base)?;
    let (rank_by, model) = interval_flags(&args, objective.is_some() || deadline_s.is_some())?;
    let mut constraints = args.constraints.clone();
    if let Some(r) = args.training.recompute {
        constraints.push(format!("recompute={}", r.as_str()));
    }
    let request = SearchRequest {
        mbs_max: args.mbs_max,
        top: args.top,
        constraints,
        exhaustive: args.exhaustive,
        all_schedules: args.all_schedules,
    };
    let (mut spec, schedules_note) = request.spec(base)?;
    if let Some(o) = objective {
        o.check(&spec)?;
    }
    let user = UserFlags::of_search();
    if let Some(d) = deadline_s {
        let counts = args
            .workload
            .gpu_range()
            .map_or(vec![spec.base.cluster.num_gpus], |r| r.counts());
        return super::search_objective::deadline(&spec, &counts, d, args.json, &user);
    }
    // A run objective ranks a wider pool of the fastest mixes by step time.
    let by_run = objective.filter(|_| spec.base.run.train_tokens.is_some());
    if by_run.is_some() {
        if args.workload.gpu_range().is_some() || args.csv || args.png.is_some() {
            anyhow::bail!("--objective with --train-tokens ranks one GPU count as a table or --json: give --deadline for a range of --gpus; --csv and --png are not offered");
        }
        spec.top = args.top.max(POOL);
    }
    if let Some(range) = args.workload.gpu_range() {
        let output = Output {
            json: args.json,
            csv: args.csv,
            png: args.png.as_deref(),
        };
        return super::search_range::run(&spec, range, &output, &user);
    }
    if args.png.is_some() {
        anyhow::bail!("--png draws a sweep over GPU counts: give --gpus LOW..HIGH");
    }
    let mut result = search_with_progress(&spec, rank_by, &model)?;
    // Estimates carry the shipped model's intervals; another file's replaces them.
    if args.residuals.is_some() {
        for r in result
            .top
            .iter_mut()
            .chain(&mut result.best_per_schedule)
            .chain(&mut result.best_per_zero)
        {
            r.estimate.use_interval_model(&model);
        }
    }
    if let Some(o) = by_run {
        return super::search_objective::print_ranked(&spec, result, o, args.top, args.json, &user);
    }
    user.fill(
        result
            .top
            .iter_mut()
            .chain(&mut result.best_per_schedule)
            .chain(&mut result.best_per_zero),
        &spec.base,
    );
    if let Some(dir) = &args.write_configs {
        let files = write_configs(dir, "rank", &result.top)?;
        eprintln!(
            "wrote {} configurations to {} (rank-01.toml is row 1)",
            files.len(),
            dir.display()
        );
    }

    let outcome = if result.interrupted {
        // Exit status 130 once the partial results are printed, so scripts do not take them
        // for a full answer.
        eprintln!("search interrupted: the results below cover only the mixes evaluated");
        Outcome::Interrupted
    } else if result.top.is_empty() {
        Outcome::DoesNotFit
    } else {
        Outcome::Ok
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(outcome);
    }
    if args.csv {
        let mut csv = Csv::new(&[&["rank"], CSV_COLUMNS].concat());
        for (i, r) in result.top.iter().enumerate() {
            csv.row(std::iter::once((i + 1).to_string()).chain(csv_fields(r)));
        }
        print!("{}", csv.finish());
        return Ok(outcome);
    }
    let best = result
        .top
        .first()
        .and_then(|r| super::evidence::published_best(&r.estimate.gpu));
    print_text(
        &spec,
        &result,
        rank_by,
        best.as_ref(),
        schedules_note.as_deref(),
    );
    Ok(outcome)
}

/// Runs the search (ranked by `rank_by`) with a progress bar on stderr that appears once it
/// has run for a second, stopping early on Ctrl-C with what was evaluated.
fn search_with_progress(
    spec: &SearchSpec,
    rank_by: RankBy,
    model: &parsim::interval::IntervalModel,
) -> anyhow::Result<parsim::search::SearchResult> {
    let cancel = cancel_on_ctrl_c();
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
    let result = match rank_by {
        RankBy::P90 => search_by_p90(spec, model, &progress, &cancel)?,
        RankBy::MemoryP90 => search_by_memory_p90(spec, &progress, &cancel)?,
        RankBy::Step => search(spec, &progress, &cancel)?,
    };
    bar.finish_and_clear();
    Ok(result)
}

/// The search's tables: the header, what was pruned, the top mixes (by `rank_by`) with the
/// command of each row and how far the model tells them apart, the best per schedule and per
/// ZeRO stage, and the leader's verdict. With a token budget each row shows its run.
fn print_text(
    spec: &SearchSpec,
    result: &parsim::search::SearchResult,
    rank_by: RankBy,
    best: Option<&parsim::report::confidence::PublishedBest>,
    schedules_note: Option<&str>,
) {
    let p = &result.pruned;
    let m = &spec.base.model;
    let budget = spec.base.run.train_tokens.map_or(String::new(), |t| {
        format!(", {} tokens", parsim::report::run_table::tokens(t))
    });
    println!(
        "search: {} on {} x {} ({} per node), seq {}, global batch {}{budget}",
        m.name,
        spec.base.cluster.num_gpus,
        spec.base.cluster.gpu,
        spec.base.cluster.per_node(),
        spec.base.training.seq_length,
        spec.base.training.global_batch_size
    );
    for line in nvlink_domain_lines(&spec.base.cluster, true) {
        println!("{line}");
    }
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
    if let Some(note) = schedules_note {
        println!("{note}");
    }
    if result.top.is_empty() {
        match &result.no_fit {
            Some(n) => print!("{}", parsim::report::no_fit::no_fit_text(n)),
            None => println!("no mix fits"),
        }
        return;
    }
    let with_run = spec.base.run.train_tokens.is_some();
    println!(
        "\ntop {} by {}{}\n{}",
        result.top.len(),
        match rank_by {
            RankBy::Step => "step time",
            RankBy::P90 => "upper step time (p90)",
            RankBy::MemoryP90 => "pessimistic peak memory (p90)",
        },
        if with_run {
            " (the run's wall days and cost beside; --objective time|cost|energy ranks by them)"
        } else {
            ""
        },
        ranked_table("mix", &result.top, with_run)
    );
    for line in parsim::report::confidence::ranking_lines(&result.top, best) {
        println!("{line}");
    }
    print!("{}", commands_text(&result.top, &spec.base));
    println!(
        "\nbest per schedule\n{}",
        ranked_table("mix", &result.best_per_schedule, with_run)
    );
    print!("{}", commands_text(&result.best_per_schedule, &spec.base));
    println!(
        "\nbest per ZeRO stage\n{}",
        ranked_table("mix", &result.best_per_zero, with_run)
    );
    print!("{}", commands_text(&result.best_per_zero, &spec.base));
    println!("\nverdict for #1: {}", result.top[0].estimate.verdict);
}
