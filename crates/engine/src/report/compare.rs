//! Side-by-side comparison of estimates (`parsim compare`): memory of the most loaded GPU by
//! category, the step-time breakdown and throughput, one row per quantity, with the values
//! that differ from the first configuration marked.

use super::csv::Csv;
use super::format::seconds;
use super::table::{right_align, table};
use crate::estimate::Estimate;
use crate::memory::StageMemory;
use serde::Serialize;

const GIB: f64 = (1u64 << 30) as f64;

/// How a quantity is shown in the text table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Bytes, shown in GiB.
    Bytes,
    Seconds,
    TokensPerS,
    TflopsPerGpu,
    /// A fraction, shown as a percentage.
    Fraction,
    /// 1 = yes, 0 = no.
    Flag,
}

/// One compared quantity: its value in each configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    pub section: &'static str,
    pub name: &'static str,
    pub unit: Unit,
    pub values: Vec<f64>,
    /// True when some value differs from the first configuration's by more than 0.05%.
    pub differs: bool,
}

/// The comparison (`parsim compare --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub labels: Vec<String>,
    /// Each configuration's parallel mix, in one line.
    pub mixes: Vec<String>,
    pub metrics: Vec<Metric>,
    pub estimates: Vec<Estimate>,
}

/// The most loaded pipeline stage's memory.
fn worst_stage(e: &Estimate) -> StageMemory {
    e.memory
        .stages
        .iter()
        .max_by_key(|s| s.total)
        .copied()
        .unwrap_or_default()
}

/// The parallel mix and training settings in one line.
pub fn mix_line(e: &Estimate) -> String {
    let p = &e.config.parallel;
    let t = &e.config.training;
    format!(
        "tp{}{} cp{} pp{}x{} {} dp{} ep{} zero{} mbs{} {} on {} x {}",
        p.tp,
        if p.sp { "+sp" } else { "" },
        p.cp,
        p.pp,
        p.vpp,
        p.schedule,
        p.dp.unwrap_or(0),
        p.ep,
        p.zero,
        t.micro_batch_size,
        t.recompute,
        e.config.cluster.num_gpus,
        e.gpu
    )
}

fn differs(values: &[f64]) -> bool {
    let first = values.first().copied().unwrap_or(0.0);
    values
        .iter()
        .any(|v| (v - first).abs() > 5e-4 * first.abs().max(v.abs()).max(f64::MIN_POSITIVE))
}

/// Compares `estimates` (labelled by `labels`).
pub fn compare(labels: Vec<String>, estimates: Vec<Estimate>) -> Comparison {
    type Get = fn(&Estimate, &StageMemory) -> f64;
    let rows: [(&str, &str, Unit, Get); 26] = [
        ("memory", "weights", Unit::Bytes, |_, s| s.weights as f64),
        ("memory", "gradients", Unit::Bytes, |_, s| {
            s.gradients as f64
        }),
        ("memory", "optimizer", Unit::Bytes, |_, s| {
            s.optimizer as f64
        }),
        ("memory", "activations", Unit::Bytes, |_, s| {
            s.activations as f64
        }),
        ("memory", "buffers", Unit::Bytes, |_, s| s.buffers as f64),
        ("memory", "total (most loaded GPU)", Unit::Bytes, |e, _| {
            e.memory.per_gpu_max_bytes as f64
        }),
        ("memory", "usable", Unit::Bytes, |e, _| {
            e.memory.usable_bytes as f64
        }),
        ("memory", "fits", Unit::Flag, |e, _| {
            f64::from(u8::from(e.memory.fits))
        }),
        ("time", "step", Unit::Seconds, |e, _| e.time.step_s),
        ("time", "  interval low (p10)", Unit::Seconds, |e, _| {
            e.time.step_s_p10
        }),
        ("time", "  interval high (p90)", Unit::Seconds, |e, _| {
            e.time.step_s_p90
        }),
        ("time", "compute", Unit::Seconds, |e, _| e.time.compute_s),
        ("time", "exposed communication", Unit::Seconds, |e, _| {
            e.time.exposed_comm_s
        }),
        ("time", "pipeline bubble", Unit::Seconds, |e, _| {
            e.time.bubble_s
        }),
        ("time", "  warm-up/cool-down", Unit::Seconds, |e, _| {
            e.time.warmup_cooldown_s
        }),
        ("time", "  stage imbalance", Unit::Seconds, |e, _| {
            e.time.imbalance_s
        }),
        ("time", "  send/receive waits", Unit::Seconds, |e, _| {
            e.time.pp_wait_s
        }),
        ("time", "data-parallel tail", Unit::Seconds, |e, _| {
            e.time.dp_tail_s
        }),
        ("time", "optimizer", Unit::Seconds, |e, _| {
            e.time.optimizer_s
        }),
        ("throughput", "tokens/s", Unit::TokensPerS, |e, _| {
            e.throughput.tokens_per_s
        }),
        (
            "throughput",
            "  interval low (p10)",
            Unit::TokensPerS,
            |e, _| e.throughput.tokens_per_s_p10,
        ),
        (
            "throughput",
            "  interval high (p90)",
            Unit::TokensPerS,
            |e, _| e.throughput.tokens_per_s_p90,
        ),
        (
            "throughput",
            "TFLOP/s per GPU",
            Unit::TflopsPerGpu,
            |e, _| e.throughput.tflops_per_gpu,
        ),
        ("throughput", "MFU", Unit::Fraction, |e, _| e.throughput.mfu),
        (
            "throughput",
            "  MFU interval low (p10)",
            Unit::Fraction,
            |e, _| e.throughput.mfu_p10,
        ),
        (
            "throughput",
            "  MFU interval high (p90)",
            Unit::Fraction,
            |e, _| e.throughput.mfu_p90,
        ),
    ];
    let stages: Vec<StageMemory> = estimates.iter().map(worst_stage).collect();
    let metrics = rows
        .iter()
        .map(|&(section, name, unit, get)| {
            let values: Vec<f64> = estimates
                .iter()
                .zip(&stages)
                .map(|(e, s)| get(e, s))
                .collect();
            Metric {
                section,
                name,
                unit,
                differs: differs(&values),
                values,
            }
        })
        .collect();
    Comparison {
        labels,
        mixes: estimates.iter().map(mix_line).collect(),
        metrics,
        estimates,
    }
}

fn show(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Bytes => format!("{:.2} GiB", v / GIB),
        Unit::Seconds => seconds(v),
        Unit::TokensPerS => format!("{v:.0}"),
        Unit::TflopsPerGpu => format!("{v:.1}"),
        Unit::Fraction => format!("{:.1}%", 100.0 * v),
        Unit::Flag => if v != 0.0 { "yes" } else { "NO" }.to_string(),
    }
}

/// A value with its change from the first configuration's, e.g. `3.1 s (+12.0%)`.
fn cell(unit: Unit, first: f64, v: f64, column: usize) -> String {
    let text = show(unit, v);
    if column == 0 || unit == Unit::Flag || (v - first).abs() <= 5e-4 * first.abs().max(v.abs()) {
        return text;
    }
    if first == 0.0 {
        return format!("{text} (new)");
    }
    format!("{text} ({:+.1}%)", 100.0 * (v - first) / first)
}

/// The short name of column `i` in the text table: A, B, ..., Z, AA, AB, ...
pub fn column_letter(i: usize) -> String {
    let mut n = i + 1;
    let mut out = Vec::new();
    while n > 0 {
        let r = (n - 1) % 26;
        out.push(b'A' + r as u8);
        n = (n - 1) / 26;
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII letters")
}

/// `(A, C)` for the columns `idx`, or nothing when they are all of `n` columns.
pub fn columns_of(idx: &[usize], n: usize) -> String {
    if idx.len() == n {
        return String::new();
    }
    let names: Vec<String> = idx.iter().map(|&i| column_letter(i)).collect();
    format!(" ({})", names.join(", "))
}

/// The parallel mix, one row per setting: the columns stay as narrow as their numbers.
fn mix_rows(e: &Estimate) -> Vec<(&'static str, String)> {
    let p = &e.config.parallel;
    let t = &e.config.training;
    vec![
        ("GPUs", format!("{} x {}", e.config.cluster.num_gpus, e.gpu)),
        ("tp", format!("{}{}", p.tp, if p.sp { " +sp" } else { "" })),
        (
            "cp",
            format!(
                "{} {}",
                p.cp,
                if p.cp > 1 { p.cp_comm.as_str() } else { "" }
            )
            .trim_end()
            .to_string(),
        ),
        ("pp x vpp", format!("{} x {}", p.pp, p.vpp)),
        ("schedule", p.schedule.to_string()),
        ("dp", p.dp.unwrap_or(0).to_string()),
        ("ep", p.ep.to_string()),
        ("zero", p.zero.to_string()),
        ("micro batch", t.micro_batch_size.to_string()),
        ("recompute", t.recompute.to_string()),
    ]
}

/// Groups `lines` (one per column) by their text: each distinct text once, with the columns
/// that have it.
pub fn grouped_lines(lines: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        match out.iter_mut().find(|(t, _)| t == l) {
            Some((_, idx)) => idx.push(i),
            None => out.push((l.clone(), vec![i])),
        }
    }
    out
}

/// The comparison as a text table: the columns are lettered (A, B, ...) and listed with their
/// files or flags above it, the parallel mix takes one row per setting, rows that differ start
/// with `*`, and each value after the first configuration's carries its relative change. A
/// verdict that several columns share is printed once.
pub fn text(c: &Comparison) -> String {
    let letters: Vec<String> = (0..c.labels.len()).map(column_letter).collect();
    let mut out = String::from("columns:\n");
    for (l, label) in letters.iter().zip(&c.labels) {
        out.push_str(&format!("  {l}  {label}\n"));
    }
    let mut header = vec!["", "quantity"];
    header.extend(letters.iter().map(String::as_str));
    let mut t = table(&header);
    let mixes: Vec<Vec<(&str, String)>> = c.estimates.iter().map(mix_rows).collect();
    for (k, (name, _)) in mixes.first().into_iter().flatten().enumerate() {
        let cells: Vec<String> = mixes.iter().map(|m| m[k].1.clone()).collect();
        let differs = cells.iter().any(|x| *x != cells[0]);
        let mut row = vec![
            if differs { "*" } else { "" }.to_string(),
            format!("mix: {name}"),
        ];
        row.extend(cells);
        t.add_row(row);
    }
    for m in &c.metrics {
        let mut row = vec![
            if m.differs { "*" } else { "" }.to_string(),
            format!("{}: {}", m.section, m.name),
        ];
        let first = m.values.first().copied().unwrap_or(0.0);
        row.extend(
            m.values
                .iter()
                .enumerate()
                .map(|(i, &v)| cell(m.unit, first, v, i)),
        );
        t.add_row(row);
    }
    right_align(&mut t, 2);
    out.push_str(&format!("{t}\n* differs from A\n"));
    let verdicts: Vec<String> = c.estimates.iter().map(|e| e.verdict.clone()).collect();
    for (v, idx) in grouped_lines(&verdicts) {
        let names: Vec<&str> = idx.iter().map(|&i| letters[i].as_str()).collect();
        out.push_str(&format!("verdict for {}: {v}\n", names.join(", ")));
    }
    out
}

/// The comparison as CSV: one row per quantity, unrounded values (bytes, seconds, fractions).
pub fn csv(c: &Comparison) -> String {
    let mut header = vec!["section", "quantity", "unit", "differs"];
    header.extend(c.labels.iter().map(String::as_str));
    let mut out = Csv::new(&header);
    let mut mix = vec![
        "config".to_string(),
        "parallel mix".to_string(),
        String::new(),
        c.mixes.iter().any(|m| *m != c.mixes[0]).to_string(),
    ];
    mix.extend(c.mixes.iter().cloned());
    out.row(mix);
    for m in &c.metrics {
        let unit = serde_json::to_value(m.unit)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let mut row = vec![
            m.section.to_string(),
            m.name.to_string(),
            unit,
            m.differs.to_string(),
        ];
        row.extend(m.values.iter().map(|v| v.to_string()));
        out.row(row);
    }
    out.finish()
}
