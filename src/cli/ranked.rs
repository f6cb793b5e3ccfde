//! What `search` and `search --gpus LOW..HIGH` share: the CSV columns of a ranked mix, the
//! Ctrl-C flag, and the lines saying how the NVLink domain was chosen.

use parsim::search::Ranked;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The CSV columns of one ranked mix (after a leading column the caller names).
pub const CSV_COLUMNS: &[&str] = &[
    "mix",
    "tp",
    "cp",
    "cp_comm",
    "pp",
    "vpp",
    "schedule",
    "first_stage_layers",
    "last_stage_layers",
    "pipeline_layout",
    "ep",
    "dp",
    "zero",
    "mbs",
    "recompute",
    "step_s",
    "step_s_p10",
    "step_s_p90",
    "tokens_per_s",
    "mfu",
    "per_gpu_max_bytes",
    "usable_bytes",
    "verdict",
    "command",
];

/// The [`CSV_COLUMNS`] fields of `r`: its label, its settings (the pipeline split as the
/// estimate's configuration holds it), its figures and the command that reproduces it.
pub fn csv_fields(r: &Ranked) -> Vec<String> {
    let (m, e) = (&r.mix, &r.estimate);
    let p = &e.config.parallel;
    let opt = |v: Option<u32>| v.map_or(String::new(), |n| n.to_string());
    vec![
        r.label.clone(),
        m.tp.to_string(),
        m.cp.to_string(),
        m.cp_comm.to_string(),
        m.pp.to_string(),
        m.vpp.to_string(),
        m.schedule.to_string(),
        opt(p.first_stage_layers),
        opt(p.last_stage_layers),
        p.pipeline_layout.clone().unwrap_or_default(),
        m.ep.to_string(),
        e.config.parallel.dp.unwrap_or(0).to_string(),
        m.zero.to_string(),
        m.mbs.to_string(),
        m.recompute.to_string(),
        e.time.step_s.to_string(),
        e.time.step_s_p10.to_string(),
        e.time.step_s_p90.to_string(),
        e.throughput.tokens_per_s.to_string(),
        e.throughput.mfu.to_string(),
        e.memory.per_gpu_max_bytes.to_string(),
        e.memory.usable_bytes.to_string(),
        e.verdict.clone(),
        r.command.clone().unwrap_or_default(),
    ]
}

/// A flag set by Ctrl-C: the search stops early and reports what it has.
pub fn cancel_on_ctrl_c() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    // A second handler cannot be installed (e.g. in tests running in one process): ignore.
    drop(ctrlc::set_handler(move || {
        flag.store(true, Ordering::Relaxed);
    }));
    cancel
}

/// What the search's table says of the NVLink domain at the cluster's GPU count: how it was
/// chosen where that is more than the node (with `how`), and the warning of a count that
/// fills no racks.
pub fn nvlink_domain_lines(cluster: &parsim::config::ClusterConfig, how: bool) -> Vec<String> {
    let Ok(gpu) = parsim::config::GpuProfile::load(&cluster.gpu) else {
        return Vec::new();
    };
    let d = cluster.nvlink_domain_choice(&gpu);
    let mut lines = Vec::new();
    if how && d.is_worth_saying() {
        lines.push(format!("NVLink domain: {}", d.reason));
    }
    lines.extend(d.warning.map(|w| format!("warning: {w}")));
    lines
}
