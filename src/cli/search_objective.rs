//! `parsim search --objective time|cost|energy --train-tokens N` (the mixes ranked by their
//! run) and `search --gpus LOW..HIGH --train-tokens N --deadline 60d` (the cheapest cluster and
//! mix that finishes by the deadline).

use super::ranked::cancel_on_ctrl_c;
use super::row_command::{commands_text, UserFlags};
use super::Outcome;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use parsim::report::format::{gib, seconds};
use parsim::report::table;
use parsim::search::{
    deadline_search, rank_result, DeadlineAnswer, DeadlinePoint, Objective, ObjectiveResult,
    SearchResult, SearchSpec,
};

/// The run columns of one ranked mix: wall days, then cost or energy (when known).
fn run_cells(r: &parsim::search::RunRanked) -> Vec<String> {
    let e = &r.ranked.estimate;
    vec![
        r.ranked.label.clone(),
        seconds(e.time.step_s),
        format!("{:.1}%", 100.0 * e.throughput.mfu),
        gib(e.memory.per_gpu_max_bytes),
        format!("{:.3}", r.run.wall_days),
        r.run
            .cost_usd
            .map_or("-".to_string(), |c| format!("{c:.0}")),
        r.run
            .energy_mwh
            .map_or("-".to_string(), |m| format!("{m:.3}")),
    ]
}

const RUN_HEADER: [&str; 7] = [
    "mix",
    "step",
    "MFU",
    "GiB",
    "wall days",
    "cost $",
    "energy MWh",
];

/// Prints a search's fitting mixes re-ranked by `objective`.
pub fn print_ranked(
    spec: &SearchSpec,
    result: SearchResult,
    objective: Objective,
    top: usize,
    json: bool,
    user: &UserFlags,
) -> anyhow::Result<Outcome> {
    let interrupted = result.interrupted;
    let no_fit = result.no_fit.clone();
    let mut r: ObjectiveResult = rank_result(spec, result, objective, top)?;
    user.fill(r.top.iter_mut().map(|x| &mut x.ranked), &spec.base);
    let outcome = if interrupted {
        Outcome::Interrupted
    } else if r.top.is_empty() {
        Outcome::DoesNotFit
    } else {
        Outcome::Ok
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(outcome);
    }
    let m = &spec.base.model;
    println!(
        "search: {} on {} x {}, seq {}, global batch {}, {} tokens; ranked by {} of the {} fastest mixes by step time",
        m.name,
        spec.base.cluster.num_gpus,
        spec.base.cluster.gpu,
        spec.base.training.seq_length,
        spec.base.training.global_batch_size,
        parsim::report::run_table::tokens(spec.base.run.train_tokens.unwrap_or(0)),
        objective.as_str(),
        spec.top
    );
    if r.top.is_empty() {
        match &no_fit {
            Some(n) => print!("{}", parsim::report::no_fit::no_fit_text(n)),
            None => println!("no mix fits"),
        }
        return Ok(outcome);
    }
    let mut header = vec!["#"];
    header.extend(RUN_HEADER);
    let mut t = table::table(&header);
    for (i, x) in r.top.iter().enumerate() {
        let mut row = vec![(i + 1).to_string()];
        row.extend(run_cells(x));
        t.add_row(row);
    }
    println!("{t}");
    let rows: Vec<parsim::search::Ranked> = r.top.iter().map(|x| x.ranked.clone()).collect();
    print!("{}", commands_text(&rows, &spec.base));
    Ok(outcome)
}

fn point_line(p: &DeadlinePoint) -> String {
    match &p.best {
        Some(b) => {
            let cost = b
                .run
                .cost_usd
                .map_or(String::new(), |c| format!(", ${c:.0}"));
            format!(
                "{} GPUs, {}: {:.2} days{cost}",
                p.gpus, b.ranked.label, b.run.wall_days
            )
        }
        None => format!("{} GPUs: no mix fits", p.gpus),
    }
}

/// Searches each count of `counts` and prints the deadline's answer.
pub fn deadline(
    spec: &SearchSpec,
    counts: &[u32],
    deadline_s: f64,
    json: bool,
    user: &UserFlags,
) -> anyhow::Result<Outcome> {
    let cancel = cancel_on_ctrl_c();
    let bar = ProgressBar::new(counts.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} searching [{bar:40}] {pos}/{len} GPU counts")
            .context("progress template")?
            .progress_chars("=> "),
    );
    let progress = |i: usize, _n: usize| bar.set_position(i as u64);
    let mut a: DeadlineAnswer = deadline_search(spec, counts, deadline_s, &progress, &cancel)?;
    let points = a
        .points
        .iter_mut()
        .chain(a.answer.as_mut())
        .chain(a.closest.as_mut());
    user.fill(
        points.filter_map(|p| p.best.as_mut().map(|b| &mut b.ranked)),
        &spec.base,
    );
    bar.finish_and_clear();
    let outcome = if a.interrupted {
        Outcome::Interrupted
    } else if a.answer.is_none() {
        Outcome::DoesNotFit
    } else {
        Outcome::Ok
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&a)?);
        return Ok(outcome);
    }
    let m = &spec.base.model;
    println!(
        "deadline: {} for {} tokens on {} within {:.2} days, cheapest by {}; GPU counts: {:?}",
        m.name,
        parsim::report::run_table::tokens(spec.base.run.train_tokens.unwrap_or(0)),
        spec.base.cluster.gpu,
        a.deadline_days,
        a.cheapest_by,
        counts
    );
    let mut header = vec!["GPUs"];
    header.extend(RUN_HEADER);
    header.push("finishes");
    let mut t = table::table(&header);
    for p in &a.points {
        let mut row = vec![p.gpus.to_string()];
        match &p.best {
            Some(b) => row.extend(run_cells(b)),
            None => row.push("no mix fits".to_string()),
        }
        if p.best.is_some() {
            row.push(if p.finishes { "yes" } else { "no" }.to_string());
        }
        t.add_row(row);
    }
    println!("{t}");
    match (&a.answer, &a.closest, a.miss_days) {
        (Some(p), _, _) => {
            println!("cheapest that finishes: {}", point_line(p));
            if let Some(c) = p.best.as_ref().and_then(|b| b.ranked.command.as_ref()) {
                println!("  as a command: {c}");
            }
        }
        (None, Some(c), Some(miss)) => println!(
            "none finishes by the deadline; the closest is {}, {miss:.2} days late",
            point_line(c)
        ),
        _ => println!("none finishes: no mix fits at any GPU count tried"),
    }
    Ok(outcome)
}
