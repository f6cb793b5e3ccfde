//! `parsim execute`: lowers the configuration into a Plan, runs it on a backend, and prints per
//! rank the loss, the step time and the peak tracked memory next to the engine's prediction for
//! the same configuration (on the backend's hardware profile: `cpu`, with the run's precision:
//! fp32, or bf16 mixed precision with `--precision bf16`). `--backend cuda` runs it on the GPUs
//! (docs/executor.md), predicted on the configuration's own GPU profile.

use super::config_args::ConfigArgs;
use super::execute_ops::{self, OpClassOut};
use super::launch_args::LaunchArgs;
use super::moe_load::{moe_load, moe_load_text, MoeLoadOut};
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use comfy_table::{presets, CellAlignment, Table};
use parsim::config::{Dtype, Precision, Resolved};
use parsim::lower::{lower, LowerOptions};
use parsim::report::format::{bytes, seconds};
use parsim::report::measured_trace::measured_chrome_trace;
use parsim::report::timeline_compare::{compare_timeline, TimelineComparison};
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_executor::trace::Clock;
use parsim_plan::run_report::{CpStats, MoeLoad, PhaseTimes, StepTime};
use serde::Serialize;
use statrs::statistics::{Data, Median};

/// Execution backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Ranks as threads of this process, fp32 (the reference).
    Cpu,
    /// NVIDIA GPUs (cudarc: NVRTC kernels, cuBLASLt, NCCL); one process per rank with
    /// --nproc-per-node, torchrun or Slurm.
    Cuda,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

#[derive(Debug, Args)]
pub struct ExecuteArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Backend to run on.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: Backend,
    /// Training steps in all (warm-up included).
    #[arg(long, default_value_t = 3)]
    pub steps: u32,
    /// Leading steps left out of the timing.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Seed of the initialisation and of the synthetic tokens.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Print the JSON object of docs/design.md's output contract instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Calibrate: run a sweep of plans on the backend, fit the profile's efficiencies (the
    /// CPU's; with --backend cuda the one --gpu names) to the measurements, and print
    /// predicted vs measured (docs/calibration.md).
    #[arg(long)]
    pub calibrate: bool,
    /// With --calibrate: the sweep (JSONL: {"label", "config", "holdout"} per line); default:
    /// the built-in CPU sweep.
    #[arg(long, value_name = "FILE", requires = "calibrate")]
    pub sweep: Option<std::path::PathBuf>,
    /// With --calibrate: write the fitted profile here (and the measurements beside it, .jsonl).
    #[arg(long, value_name = "NAME.toml", requires = "calibrate")]
    pub out: Option<std::path::PathBuf>,
    /// With --calibrate on the CPU: also execute configurations no sweep point has (another
    /// width and rank count, other micro batch counts and mixes at other shapes), held out, and
    /// print each measured against the fitted profile's prediction, their median and worst
    /// error and their op classes (docs/calibration.md, "The closed loop").
    #[arg(long, requires = "calibrate")]
    pub closed_loop: bool,
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// Record every action of the timed steps and write them as a Chrome trace (Perfetto):
    /// one process per rank, threads compute, collectives and pipeline sends.
    #[arg(long, value_name = "FILE.json", conflicts_with = "calibrate")]
    pub trace: Option<std::path::PathBuf>,
    /// With --trace: add the engine's predicted timeline of the same configuration, one
    /// process per pipeline rank, aligned at each timed step's start.
    #[arg(long, requires = "trace")]
    pub trace_predicted: bool,
    /// Print, per rank and kind of action, measured vs predicted seconds and the five
    /// actions that miss most (in the JSON with --json: `timeline_comparison`).
    #[arg(long, conflicts_with = "calibrate")]
    pub compare_timeline: bool,
    /// Time each op class inside each action (GEMM, attention, memory-bound, collectives,
    /// host gaps) and print the slowest rank's summary; every rank's records go into --json
    /// (docs/calibration.md, "Op timings"). `--calibrate` always profiles.
    #[arg(long)]
    pub profile_ops: bool,
    /// Check the configuration, lower it into its Plan (every rank's groups and actions) and
    /// validate that, then print the Plan's size instead of running it (nothing is allocated
    /// for the model, so any size the backend accepts is checked in a moment).
    #[arg(long, conflicts_with_all = ["calibrate", "trace", "compare_timeline", "profile_ops"])]
    pub plan_only: bool,
}

/// What `execute --plan-only` prints: the Plan's size.
#[derive(Debug, Serialize)]
struct PlanOut {
    backend: &'static str,
    world_size: u32,
    microbatches: u32,
    stages: usize,
    schedule: String,
    /// Actions of all ranks, and of the busiest.
    actions: usize,
    max_rank_actions: usize,
    warnings: Vec<String>,
}

/// The largest run the CPU backend accepts (threads, and host memory by the prediction:
/// what this machine has available, [`parsim::host::available_bytes`], else 32 GiB).
const MAX_CPU_RANKS: u32 = 256;
const FALLBACK_HOST_BYTES: u64 = 32 << 30;

#[derive(Debug, Serialize)]
struct CoordsOut {
    tp: u32,
    cp: u32,
    ep: u32,
    dp: u32,
    pp: u32,
}

#[derive(Debug, Serialize)]
struct MemoryOut {
    weights: u64,
    gradients: u64,
    optimizer: u64,
    activations: u64,
    buffers: u64,
}

#[derive(Debug, Serialize)]
struct RankOut {
    rank: u32,
    coords: CoordsOut,
    step_s: f64,
    /// Mean seconds per timed step by kind of action (forward, backward, W, p2p, optimizer).
    phases: PhaseTimes,
    peak_bytes: u64,
    memory: MemoryOut,
    predicted_peak_bytes: u64,
    predicted_memory: MemoryOut,
    /// Context parallelism: per ring step compute/communication seconds (timed steps,
    /// summed) and the causal work (unmasked score elements, all steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    cp: Option<CpStats>,
    /// MoE: token-to-expert assignments dropped by the expert capacity, all steps.
    moe_dropped: u64,
    /// MoE: the assignments this rank routed and the rows each of its experts received, all
    /// steps' forwards.
    #[serde(skip_serializing_if = "Option::is_none")]
    moe_load: Option<MoeLoad>,
    /// A GPU backend's memory: the tracked reserved bytes at their peak, the caching pool's
    /// reserved peak, and the driver's used and total bytes of the GPU (cuMemGetInfo).
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<DeviceOut>,
    /// `--profile-ops`: the rank's op-class timings over the timed steps, summed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ops: Vec<parsim_plan::op_timing::OpTiming>,
}

#[derive(Debug, Serialize)]
struct DeviceOut {
    /// The profile's runtime reserve (CUDA context, library workspaces): in the engine's
    /// buffers, outside the tracked categories, so it is compared with the driver's figure.
    predicted_runtime_bytes: u64,
    tracked_reserved_peak_bytes: u64,
    pool_reserved_peak_bytes: u64,
    driver_used_bytes: u64,
    driver_total_bytes: u64,
}

#[derive(Debug, Serialize)]
struct ExecuteOut {
    backend: &'static str,
    world_size: u32,
    steps: u32,
    /// Global mean token loss of each timed step.
    loss: Vec<f64>,
    step_s: f64,
    ranks: Vec<RankOut>,
    /// MoE: the hottest EP rank's measured load and the `moe_load_imbalance` that reproduces it.
    #[serde(skip_serializing_if = "Option::is_none")]
    moe_load: Option<MoeLoadOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline_comparison: Option<TimelineComparison>,
    /// `--profile-ops`: the slowest rank and its op classes per timed step.
    #[serde(skip_serializing_if = "Option::is_none")]
    op_classes_rank: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    op_classes: Vec<OpClassOut>,
    warnings: Vec<String>,
}

/// The arithmetic of the run: fp32 (the default, whatever the configuration file says), or the
/// bf16 mixed-precision recipe when `--precision bf16` is given on the command line.
fn run_precision(args: &ExecuteArgs) -> anyhow::Result<Precision> {
    match args.config.workload.precision {
        None | Some(Precision::Fp32) => Ok(Precision::Fp32),
        Some(Precision::Bf16) => Ok(Precision::Bf16),
        Some(p) => bail!(
            "--precision {p}: the {} backend runs fp32 or bf16",
            args.backend.name()
        ),
    }
}

/// Whether the CPU backend's prediction can use the profile `gpu` names: the shipped `cpu`
/// profile, or a profile file fitted from it (`execute --calibrate --out`, `calibrate
/// --profile cpu --out`), whose name stays `cpu`. A profile file that does not load is an
/// error, naming the file.
fn cpu_profile(gpu: &str) -> anyhow::Result<bool> {
    if gpu == "cpu" {
        return Ok(true);
    }
    if !gpu.ends_with(".toml") {
        return Ok(false);
    }
    let p = parsim::config::GpuProfile::load(gpu)
        .with_context(|| format!("cluster.gpu = \"{gpu}\": the profile the prediction uses"))?;
    Ok(p.name == "cpu")
}

/// The configuration on the backend's own profile: the CPU runs on the `cpu` profile (or one
/// calibrated from it, [`cpu_profile`]), in fp32 or bf16 mixed precision (fp32 gradients), as
/// [`run_precision`] says.
fn resolve_for_backend(args: &ExecuteArgs) -> anyhow::Result<Resolved> {
    let mut cfg = args.config.load()?;
    parsim::lower::check_training(&cfg.training)?;
    let mut notes = Vec::new();
    if args.backend == Backend::Cpu && !cpu_profile(&cfg.cluster.gpu)? {
        notes.push(format!(
            "cluster.gpu = \"{}\" replaced by \"cpu\": the prediction uses the CPU backend's profile (or a profile file fitted from it, --gpu my-cpu.toml)",
            cfg.cluster.gpu
        ));
        cfg.cluster.gpu = "cpu".into();
    }
    let precision = run_precision(args)?;
    if cfg.training.precision != precision || cfg.training.grad_dtype != Dtype::Fp32 {
        notes.push(format!(
            "training.precision set to {precision} and grad_dtype to fp32: the {} backend runs {precision} (--precision bf16 for the mixed-precision recipe) with fp32 gradients",
            args.backend.name()
        ));
        cfg.training.precision = precision;
        cfg.training.grad_dtype = Dtype::Fp32;
    }
    let mut r = Resolved::new(cfg)?;
    r.warnings.extend(notes);
    Ok(r)
}

/// `execute --calibrate`: measures the sweep on the chosen backend and fits a profile.
fn run_calibrate(args: &ExecuteArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.warmup < args.steps,
        "--steps ({}) must be larger than --warmup ({})",
        args.steps,
        args.warmup
    );
    if args.backend == Backend::Cuda {
        anyhow::ensure!(
            !args.closed_loop,
            "--closed-loop: its unseen configurations are sized for the CPU backend (--backend cpu)"
        );
        return super::calibrate::run_execute_calibrate_cuda(
            args.sweep.as_deref(),
            args.out.as_deref(),
            args.config.load()?.cluster.gpu.as_str(),
            args.steps.max(4),
            args.warmup,
            args.json,
        );
    }
    super::calibrate::run_execute_calibrate(
        args.sweep.as_deref(),
        args.closed_loop,
        args.out.as_deref(),
        args.steps.max(4),
        args.warmup,
        args.json,
    )
}

/// The flags' own rules, before any configuration is read.
fn check_run_flags(args: &ExecuteArgs) -> anyhow::Result<()> {
    if args.steps == 0 || args.warmup >= args.steps {
        bail!(
            "--steps ({}) must be larger than --warmup ({}): at least one timed step",
            args.steps,
            args.warmup
        );
    }
    if args.backend == Backend::Cpu && args.launch.any() {
        bail!("--nproc-per-node, --master-addr and --master-port start processes for --backend cuda; the cpu backend runs every rank as a thread of this process");
    }
    Ok(())
}

pub fn run(args: ExecuteArgs) -> anyhow::Result<()> {
    if args.calibrate {
        return run_calibrate(&args);
    }
    check_run_flags(&args)?;
    let resolved = resolve_for_backend(&args)?;
    let world = resolved.world();
    if args.backend == Backend::Cpu && world > MAX_CPU_RANKS {
        bail!("cluster.num_gpus: the cpu backend runs one thread per rank; {world} ranks is more than {MAX_CPU_RANKS}");
    }
    let est = parsim::estimate::estimate(&resolved).context("estimating the same configuration")?;
    let predicted: Vec<_> = est.memory.stages.clone();
    // The tracked categories hold what the model allocates; the profile's runtime reserve and
    // runtime lines (CUDA context, cuBLAS workspace, NCCL buffers) are the driver's and the
    // libraries', so they leave the comparison.
    let runtime_bytes =
        resolved.gpu.runtime_overhead_bytes + parsim::memory::RuntimeLines::of(&resolved).total();
    if args.backend == Backend::Cpu && !args.plan_only {
        check_host_memory(&predicted, world)?;
    }
    let plan = lower(
        &resolved,
        &LowerOptions {
            seed: args.seed,
            ..LowerOptions::default()
        },
    )?;
    if args.plan_only {
        return print_plan(&args, &resolved, &plan);
    }
    let opts = RunOptions {
        steps: args.steps,
        warmup: args.warmup,
        precision: match run_precision(&args)? {
            Precision::Bf16 => parsim_plan::plan::Precision::Bf16,
            _ => parsim_plan::plan::Precision::Fp32,
        },
        trace: (args.trace.is_some() || args.compare_timeline).then(Clock::new),
        profile_ops: args.profile_ops,
        // A launched CUDA job: its ranks fill the nodes in order.
        ranks_per_node: args.launch.nproc_per_node,
        ..RunOptions::default()
    };
    let report = match args.backend {
        Backend::Cpu => run_cpu(&plan, &opts)?,
        // Other ranks of a multi-process run print nothing: rank 0 prints the whole run.
        Backend::Cuda => match super::execute_cuda::run(&args.launch, &plan, &opts, world)? {
            Some(report) => report,
            None => return Ok(()),
        },
    };
    let timeline_comparison = timelines(&args, &resolved, &plan, &report)?;
    let timed = (args.warmup as usize)..(args.steps as usize);
    // MoE: the measured load and the imbalance that reproduces it.
    let m = &resolved.config.model;
    let load = moe_load(
        &report.ranks,
        m.num_experts,
        resolved.config.parallel.ep,
        m.moe_router_topk,
    );
    let mut warnings = resolved.warnings.clone();
    warnings.extend(load.iter().flat_map(|l| l.1.iter().cloned()));
    // A step ends when its slowest rank ends.
    let per_step: Vec<f64> = (0..timed.len())
        .map(|i| report.ranks.iter().map(|r| r.step_s[i]).fold(0.0, f64::max))
        .collect();
    let (op_classes_rank, op_classes) = match execute_ops::summary(&report.ranks, timed.len()) {
        Some((rank, rows)) => (Some(rank), rows),
        None => (None, Vec::new()),
    };
    let out = ExecuteOut {
        backend: args.backend.name(),
        world_size: report.world,
        steps: args.steps,
        loss: report.loss[timed].to_vec(),
        step_s: Data::new(per_step).median(),
        ranks: report
            .ranks
            .iter()
            .map(|r| rank_out(r, &predicted[r.coords.pp as usize], runtime_bytes))
            .collect(),
        moe_load: load.map(|l| l.0),
        timeline_comparison,
        op_classes_rank,
        op_classes,
        warnings,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", text(&out));
    }
    Ok(())
}

/// `--plan-only`: the validated Plan's size, as JSON or one line.
fn print_plan(
    args: &ExecuteArgs,
    resolved: &Resolved,
    plan: &parsim_plan::Plan,
) -> anyhow::Result<()> {
    plan.validate().context("validating the Plan")?;
    let per_rank = plan.ranks.iter().map(|r| r.actions.len());
    let out = PlanOut {
        backend: args.backend.name(),
        world_size: resolved.world(),
        microbatches: plan.microbatches,
        stages: plan.stages.len(),
        schedule: plan.schedule.clone(),
        actions: per_rank.clone().sum(),
        max_rank_actions: per_rank.max().unwrap_or(0),
        warnings: resolved.warnings.clone(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "plan: {} ranks, {} {} stages, {} microbatches, {} actions ({} on the busiest rank): valid",
            out.world_size, out.stages, out.schedule, out.microbatches, out.actions, out.max_rank_actions
        );
    }
    Ok(())
}

/// The cpu backend holds every rank in this process: refuse a run that would not fit in the
/// host's available memory.
fn check_host_memory(predicted: &[parsim::memory::StageMemory], world: u32) -> anyhow::Result<()> {
    let total_predicted = predicted.iter().map(|s| s.total).max().unwrap_or(0) * world as u64;
    let (host_bytes, source) = match parsim::host::available_bytes() {
        Some(b) => (b, "available on this machine (/proc/meminfo MemAvailable)"),
        None => (FALLBACK_HOST_BYTES, "assumed: /proc/meminfo unreadable"),
    };
    if total_predicted > host_bytes {
        bail!(
            "the cpu backend would need about {} of host memory for {world} ranks (limit {}, {source}); use a smaller model, sequence or batch",
            bytes(total_predicted as f64),
            bytes(host_bytes as f64)
        );
    }
    Ok(())
}

/// One rank's measured figures beside the engine's prediction for its pipeline stage `p`
/// (less the profile's runtime reserve, which the trackers do not see).
fn rank_out(
    r: &parsim_plan::run_report::RankReport,
    p: &parsim::memory::StageMemory,
    runtime_bytes: u64,
) -> RankOut {
    RankOut {
        rank: r.rank,
        coords: CoordsOut {
            tp: r.coords.tp,
            cp: r.coords.cp,
            ep: r.coords.ep,
            dp: r.coords.dp,
            pp: r.coords.pp,
        },
        step_s: r.median_step_s(),
        phases: r.phases,
        peak_bytes: r.peak.total(),
        memory: MemoryOut {
            weights: r.peak.weights,
            gradients: r.peak.gradients,
            optimizer: r.peak.optimizer,
            activations: r.peak.activations,
            buffers: r.peak.buffers,
        },
        predicted_peak_bytes: p.total.saturating_sub(runtime_bytes),
        predicted_memory: MemoryOut {
            weights: p.weights,
            gradients: p.gradients,
            optimizer: p.optimizer,
            activations: p.activations,
            buffers: p.buffers.saturating_sub(runtime_bytes),
        },
        cp: r.cp.clone(),
        moe_dropped: r.moe_dropped,
        moe_load: (r.moe_load.routed > 0).then(|| r.moe_load.clone()),
        device: r.device.map(|d| DeviceOut {
            predicted_runtime_bytes: runtime_bytes,
            tracked_reserved_peak_bytes: r.reserved_peak.total(),
            pool_reserved_peak_bytes: d.pool_reserved_peak_bytes,
            driver_used_bytes: d.driver_used_bytes,
            driver_total_bytes: d.driver_total_bytes,
        }),
        ops: r.ops.clone(),
    }
}

/// `--trace` and `--compare-timeline`: writes the Chrome trace (with the prediction when
/// asked) and returns the comparison with the engine's simulated schedule.
fn timelines(
    args: &ExecuteArgs,
    resolved: &Resolved,
    plan: &parsim_plan::Plan,
    report: &parsim_plan::RunReport,
) -> anyhow::Result<Option<TimelineComparison>> {
    let Some(traces) = report.traces.as_deref() else {
        return Ok(None);
    };
    let (program, costs) = parsim::estimate::pipeline(resolved)
        .context("the predicted timeline of the same configuration")?;
    let sim = parsim::schedule::simulate(&program, &costs)
        .context("simulating the predicted timeline")?;
    if let Some(path) = &args.trace {
        let predicted = args.trace_predicted.then_some(&sim);
        let v = measured_chrome_trace(plan, traces, &program, predicted);
        std::fs::write(path, serde_json::to_vec(&v)?)
            .with_context(|| format!("--trace: cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(args
        .compare_timeline
        .then(|| compare_timeline(plan, traces, &program, &sim)))
}

fn text(o: &ExecuteOut) -> String {
    let mut s = format!(
        "backend {}, {} ranks, {} steps; median step {}\nloss per timed step: {}\n",
        o.backend,
        o.world_size,
        o.steps,
        seconds(o.step_s),
        o.loss
            .iter()
            .map(|l| format!("{l:.6}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut t = Table::new();
    t.load_style(presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "rank",
        "tp",
        "cp",
        "ep",
        "dp",
        "pp",
        "step",
        "weights",
        "grads",
        "optimizer",
        "activations",
        "buffers",
        "peak",
        "predicted",
        "diff",
    ]);
    for r in &o.ranks {
        let diff = (r.peak_bytes as f64 - r.predicted_peak_bytes as f64)
            / r.predicted_peak_bytes.max(1) as f64
            * 100.0;
        t.add_row(vec![
            r.rank.to_string(),
            r.coords.tp.to_string(),
            r.coords.cp.to_string(),
            r.coords.ep.to_string(),
            r.coords.dp.to_string(),
            r.coords.pp.to_string(),
            seconds(r.step_s),
            bytes(r.memory.weights as f64),
            bytes(r.memory.gradients as f64),
            bytes(r.memory.optimizer as f64),
            bytes(r.memory.activations as f64),
            bytes(r.memory.buffers as f64),
            bytes(r.peak_bytes as f64),
            bytes(r.predicted_peak_bytes as f64),
            format!("{diff:+.2}%"),
        ]);
    }
    for i in 6..15 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    s.push_str(&t.to_string());
    s.push('\n');
    for r in &o.ranks {
        if let Some(d) = &r.device {
            s.push_str(&format!(
                "rank {} GPU memory: tracked reserved peak {}, pool reserved peak {}, \
                 GPU used {} of {} (cuMemGetInfo); the profile's runtime reserve {} \
                 (context and workspaces, not in the tracked peak)\n",
                r.rank,
                bytes(d.tracked_reserved_peak_bytes as f64),
                bytes(d.pool_reserved_peak_bytes as f64),
                bytes(d.driver_used_bytes as f64),
                bytes(d.driver_total_bytes as f64),
                bytes(d.predicted_runtime_bytes as f64),
            ));
        }
    }
    s.push_str(&cp_text(o));
    if let Some(m) = &o.moe_load {
        s.push_str(&moe_load_text(m));
    }
    if let Some(c) = &o.timeline_comparison {
        s.push_str(&timeline_text(c));
    }
    if let Some(rank) = o.op_classes_rank {
        s.push_str(&execute_ops::text(rank, &o.op_classes));
    }
    for w in &o.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

/// Context parallelism: each ring step's compute and communication, averaged over the ranks
/// (the engine hides step t's exchange behind its compute when the exchange is shorter), and
/// the spread of the causal work over the ranks.
fn cp_text(o: &ExecuteOut) -> String {
    let stats: Vec<&CpStats> = o.ranks.iter().filter_map(|r| r.cp.as_ref()).collect();
    if stats.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "context parallelism, per step of the exchange (mean over ranks, per timed step):\n",
    );
    // `loss` holds one entry per timed step.
    let per = o.loss.len().max(1) as f64 * stats.len() as f64;
    for (label, pick) in [
        (
            "forward",
            (|c: &CpStats| c.forward.clone()) as fn(&CpStats) -> Vec<StepTime>,
        ),
        ("backward", |c: &CpStats| c.backward.clone()),
    ] {
        let n = stats.iter().map(|c| pick(c).len()).max().unwrap_or(0);
        for t in 0..n {
            let (mut comp, mut comm) = (0.0, 0.0);
            for c in &stats {
                if let Some(x) = pick(c).get(t) {
                    comp += x.compute_s;
                    comm += x.comm_s;
                }
            }
            let (comp, comm) = (comp / per, comm / per);
            s.push_str(&format!(
                "  {label} step {t}: compute {}, communication {}{}\n",
                seconds(comp),
                seconds(comm),
                if comm <= comp { " (hideable)" } else { "" }
            ));
        }
    }
    let work: Vec<u64> = stats.iter().map(|c| c.score_elements).collect();
    let (lo, hi) = (
        work.iter().copied().min().unwrap_or(0),
        work.iter().copied().max().unwrap_or(0),
    );
    s.push_str(&format!(
        "  causal work (unmasked scores) per rank: min {lo}, max {hi} (max/min {:.2})\n",
        hi as f64 / lo.max(1) as f64
    ));
    s
}

/// `--compare-timeline` as tables: per rank and kind, then the largest misses.
fn timeline_text(c: &TimelineComparison) -> String {
    let mut t = Table::new();
    t.load_style(presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "rank",
        "kind",
        "count",
        "measured",
        "predicted",
        "diff",
    ]);
    for k in &c.per_kind {
        let (pred, diff) = match k.predicted_s {
            Some(p) => (
                seconds(p),
                format!(
                    "{:+.1}%",
                    (k.measured_s - p) / p.max(f64::MIN_POSITIVE) * 100.0
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        t.add_row(vec![
            k.rank.to_string(),
            k.kind.clone(),
            k.count.to_string(),
            seconds(k.measured_s),
            pred,
            diff,
        ]);
    }
    let mut m = Table::new();
    m.load_style(presets::UTF8_BORDERS_ONLY);
    m.set_header(vec!["rank", "action", "measured", "predicted", "miss"]);
    for a in &c.largest_misses {
        m.add_row(vec![
            a.rank.to_string(),
            a.name.clone(),
            seconds(a.measured_s),
            seconds(a.predicted_s),
            format!(
                "{}{}",
                if a.error_s < 0.0 { "-" } else { "+" },
                seconds(a.error_s.abs())
            ),
        ]);
    }
    format!(
        "measured vs predicted per timed step, by rank and kind of action:\n{t}\nlargest misses (measured - predicted):\n{m}\n"
    )
}
