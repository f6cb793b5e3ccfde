//! The whole run: time to train a token budget, GPU-hours, energy, cost, and the goodput left
//! after failures and checkpoints (docs/planning.md derives every formula).
//!
//! It sits after `estimate` in the module order: one step's estimate goes in, and the run is
//! that step repeated, plus checkpoint stalls, plus what each expected failure costs.

pub mod defaults;
#[cfg(test)]
mod tests;

use crate::config::{Resolved, RunConfig};
use crate::estimate::Estimate;
use serde::Serialize;

const S_PER_HOUR: f64 = 3600.0;
const S_PER_DAY: f64 = 86_400.0;
const J_PER_MWH: f64 = 3.6e9;

/// A `[run]` setting or an input that cannot give a run (the field and the rule).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanningError {
    #[error("{field}: {rule} (got {value})")]
    Field {
        field: &'static str,
        rule: &'static str,
        value: f64,
    },
    /// Failures come faster than the run can make progress between them.
    #[error("run.failure_rate_per_gpu_hour: {interruptions_per_hour:.3} interruptions per hour on {gpus} GPUs leave no progress: each costs {loss_s:.0} s (restart, restore, half an interval), more than the {mtbf_s:.0} s between them; lower the rate, the restart time or the checkpoint interval")]
    NoProgress {
        gpus: u32,
        interruptions_per_hour: f64,
        loss_s: f64,
        mtbf_s: f64,
    },
}

/// The run settings with every default filled in and checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub price_per_gpu_hour_usd: Option<f64>,
    /// Given per node of `cluster.gpus_per_node`; `None`: the GPU profile's ([`host_power`]).
    pub host_power_w_per_node: Option<f64>,
    /// Given per node of `cluster.gpus_per_node`; `None`: per NIC, one per GPU.
    pub network_power_w_per_node: Option<f64>,
    pub pue: f64,
    pub failure_rate_per_gpu_hour: f64,
    pub storage_bytes_per_s: f64,
    pub checkpoint_async: bool,
    pub restart_s: f64,
    pub checkpoint_interval_s: Option<f64>,
    /// The run's deadline in seconds, if any.
    pub deadline_s: Option<f64>,
}

fn check(
    field: &'static str,
    rule: &'static str,
    value: f64,
    ok: bool,
) -> Result<f64, PlanningError> {
    if ok && value.is_finite() {
        Ok(value)
    } else {
        Err(PlanningError::Field { field, rule, value })
    }
}

impl Settings {
    /// The `[run]` table's settings over the cited defaults ([`defaults`]), each checked.
    pub fn from_config(c: &RunConfig) -> Result<Settings, PlanningError> {
        let pos = "must be a finite number above 0";
        let nonneg = "must be a finite number, 0 or more";
        let price = match c.price_per_gpu_hour_usd {
            Some(p) => Some(check("run.price_per_gpu_hour_usd", pos, p, p > 0.0)?),
            None => None,
        };
        let nonneg_w = |field, w: Option<f64>| match w {
            Some(w) => check(field, nonneg, w, w >= 0.0).map(Some),
            None => Ok(None),
        };
        let pue = c.pue.unwrap_or(defaults::PUE);
        let rate = c
            .failure_rate_per_gpu_hour
            .unwrap_or(defaults::FAILURE_RATE_PER_GPU_HOUR);
        let storage = c
            .storage_bytes_per_s
            .unwrap_or(defaults::STORAGE_BYTES_PER_S);
        let restart = c.restart_s.unwrap_or(defaults::RESTART_S);
        let interval = match c.checkpoint_interval_s {
            Some(t) => Some(check("run.checkpoint_interval_s", pos, t, t > 0.0)?),
            None => None,
        };
        let deadline_s = match c.deadline_days {
            Some(d) => Some(check("run.deadline_days", pos, d, d > 0.0)? * S_PER_DAY),
            None => None,
        };
        Ok(Settings {
            deadline_s,
            price_per_gpu_hour_usd: price,
            host_power_w_per_node: nonneg_w("run.host_power_w_per_node", c.host_power_w_per_node)?,
            network_power_w_per_node: nonneg_w(
                "run.network_power_w_per_node",
                c.network_power_w_per_node,
            )?,
            pue: check(
                "run.pue",
                "must be a finite number, 1 or more",
                pue,
                pue >= 1.0,
            )?,
            failure_rate_per_gpu_hour: check(
                "run.failure_rate_per_gpu_hour",
                nonneg,
                rate,
                rate >= 0.0,
            )?,
            storage_bytes_per_s: check("run.storage_bytes_per_s", pos, storage, storage > 0.0)?,
            checkpoint_async: c.checkpoint_async.unwrap_or(false),
            restart_s: check("run.restart_s", nonneg, restart, restart >= 0.0)?,
            checkpoint_interval_s: interval,
        })
    }
}

/// One step and the cluster, as plain numbers: what the run is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInputs {
    pub step_s: f64,
    /// Compute of the critical rank per step (its share of the step is the GPUs' utilisation).
    pub compute_s: f64,
    pub tokens_per_step: u64,
    pub gpus: u32,
    /// Power of the run's hosts and network besides the GPUs, watts ([`host_power`]).
    pub hosts_w: f64,
    /// Board power idle and at TDP; `None` leaves the energy out.
    pub gpu_idle_w: Option<f64>,
    pub gpu_tdp_w: Option<f64>,
    /// Bytes of one checkpoint over all ranks (each replicated tensor once).
    pub checkpoint_bytes: f64,
    /// Bytes the most loaded rank writes (what an asynchronous checkpoint copies to host).
    pub checkpoint_bytes_per_rank: f64,
}

/// The `run` section of an estimate: the token budget's time, GPU-hours, energy, cost and
/// goodput, with the terms behind them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunForecast {
    pub tokens: u64,
    /// Expected wall-clock days: compute plus checkpoint stalls plus failure losses.
    pub wall_days: f64,
    /// GPUs x wall hours.
    pub gpu_hours: f64,
    /// Facility energy (GPUs, hosts, network, times the PUE); absent without GPU power figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_mwh: Option<f64>,
    /// GPU-hours x the price; absent without `run.price_per_gpu_hour_usd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Productive training time over wall time.
    pub goodput_fraction: f64,
    /// Training seconds between checkpoints (Young's optimum unless set).
    pub checkpoint_interval_s: f64,
    pub expected_interruptions: f64,
    pub steps: u64,
    /// Days of training alone (steps x step time).
    pub compute_days: f64,
    /// Days the checkpoint stalls add.
    pub checkpoint_days: f64,
    /// Days failures add: restarts, restores and recomputed work.
    pub failure_days: f64,
    pub checkpoint_bytes: f64,
    /// Seconds to write one checkpoint to storage (and to read it back on a restart).
    pub checkpoint_write_s: f64,
    /// Seconds training stops per checkpoint (the write, or the host copy when asynchronous).
    pub checkpoint_stall_s: f64,
    /// Seconds from a failure to training again (restart plus reading the checkpoint).
    pub restart_s: f64,
    /// Seconds of work lost per failure on average (half an interval and its stall).
    pub lost_work_per_failure_s: f64,
    /// Mean time between failures of the whole job, in hours (absent at a zero failure rate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_mtbf_hours: Option<f64>,
    /// Compute share of a step: the GPUs' utilisation while training.
    pub gpu_utilization: f64,
    /// Mean GPU board power while training, watts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_power_w: Option<f64>,
    /// The deadline (`run.deadline_days`) and its margin: days to spare, negative when late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_days: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_margin_days: Option<f64>,
    /// What was left out and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Young's optimal checkpoint interval (Young 1974, "A first order approximation to the
/// optimum checkpoint interval"): sqrt(2 x stall x MTBF), the leading term of Daly's (2006).
pub fn young_interval_s(stall_s: f64, mtbf_s: f64) -> f64 {
    (2.0 * stall_s * mtbf_s).sqrt()
}

/// Expected wall seconds to do `work_s` of training with a checkpoint every `interval_s` of
/// training costing `stall_s`, failures at `rate_per_s` each costing `restart_s` plus the half
/// segment lost: T = W (1 + d/t) / (1 - rate (R + (t + d)/2)) (docs/planning.md).
pub fn expected_wall_s(
    work_s: f64,
    interval_s: f64,
    stall_s: f64,
    restart_s: f64,
    rate_per_s: f64,
) -> Option<f64> {
    let loss = restart_s + (interval_s + stall_s) / 2.0;
    let denom = 1.0 - rate_per_s * loss;
    (denom > 0.0).then(|| work_s * (1.0 + stall_s / interval_s) / denom)
}

/// The run of `tokens` tokens from one step's figures.
pub fn plan(tokens: u64, step: &StepInputs, s: &Settings) -> Result<RunForecast, PlanningError> {
    if tokens == 0 {
        return Err(PlanningError::Field {
            field: "run.train_tokens",
            rule: "must be a positive whole number of tokens",
            value: 0.0,
        });
    }
    check(
        "step time",
        "must be a finite number above 0",
        step.step_s,
        step.step_s > 0.0,
    )?;
    if let Some(d) = s.deadline_s {
        if d < step.step_s {
            return Err(PlanningError::Field {
                field: "run.deadline_days",
                rule: "is shorter than one training step: no run of this mix can finish by it",
                value: d / S_PER_DAY,
            });
        }
    }
    let per_step = step.tokens_per_step.max(1);
    let steps = tokens.div_ceil(per_step);
    let work_s = steps as f64 * step.step_s;
    let gpus = f64::from(step.gpus.max(1));
    let write_s = step.checkpoint_bytes / s.storage_bytes_per_s;
    let stall_s = if s.checkpoint_async {
        step.checkpoint_bytes_per_rank / defaults::HOST_COPY_BYTES_PER_S
    } else {
        write_s
    };
    let rate_per_s = s.failure_rate_per_gpu_hour * gpus / S_PER_HOUR;
    // An interval is at least one step (checkpoints fall between steps), at least the write
    // when asynchronous (one write at a time), and at most the whole run.
    let floor = if s.checkpoint_async {
        write_s.max(step.step_s)
    } else {
        step.step_s
    };
    let interval_s = match s.checkpoint_interval_s {
        Some(t) => t,
        None if rate_per_s > 0.0 => young_interval_s(stall_s, 1.0 / rate_per_s),
        None => work_s,
    }
    .clamp(floor.min(work_s), work_s);
    let restart_s = s.restart_s + write_s;
    let lost_s = (interval_s + stall_s) / 2.0;
    let wall_s = expected_wall_s(work_s, interval_s, stall_s, restart_s, rate_per_s).ok_or(
        PlanningError::NoProgress {
            gpus: step.gpus,
            interruptions_per_hour: rate_per_s * S_PER_HOUR,
            loss_s: restart_s + lost_s,
            mtbf_s: 1.0 / rate_per_s,
        },
    )?;
    check(
        "run wall time",
        "overflows: the token budget or step time is too large",
        wall_s,
        true,
    )?;
    let checkpoint_s = work_s * stall_s / interval_s;
    let interruptions = rate_per_s * wall_s;
    let utilization = (step.compute_s / step.step_s).clamp(0.0, 1.0);
    let mut notes = Vec::new();
    let (energy_mwh, gpu_power_w) = match (step.gpu_idle_w, step.gpu_tdp_w) {
        (Some(idle), Some(tdp)) => {
            let busy_w = idle + (tdp - idle) * utilization;
            // Training (and recomputing lost work) at the busy power; stalls and restarts idle.
            let training_s = work_s + interruptions * interval_s / 2.0;
            let gpu_j = gpus * (busy_w * training_s + idle * (wall_s - training_s).max(0.0));
            let other_j = step.hosts_w * wall_s;
            (Some(s.pue * (gpu_j + other_j) / J_PER_MWH), Some(busy_w))
        }
        _ => {
            notes.push("energy omitted: the GPU profile gives no [power] idle_w and tdp_w".into());
            (None, None)
        }
    };
    let gpu_hours = gpus * wall_s / S_PER_HOUR;
    let cost_usd = s.price_per_gpu_hour_usd.map(|p| p * gpu_hours);
    if cost_usd.is_none() {
        notes.push("cost omitted: set run.price_per_gpu_hour_usd (--gpu-hour-price) for dollars; there is no default price".into());
    }
    Ok(RunForecast {
        tokens,
        wall_days: wall_s / S_PER_DAY,
        gpu_hours,
        energy_mwh,
        cost_usd,
        goodput_fraction: work_s / wall_s,
        checkpoint_interval_s: interval_s,
        expected_interruptions: interruptions,
        steps,
        compute_days: work_s / S_PER_DAY,
        checkpoint_days: checkpoint_s / S_PER_DAY,
        failure_days: (wall_s - work_s - checkpoint_s).max(0.0) / S_PER_DAY,
        checkpoint_bytes: step.checkpoint_bytes,
        checkpoint_write_s: write_s,
        checkpoint_stall_s: stall_s,
        restart_s,
        lost_work_per_failure_s: lost_s,
        job_mtbf_hours: (rate_per_s > 0.0).then(|| 1.0 / rate_per_s / S_PER_HOUR),
        gpu_utilization: utilization,
        gpu_power_w,
        deadline_days: s.deadline_s.map(|d| d / S_PER_DAY),
        deadline_margin_days: s.deadline_s.map(|d| (d - wall_s) / S_PER_DAY),
        notes,
    })
}

/// Checkpoint bytes: every parameter once, in its training dtype, and for each trainable one
/// its optimizer state (the fp32 master copy and Adam's two fp32 moments: 2 + 4 + 8 = 14 bytes
/// a parameter under bf16 mixed precision, Micikevicius et al. 2018 and Kingma & Ba 2015; Muon
/// keeps one moment), as a distributed checkpoint writes each shard once. The figure is the
/// model's, whatever the parallel mix: expert parallelism shards the experts, it does not
/// drop them. Returns (all ranks, the most loaded rank's weights and optimizer state, which an
/// asynchronous checkpoint copies to host memory).
pub fn checkpoint_bytes(r: &Resolved, est: &Estimate) -> (f64, f64) {
    let tr = &r.config.training;
    let muon = if tr.optimizer == crate::config::Optimizer::Muon {
        muon_params(r)
    } else {
        0
    };
    let weights = est.params.total as f64 * tr.weight_bytes() as f64;
    let state = crate::model::optimizer_bytes(tr, est.params.trainable, muon).0 as f64;
    let rank_max = est
        .memory
        .stages
        .iter()
        .map(|st| (st.weights + st.optimizer) as f64)
        .fold(0.0, f64::max);
    (weights + state, rank_max)
}

/// The matrix parameters Muon updates in the whole model: each pipeline rank's shares times
/// the ranks that split them (TP for the dense matrices, EP x expert TP for the experts).
fn muon_params(r: &Resolved) -> u64 {
    let ledger = crate::model::Ledger::build(r);
    let summary = crate::model::LedgerSummary::of(&ledger, r.config.training.recompute);
    let p = &r.config.parallel;
    crate::model::chunks_per_rank(r)
        .iter()
        .map(|chunks| {
            let m = crate::model::rank_muon(chunks, &summary);
            m.dense * u64::from(p.tp) + m.expert * u64::from(p.ep * p.etp())
        })
        .sum()
}

/// The run section of `est` when its configuration sets `run.train_tokens` (`None` otherwise).
pub fn run_forecast(r: &Resolved, est: &Estimate) -> Result<Option<RunForecast>, PlanningError> {
    let Some(tokens) = r.config.run.train_tokens else {
        return Ok(None);
    };
    let settings = Settings::from_config(&r.config.run)?;
    let hosts = host_power(r, &settings);
    let (ckpt, ckpt_rank) = checkpoint_bytes(r, est);
    let t = &r.config.training;
    let step = StepInputs {
        step_s: est.time.step_s,
        compute_s: est.time.compute_s,
        tokens_per_step: t.global_batch_size * t.seq_length,
        gpus: r.world(),
        hosts_w: hosts.total_w(),
        gpu_idle_w: r.gpu.power.map(|p| p.idle_w),
        gpu_tdp_w: r.gpu.power.map(|p| p.tdp_w),
        checkpoint_bytes: ckpt,
        checkpoint_bytes_per_rank: ckpt_rank,
    };
    let mut report = plan(tokens, &step, &settings)?;
    if report.energy_mwh.is_some() {
        report.notes.extend(hosts.note);
    }
    Ok(Some(report))
}

/// What a run's hosts draw besides their GPUs: how many nodes, and each one's host and network
/// power.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPower {
    /// Nodes the host power is charged for.
    pub host_nodes: f64,
    pub host_w_per_node: f64,
    /// Nodes the network power is charged for.
    pub network_nodes: f64,
    pub network_w_per_node: f64,
    /// What was assumed where the profile gives no figure.
    pub note: Option<String>,
}

impl HostPower {
    /// Watts of every host and its network share.
    pub fn total_w(&self) -> f64 {
        self.host_nodes * self.host_w_per_node + self.network_nodes * self.network_w_per_node
    }
}

/// The hosts of a run. A figure given in `[run]` is per node of `cluster.gpus_per_node`, the
/// node the user described. Otherwise the hardware is the profile's: its own nodes of
/// `gpus_per_node` GPUs (a job fills whole ones), each drawing `power.host_w_per_node` (DGX
/// H100's per GPU where the profile gives none) and the switch ports of one NIC per GPU, so
/// the energy does not move when only `cluster.gpus_per_node` does.
pub fn host_power(r: &Resolved, s: &Settings) -> HostPower {
    let gpus = r.world().max(1);
    let nodes_of = |per_node: u32| f64::from(gpus.div_ceil(per_node.max(1)));
    let (given, hardware) = (r.config.cluster.per_node(), r.gpu.gpus_per_node);
    let profile_host = r.gpu.power.and_then(|p| p.host_w_per_node);
    let mut note = None;
    let (host_nodes, host_w_per_node) = match (s.host_power_w_per_node, profile_host) {
        (Some(w), _) => (nodes_of(given), w),
        (None, Some(w)) => (nodes_of(hardware), w),
        (None, None) => {
            note = Some(format!(
                "host power: the {} profile gives no power.host_w_per_node; DGX H100's {} W per GPU assumed (set run.host_power_w_per_node)",
                r.gpu.name,
                defaults::HOST_POWER_W_PER_GPU
            ));
            (
                nodes_of(hardware),
                defaults::HOST_POWER_W_PER_GPU * f64::from(hardware),
            )
        }
    };
    let (network_nodes, network_w_per_node) = match s.network_power_w_per_node {
        Some(w) => (nodes_of(given), w),
        None => (
            nodes_of(hardware),
            defaults::NETWORK_POWER_W_PER_NIC * f64::from(hardware),
        ),
    };
    HostPower {
        host_nodes,
        host_w_per_node,
        network_nodes,
        network_w_per_node,
        note,
    }
}
