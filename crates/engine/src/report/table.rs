//! Aligned tables for `parsim estimate`.

use super::format::{bytes, count, flops, gib, grouped, seconds};
use super::memory_lines;
use crate::estimate::Estimate;
use crate::model::CommKind;
use comfy_table::{presets, CellAlignment, Table};
use std::fmt::Write;

/// A table in the style of every human table of parsim (UTF-8 borders only) with `header`.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::UTF8_BORDERS_ONLY);
    t.set_header(header.to_vec());
    t
}

/// Right-aligns the columns from `from` on (numbers).
pub fn right_align(t: &mut Table, from: usize) {
    let n = t.column_count();
    right_align_columns(t, from..n);
}

/// Right-aligns the columns `columns` (numbers).
pub fn right_align_columns(t: &mut Table, columns: std::ops::Range<usize>) {
    for i in columns {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// The whole estimate as text: the configuration, then one table per kind of figure, then
/// the verdict and warnings.
pub fn estimate_text(e: &Estimate) -> String {
    let mut out = String::new();
    header(&mut out, e);
    let _ = writeln!(out, "{}\n", params_table(e));
    memory_section(&mut out, e);
    let _ = writeln!(out, "{}\n", flops_table(e));
    let _ = writeln!(
        out,
        "communication (ring algorithms; dp includes the CP replicas of dense weights)"
    );
    let _ = writeln!(out, "{}\n", communication_table(e));
    let _ = writeln!(out, "{}", time_table(e));
    let _ = writeln!(out, "{}\n", throughput_table(e));
    let _ = writeln!(out, "verdict: {}", e.verdict);
    let _ = writeln!(
        out,
        "interval: {} (regime: {})",
        e.step_interval.note,
        crate::interval::Regime::describe(&e.step_interval.regime)
    );
    let _ = writeln!(
        out,
        "framework: {}{}",
        e.config.training.framework.name(),
        if e.framework_overrides.is_empty() {
            " (its defaults)".to_string()
        } else {
            format!("; {}", e.framework_overrides.join("; "))
        }
    );
    for w in &e.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

/// The model, cluster, parallel mix and training settings, in three lines.
fn header(out: &mut String, e: &Estimate) {
    let c = &e.config;
    let p = &c.parallel;
    let tr = &c.training;
    let _ = writeln!(
        out,
        "parsim estimate: {} on {} x {} ({} per node{})",
        c.model.name,
        c.cluster.num_gpus,
        e.gpu,
        c.cluster.per_node(),
        e.nvlink_domain
            .as_ref()
            .map_or(String::new(), |d| format!("; NVLink domain: {}", d.reason))
    );
    let _ = writeln!(
        out,
        "  TP {}{} | CP {} ({}) | PP {} x VPP {} ({}) | DP {} | EP {} | ZeRO-{}{}",
        p.tp,
        if p.sp { " + SP" } else { "" },
        p.cp,
        p.cp_comm,
        p.pp,
        p.vpp,
        p.schedule,
        p.dp.unwrap_or(0),
        p.ep,
        p.zero,
        match p.fsdp {
            Some(crate::config::Fsdp::Megatron) => format!(
                " (Megatron-FSDP {})",
                crate::config::Fsdp::megatron_strategy(p.zero)
            ),
            Some(crate::config::Fsdp::Torch) if crate::config::syncs_once_per_step(&e.config) => {
                " (torch FSDP2, gathered and reduced once a step under pipelining)".to_string()
            }
            Some(crate::config::Fsdp::Torch) => " (torch FSDP2)".to_string(),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "  seq {} | micro batch {} | global batch {} | {} microbatches per pipeline | {} | recompute {}\n",
        tr.seq_length, tr.micro_batch_size, tr.global_batch_size, e.schedule.microbatches, tr.precision, tr.recompute
    );
}

/// Parameter counts: total, per layer, on the most loaded GPU.
fn params_table(e: &Estimate) -> Table {
    let pr = &e.params;
    let mut t = table(&["parameters", "count", "exact"]);
    let mut row = |name: &str, v: u64| {
        t.add_row(vec![name.to_string(), count(v as f64), grouped(v)]);
    };
    row("total", pr.total);
    if pr.activated_per_token != pr.total {
        row("activated per token", pr.activated_per_token);
    }
    row("embedding", pr.embedding);
    if pr.output_layer > 0 {
        row("output layer", pr.output_layer);
    }
    row("per dense layer", pr.per_layer_dense);
    if let Some(m) = pr.per_layer_moe {
        row("per MoE layer", m);
    }
    row("most loaded GPU", pr.per_gpu_max);
    if pr.trainable != pr.total {
        row("trainable", pr.trainable);
    }
    right_align(&mut t, 1);
    t
}

/// Memory per pipeline stage in GiB, and whether the most loaded GPU fits.
fn memory_section(out: &mut String, e: &Estimate) {
    let mem = &e.memory;
    // A low-precision recipe's weight copies get a column of their own (none without one).
    let low = mem.stages.iter().any(|s| s.low_precision_weights > 0);
    // The framework's own lines (src/memory/deepspeed.rs, allocator.rs), where it has them.
    let bucket = mem.stages.iter().any(|s| s.reduce_bucket > 0);
    let step = mem.stages.iter().any(|s| s.step_grads > 0);
    let check = mem.stages.iter().any(|s| s.grad_check_copies > 0);
    let cache = mem.stages.iter().any(|s| s.allocator_cache > 0);
    let mut head = vec!["pp stage", "weights"];
    if low {
        head.push("low-prec copies");
    }
    head.extend(["grads", "optimizer", "activations", "buffers"]);
    if bucket {
        head.push("reduce bucket");
    }
    if step {
        head.push("step grad copies");
    }
    if check {
        head.push("grad check copies");
    }
    head.push("total GiB");
    if cache {
        head.push("reserved GiB");
    }
    head.push("of capacity");
    let mut t = table(&head);
    for s in &mem.stages {
        let mut row = vec![s.stage.to_string(), gib(s.weights)];
        if low {
            row.push(gib(s.low_precision_weights));
        }
        row.extend([
            gib(s.gradients),
            gib(s.optimizer),
            gib(s.activations),
            gib(s.buffers),
        ]);
        if bucket {
            row.push(gib(s.reduce_bucket));
        }
        if step {
            row.push(gib(s.step_grads));
        }
        if check {
            row.push(gib(s.grad_check_copies));
        }
        row.push(gib(s.total));
        if cache {
            row.push(gib(s.reserved()));
        }
        row.push(format!(
            "{:.0}%",
            100.0 * s.reserved() as f64 / mem.capacity_bytes as f64
        ));
        t.add_row(row);
    }
    right_align(&mut t, 0);
    let _ = writeln!(
        out,
        "memory per GPU in GiB (capacity {} GiB)",
        gib(mem.capacity_bytes)
    );
    let _ = writeln!(out, "{t}");
    if let Some(worst) = memory_lines::most_loaded(mem) {
        let _ = writeln!(
            out,
            "the most loaded GPU (pipeline rank {}) line by line, in GiB",
            worst.stage
        );
        let _ = writeln!(out, "{}", memory_lines_table(worst));
    }
    // A fit is decided on the allocated peak: the allocator returns its cache before failing.
    let needs = match mem.reserved_peak_bytes() {
        Some(r) => format!(
            "{} GiB allocated ({} reserved)",
            gib(mem.per_gpu_max_bytes),
            gib(r)
        ),
        None => format!("{} GiB", gib(mem.per_gpu_max_bytes)),
    };
    let _ = writeln!(
        out,
        "  {}: most loaded GPU needs {needs} of {} GiB ({} GiB usable, {:.0}% margin)",
        if mem.fits { "FITS" } else { "DOES NOT FIT" },
        gib(mem.capacity_bytes),
        gib(mem.usable_bytes),
        100.0 * mem.margin_fraction
    );
    let margin = gib(mem.margin_bytes_p90.unsigned_abs());
    let _ = writeln!(
        out,
        "  {} at p90 ({} GiB) {}; p10-p90 peak {}-{} GiB: {}\n",
        if mem.fits_at_p90 {
            "fits"
        } else {
            "does not fit"
        },
        gib(mem.per_gpu_max_bytes_p90),
        if mem.fits_at_p90 {
            format!("with {margin} GiB to spare")
        } else {
            format!("{margin} GiB short")
        },
        gib(mem.per_gpu_max_bytes_p10),
        gib(mem.per_gpu_max_bytes_p90),
        mem.interval.note
    );
}

/// The lines of `s` as a table: line, GiB, from.
fn memory_lines_table(s: &crate::memory::StageMemory) -> Table {
    let mut t = table(&["line", "GiB", "from"]);
    for l in memory_lines::lines(s) {
        t.add_row(vec![
            l.name.to_string(),
            memory_lines::signed_gib(l.bytes),
            l.from.to_string(),
        ]);
    }
    right_align_columns(&mut t, 1..2);
    t
}

/// FLOPs per step and per token.
fn flops_table(e: &Estimate) -> Table {
    let f = &e.flops;
    let mut t = table(&["FLOPs", "value"]);
    t.add_row(vec![
        "per step (model)".to_string(),
        flops(f.per_step_model),
    ]);
    t.add_row(vec![
        "per step (hardware, with recompute)".to_string(),
        flops(f.per_step_hardware),
    ]);
    t.add_row(vec![
        "per token (model)".to_string(),
        flops(f.per_token_model),
    ]);
    right_align(&mut t, 1);
    t
}

/// One process group's communication as the tables and the GUI's cards show it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommRow {
    pub kind: CommKind,
    /// Members of the group the kind's bytes run over, and whether it spans NVLink domains.
    pub size: u32,
    pub crosses_nodes: bool,
    pub sent_bytes: u64,
    pub exposed_s: f64,
}

/// A row per communication kind that is a process group, in [`CommKind::ALL`]'s order.
pub fn comm_rows(e: &Estimate) -> Vec<CommRow> {
    let cm = &e.communication;
    CommKind::ALL
        .into_iter()
        .filter_map(|kind| {
            let group = kind.info().group?;
            let info = cm.groups.iter().find(|g| g.group == group);
            let (size, crosses_nodes) = info.map_or((1, false), |g| (g.size, g.crosses_nodes));
            Some(CommRow {
                kind,
                size,
                crosses_nodes,
                sent_bytes: cm.per_step_bytes_per_gpu[kind],
                exposed_s: e.time.exposed_comm_by_group_s[kind],
            })
        })
        .collect()
}

/// Bytes each GPU sends per step, per process group.
fn communication_table(e: &Estimate) -> Table {
    let mut t = table(&["group", "size", "crosses nodes", "sent per step per GPU"]);
    for row in comm_rows(e) {
        let crosses = match (row.size > 1, row.crosses_nodes) {
            (false, _) => "-",
            (true, true) => "yes",
            (true, false) => "no",
        };
        t.add_row(vec![
            row.kind.key().to_string(),
            row.size.to_string(),
            crosses.to_string(),
            bytes(row.sent_bytes as f64),
        ]);
    }
    right_align(&mut t, 1);
    t
}

/// The step time and its parts ([`crate::estimate::breakdown::terms`], the GUI's numbers).
fn time_table(e: &Estimate) -> Table {
    let tm = &e.time;
    let mut t = table(&["step time", "seconds", "share"]);
    t.add_row(vec!["step".into(), seconds(tm.step_s), share(1.0)]);
    t.add_row(vec![
        format!("  interval {}", percentile_pair(e)),
        format!("{} - {}", seconds(tm.step_s_p10), seconds(tm.step_s_p90)),
        String::new(),
    ]);
    for term in crate::estimate::breakdown::terms(tm) {
        // Compute and the optimizer always show, the pipeline's terms with a pipeline, the
        // rest where they are not zero.
        let pipeline = matches!(
            term.key.as_str(),
            "warmup_cooldown_s" | "imbalance_s" | "pp_wait_s"
        );
        let always = matches!(term.key.as_str(), "compute_s" | "optimizer_s");
        if always || (pipeline && tm.imbalance.is_some()) || term.seconds > 0.0 {
            t.add_row(vec![
                format!("  {}", term.label),
                seconds(term.seconds),
                share(term.share),
            ]);
        }
    }
    if let Some(i) = tm.imbalance.filter(|_| tm.imbalance_s > 0.0) {
        t.add_row(vec![
            format!(
                "    slowest stage: pipeline rank {} (+{:.1}%: {})",
                i.stage,
                100.0 * i.excess_fraction,
                i.reason()
            ),
            String::new(),
            String::new(),
        ]);
    }
    right_align(&mut t, 1);
    t
}

/// `p10-p90`: the percentiles of the estimate's interval.
pub fn percentile_pair(e: &Estimate) -> String {
    let i = &e.step_interval;
    format!(
        "p{:.0}-p{:.0}",
        100.0 * i.lower_percentile,
        100.0 * i.upper_percentile
    )
}

/// A fraction of the step as the CLI table and the GUI cards print it.
pub fn share(fraction: f64) -> String {
    format!("{:.1}%", 100.0 * fraction)
}

/// Tokens per second, TFLOP/s per GPU, MFU and the bubble.
fn throughput_table(e: &Estimate) -> Table {
    let th = &e.throughput;
    let mut t = table(&["throughput", "value"]);
    t.add_row(vec![
        "tokens/s".to_string(),
        format!("{:.0}", th.tokens_per_s),
    ]);
    t.add_row(vec![
        format!("  interval {}", percentile_pair(e)),
        format!("{:.0} - {:.0}", th.tokens_per_s_p10, th.tokens_per_s_p90),
    ]);
    t.add_row(vec![
        "model TFLOP/s per GPU".to_string(),
        format!("{:.1}", th.tflops_per_gpu),
    ]);
    t.add_row(vec![
        "hardware TFLOP/s per GPU (with recompute)".to_string(),
        format!("{:.1}", th.hardware_tflops_per_gpu),
    ]);
    t.add_row(vec!["MFU".to_string(), format!("{:.1}%", 100.0 * th.mfu)]);
    t.add_row(vec![
        format!("  interval {}", percentile_pair(e)),
        format!("{:.1}% - {:.1}%", 100.0 * th.mfu_p10, 100.0 * th.mfu_p90),
    ]);
    t.add_row(vec![
        format!("bubble ({}, of ideal compute)", e.schedule.name),
        format!("{:.1}%", 100.0 * e.schedule.bubble_fraction),
    ]);
    right_align(&mut t, 1);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Resolved};

    /// The communication rows are the process-group kinds in the JSON's order, each with its
    /// JSON bytes and exposed seconds; `dp` stands beside the DP x CP group, whose members are
    /// dp x cp (here 2 x 2 of 8 GPUs at TP 2), and the host link is no row.
    #[test]
    fn communication_rows_follow_the_json_and_the_dp_x_cp_group() {
        let mut c = Config::default();
        c.cluster.num_gpus = 8;
        c.parallel.tp = 2;
        c.parallel.cp = 2;
        c.training.global_batch_size = 8;
        let e = crate::estimate::estimate(&Resolved::new(c).unwrap()).unwrap();
        let rows = comm_rows(&e);
        let keys: Vec<&str> = rows.iter().map(|r| r.kind.key()).collect();
        assert_eq!(keys, ["tp", "cp", "pp", "dp", "ep", "expert_tp"]);
        let json = serde_json::to_value(&e).unwrap();
        for r in &rows {
            let k = r.kind.key();
            assert_eq!(
                json["communication"]["per_step_bytes_per_gpu"][k], r.sent_bytes,
                "{k}"
            );
            assert_eq!(json["time"]["exposed_comm_by_group_s"][k], r.exposed_s);
        }
        let dp = rows.iter().find(|r| r.kind == CommKind::Dp).unwrap();
        assert_eq!((dp.size, e.config.parallel.dp), (4, Some(2)));
    }
}
