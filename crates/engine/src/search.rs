//! Search over every valid parallel mix for a GPU count: enumerate (tp, cp and its exchange,
//! pp with even, Megatron-style uneven and cost-balanced splits (search/balance.rs), vpp and
//! schedule, ep, ZeRO stage, micro batch, recomputation), prune what cannot be valid or cannot fit (a memory lower bound, before any
//! timing), estimate the rest on all cores, and rank the mixes that fit by step time.

use crate::config::{Config, ConfigError, CpComm, GpuProfile, Recompute, Resolved, ScheduleKind};
use crate::estimate::{Estimate, Prepared};
use crate::layout::Layout;
use crate::network::Network;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

mod balance;

/// One parallel mix, applied on top of the base configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Mix {
    pub tp: u32,
    pub cp: u32,
    pub cp_comm: CpComm,
    pub pp: u32,
    pub vpp: u32,
    pub schedule: ScheduleKind,
    pub first_stage_layers: Option<u32>,
    pub last_stage_layers: Option<u32>,
    /// Megatron-Core's embedding/loss layer slots (`account_for_*_in_pipeline_split`).
    pub slots: Slots,
    pub ep: u32,
    pub zero: u8,
    pub mbs: u64,
    pub recompute: Recompute,
}

impl Mix {
    /// The configuration of this mix.
    pub fn apply(&self, base: &Config) -> Config {
        let mut c = base.clone();
        let p = &mut c.parallel;
        p.tp = self.tp;
        p.sp = self.tp > 1;
        p.cp = self.cp;
        p.cp_comm = self.cp_comm;
        p.pp = self.pp;
        p.vpp = self.vpp;
        p.schedule = self.schedule;
        p.first_stage_layers = self.first_stage_layers;
        p.last_stage_layers = self.last_stage_layers;
        p.pipeline_layout = None;
        // A balanced split whose middle stages differ by a layer has no first/last-stage form
        // in Megatron-Core: it becomes an explicit layout.
        if let (Some(f), Some(l)) = (self.first_stage_layers, self.last_stage_layers) {
            let layers = c.model.num_layers;
            let middle = self.pp.saturating_sub(2);
            if middle > 0 && layers >= f + l && (layers - f - l) % middle != 0 {
                if let Some(split) = balance::stage_layers(layers, self.pp, f, l) {
                    p.pipeline_layout = Some(balance::layout_string(&split));
                    p.first_stage_layers = None;
                    p.last_stage_layers = None;
                }
            }
        }
        p.account_for_embedding_in_pipeline_split = self.slots.embedding;
        p.account_for_loss_in_pipeline_split = self.slots.loss;
        p.ep = self.ep;
        p.zero = self.zero;
        p.dp = None;
        c.training.micro_batch_size = self.mbs;
        c.training.recompute = self.recompute;
        c
    }

    /// The value of a knob, for constraints.
    fn knob(&self, k: Knob, dp: u32) -> KnobValue {
        match k {
            Knob::Tp => KnobValue::Num(self.tp as u64),
            Knob::Cp => KnobValue::Num(self.cp as u64),
            Knob::Pp => KnobValue::Num(self.pp as u64),
            Knob::Vpp => KnobValue::Num(self.vpp as u64),
            Knob::Dp => KnobValue::Num(dp as u64),
            Knob::Ep => KnobValue::Num(self.ep as u64),
            Knob::Zero => KnobValue::Num(self.zero as u64),
            Knob::Mbs => KnobValue::Num(self.mbs),
            Knob::Schedule => KnobValue::Name(self.schedule.as_str()),
            Knob::Recompute => KnobValue::Name(self.recompute.as_str()),
            Knob::CpComm => KnobValue::Name(self.cp_comm.as_str()),
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp{}", self.tp)?;
        if self.cp > 1 {
            write!(f, " cp{}({})", self.cp, self.cp_comm)?;
        }
        write!(f, " pp{}", self.pp)?;
        if self.vpp > 1 {
            write!(f, "x{}", self.vpp)?;
        }
        if let (Some(a), Some(b)) = (self.first_stage_layers, self.last_stage_layers) {
            write!(f, "[{a}..{b}]")?;
        }
        match (self.slots.embedding, self.slots.loss) {
            (true, true) => write!(f, "[E+L slots]")?,
            (true, false) => write!(f, "[E slot]")?,
            (false, true) => write!(f, "[L slot]")?,
            (false, false) => {}
        }
        if self.pp > 1 {
            write!(f, " {}", self.schedule)?;
        }
        if self.ep > 1 {
            write!(f, " ep{}", self.ep)?;
        }
        write!(f, " zero{} mbs{} {}", self.zero, self.mbs, self.recompute)
    }
}

/// Which of the embedding and the loss take a layer slot in the pipeline split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
pub struct Slots {
    pub embedding: bool,
    pub loss: bool,
}

/// A knob a constraint can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    Tp,
    Cp,
    Pp,
    Vpp,
    Dp,
    Ep,
    Zero,
    Mbs,
    Schedule,
    Recompute,
    CpComm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KnobValue {
    Num(u64),
    Name(&'static str),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Le,
    Ge,
    Lt,
    Gt,
    Eq,
    Ne,
}

/// A filter such as `tp<=4`, `pp=1` or `schedule!=gpipe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub knob: Knob,
    pub cmp: Cmp,
    pub value: String,
}

/// Why a search could not start.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("--constraint '{0}': expected KNOB OP VALUE with KNOB one of tp, cp, pp, vpp, dp, ep, zero, mbs, schedule, recompute, cp_comm and OP one of <=, >=, <, >, =, !=")]
    Syntax(String),
    #[error("--constraint '{text}': {knob} takes {expected}")]
    Value {
        text: String,
        knob: &'static str,
        expected: &'static str,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("search: --mbs-max must be at least 1")]
    MbsMax,
    #[error("search: --top must be at least 1 (how many mixes to list)")]
    Top,
}

impl Constraint {
    /// Parses `KNOB OP VALUE`.
    pub fn parse(text: &str) -> Result<Constraint, SearchError> {
        let t: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let ops = [
            ("<=", Cmp::Le),
            (">=", Cmp::Ge),
            ("!=", Cmp::Ne),
            ("==", Cmp::Eq),
            ("<", Cmp::Lt),
            (">", Cmp::Gt),
            ("=", Cmp::Eq),
        ];
        let (pos, op, cmp) = ops
            .iter()
            .filter_map(|(s, c)| t.find(s).map(|i| (i, *s, *c)))
            .min_by_key(|(i, s, _)| (*i, usize::MAX - s.len()))
            .ok_or_else(|| SearchError::Syntax(text.into()))?;
        let (name, value) = (&t[..pos], &t[pos + op.len()..]);
        let knob = match name {
            "tp" => Knob::Tp,
            "cp" => Knob::Cp,
            "pp" => Knob::Pp,
            "vpp" => Knob::Vpp,
            "dp" => Knob::Dp,
            "ep" => Knob::Ep,
            "zero" => Knob::Zero,
            "mbs" => Knob::Mbs,
            "schedule" => Knob::Schedule,
            "recompute" => Knob::Recompute,
            "cp_comm" | "cp-comm" => Knob::CpComm,
            _ => return Err(SearchError::Syntax(text.into())),
        };
        let named = matches!(knob, Knob::Schedule | Knob::Recompute | Knob::CpComm);
        if value.is_empty() {
            return Err(SearchError::Syntax(text.into()));
        }
        if named {
            let ok = match knob {
                Knob::Schedule => value.parse::<ScheduleKind>().is_ok(),
                Knob::Recompute => value.parse::<Recompute>().is_ok(),
                _ => value.parse::<CpComm>().is_ok(),
            };
            if !ok {
                return Err(SearchError::Value {
                    text: text.into(),
                    knob: "this knob",
                    expected: "a name (e.g. schedule=1f1b, recompute=selective, cp_comm=zigzag)",
                });
            }
            if !matches!(cmp, Cmp::Eq | Cmp::Ne) {
                return Err(SearchError::Value {
                    text: text.into(),
                    knob: "a named knob",
                    expected: "= or != only",
                });
            }
        } else if value.parse::<u64>().is_err() {
            return Err(SearchError::Value {
                text: text.into(),
                knob: "a numeric knob",
                expected: "a non-negative integer",
            });
        }
        Ok(Constraint {
            knob,
            cmp,
            value: value.to_string(),
        })
    }

    fn holds(&self, mix: &Mix, dp: u32) -> bool {
        match mix.knob(self.knob, dp) {
            KnobValue::Num(v) => {
                let c: u64 = self.value.parse().unwrap_or(0);
                match self.cmp {
                    Cmp::Le => v <= c,
                    Cmp::Ge => v >= c,
                    Cmp::Lt => v < c,
                    Cmp::Gt => v > c,
                    Cmp::Eq => v == c,
                    Cmp::Ne => v != c,
                }
            }
            KnobValue::Name(n) => (n == self.value) == (self.cmp == Cmp::Eq),
        }
    }
}

/// What to search.
#[derive(Debug, Clone)]
pub struct SearchSpec {
    /// Model, cluster and training settings; its parallel section is replaced per mix.
    pub base: Config,
    pub mbs_max: u64,
    pub top: usize,
    pub constraints: Vec<Constraint>,
    /// Simulate every candidate that may fit (no step-time bound): slower, same answer.
    pub exhaustive: bool,
}

/// How many candidates were dropped, and why.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Pruned {
    /// Violated a constraint.
    pub constraint: u64,
    /// Failed validation (e.g. Ulysses with indivisible heads, a schedule's microbatch rule).
    pub invalid: u64,
    /// Cannot fit: weights, gradients, optimizer, buffers and one microbatch's activations
    /// already exceed the GPU (checked before any timing).
    pub memory_bound: u64,
    /// Estimated, but the simulated peak does not fit.
    pub memory: u64,
    /// Not simulated: a lower bound of its step time (busy time + data-parallel tail +
    /// optimizer) already loses to the top K, to the best of its schedule and of its ZeRO stage.
    pub time_bound: u64,
}

impl Pruned {
    pub fn total(&self) -> u64 {
        self.constraint + self.invalid + self.memory_bound + self.memory + self.time_bound
    }
}

/// A ranked mix.
#[derive(Debug, Clone, Serialize)]
pub struct Ranked {
    pub mix: Mix,
    #[serde(flatten)]
    pub estimate: Estimate,
}

/// The search's result (`parsim search --json`).
#[derive(Debug, Clone, Serialize)]
pub struct SearchResult {
    pub candidates: u64,
    pub pruned: Pruned,
    pub evaluated: u64,
    pub elapsed_s: f64,
    /// True when interrupted (Ctrl-C): the result covers what was evaluated.
    pub interrupted: bool,
    pub top: Vec<Ranked>,
    /// The fastest fitting mix of each schedule and each ZeRO stage.
    pub best_per_schedule: Vec<Ranked>,
    pub best_per_zero: Vec<Ranked>,
}

fn divisors(n: u64) -> impl Iterator<Item = u64> {
    (1..=n).filter(move |d| n % d == 0)
}

/// The micro batch sizes tried: powers of two up to `mbs_max`, and never above the global
/// batch (a larger one cannot divide it), so a huge `--mbs-max` neither wraps nor loops.
fn micro_batches(mbs_max: u64, gbs: u64) -> impl Iterator<Item = u64> {
    let most = mbs_max.min(gbs);
    (0..u64::BITS)
        .map(|i| 1u64 << i)
        .take_while(move |&b| b <= most)
}

/// One pipeline arrangement: (vpp, schedule, first-stage layers, last-stage layers, slots).
type Pipe = (u32, ScheduleKind, Option<u32>, Option<u32>, Slots);

/// Every pipeline arrangement of `layers` over `pp` ranks: even splits with every vpp that
/// divides them (interleaved) and the V schedules; Megatron-style uneven first/last stages;
/// and the balanced splits that count the embedding and/or the loss as a layer slot, with
/// every vpp those allow (Llama-3-405B's 126 layers + 2 slots over pp 16).
fn pipelines(layers: u32, pp: u32, ends: Option<balance::EndCosts>) -> Vec<Pipe> {
    let none = Slots::default();
    if pp == 1 {
        return vec![(1, ScheduleKind::OneFOneB, None, None, none)];
    }
    let mut pipes = Vec::new();
    let mut splits: Vec<(Option<u32>, Option<u32>)> = Vec::new();
    if layers % pp == 0 {
        splits.push((None, None));
    } else if pp >= 3 {
        // Megatron-style: middle stages take ceil(L/p), the ends share the rest.
        let mid = layers.div_ceil(pp);
        let rest = layers as i64 - (pp as i64 - 2) * mid as i64;
        if rest >= 2 {
            let f = (rest / 2) as u32;
            splits.push((Some(f), Some(rest as u32 - f)));
        }
    }
    // The split that balances the stages' FLOPs when the output layer and loss (and the
    // embedding) are counted: the middle stages share the rest as evenly as they can.
    if let Some(fl) = ends.and_then(|e| balance::balanced_split(layers, pp, e)) {
        let even = layers % pp == 0 && fl == (layers / pp, layers / pp);
        if !even && !splits.contains(&(Some(fl.0), Some(fl.1))) {
            splits.push((Some(fl.0), Some(fl.1)));
        }
    }
    for &(f, l) in &splits {
        for k in [
            ScheduleKind::Gpipe,
            ScheduleKind::OneFOneB,
            ScheduleKind::ZbH1,
        ] {
            pipes.push((1, k, f, l, none));
        }
    }
    if layers % pp == 0 {
        let per = layers / pp;
        for v in (2..=per).filter(|v| per % v == 0) {
            pipes.push((v, ScheduleKind::Interleaved1F1B, None, None, none));
        }
        if per % 2 == 0 {
            pipes.push((2, ScheduleKind::ZbV, None, None, none));
            pipes.push((2, ScheduleKind::DualPipeV, None, None, none));
        }
    }
    for (embedding, loss) in [(true, true), (true, false), (false, true)] {
        let slots_n = layers + embedding as u32 + loss as u32;
        if slots_n % pp != 0 {
            continue;
        }
        let per = slots_n / pp;
        let slots = Slots { embedding, loss };
        // A stage holding only the embedding or only the loss is allowed; one that would
        // hold both (a single slot on a single stage) is not.
        for v in (1..=per).filter(|v| per % v == 0) {
            let k = if v == 1 {
                ScheduleKind::OneFOneB
            } else {
                ScheduleKind::Interleaved1F1B
            };
            pipes.push((v, k, None, None, slots));
        }
    }
    pipes
}

/// Every mix the enumeration produces for `base` (before validation and pruning).
pub fn enumerate(base: &Config, mbs_max: u64) -> Vec<Mix> {
    let c = &base.cluster;
    enumerate_in(
        base,
        mbs_max,
        c.nvlink_domain_size.unwrap_or(c.gpus_per_node),
    )
}

/// [`enumerate`] with tensor parallelism inside NVLink domains of `domain` GPUs.
fn enumerate_in(base: &Config, mbs_max: u64, domain: u32) -> Vec<Mix> {
    let m = &base.model;
    let n = base.cluster.num_gpus as u64;
    let per_node = u64::from(domain);
    let heads = m.num_attention_heads as u64;
    let kv = m.num_query_groups as u64;
    let layers = m.num_layers;
    let seq = base.training.seq_length;
    let gbs = base.training.global_batch_size;
    let ends = balance::end_costs(base);
    let mut out = Vec::new();
    for tp in divisors(n.min(per_node))
        .filter(|t| n % t == 0 && heads % t == 0 && (m.mla.is_some() || kv % t == 0))
    {
        for cp in divisors(n / tp).filter(|c| c.is_power_of_two() && seq % (2 * c) == 0 && *c <= 64)
        {
            let comms: &[CpComm] = if cp > 1 { CpComm::ALL } else { &[CpComm::P2p] };
            for pp in divisors(n / (tp * cp)).filter(|&p| p <= layers as u64) {
                let dp = n / (tp * cp * pp);
                let pp32 = pp as u32;
                let mut pipes = pipelines(layers, pp32, ends);
                pipes.sort_by_key(|p| p.1.as_str());
                let eps: Vec<u64> = if m.is_moe() {
                    divisors(dp)
                        .filter(|e| m.num_experts as u64 % e == 0)
                        .collect()
                } else {
                    vec![1]
                };
                for &ep in &eps {
                    for zero in 0..=3u8 {
                        for mbs in micro_batches(mbs_max, gbs) {
                            // mbs <= gbs and dp <= num_gpus: the product fits in u64.
                            if gbs % (mbs * dp) != 0 {
                                continue;
                            }
                            for recompute in Recompute::ALL.iter().copied() {
                                for &cp_comm in comms {
                                    // Innermost, so that neighbours share a timed ledger.
                                    for &(vpp, schedule, first, last, slots) in &pipes {
                                        out.push(Mix {
                                            tp: tp as u32,
                                            cp: cp as u32,
                                            cp_comm,
                                            pp: pp32,
                                            vpp,
                                            schedule,
                                            first_stage_layers: first,
                                            last_stage_layers: last,
                                            slots,
                                            ep: ep as u32,
                                            zero,
                                            mbs,
                                            recompute,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// What phase 1 made of one candidate.
enum Screened {
    Constraint,
    Invalid,
    MemoryBound,
    /// Worth simulating unless the bound says otherwise.
    Open {
        mix: Mix,
        time_lb: f64,
    },
}

/// Layout-dependent link geometry, computed once per (tp, cp, ep, pp).
type NetworkCache = HashMap<(u32, u32, u32, u32), Network>;

fn network_cache(mixes: &[Mix], base: &Config, gpu: &GpuProfile) -> NetworkCache {
    let n = base.cluster.num_gpus;
    let mut keys: Vec<(u32, u32, u32, u32)> =
        mixes.iter().map(|m| (m.tp, m.cp, m.ep, m.pp)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_par_iter()
        .filter_map(|(tp, cp, ep, pp)| {
            let dp = n / (tp * cp * pp);
            let layout = Layout::new(
                &base.parallel.order,
                tp,
                cp,
                ep,
                dp,
                pp,
                base.cluster.gpus_per_node,
            )
            .and_then(|l| l.with_nvlink_domain(base.cluster.nvlink_domain(gpu)))
            .and_then(|l| l.with_experts_of(base))
            .ok()?;
            Some(((tp, cp, ep, pp), Network::new(&layout, gpu)))
        })
        .collect()
}

fn resolve(mix: &Mix, spec: &SearchSpec, gpu: &GpuProfile) -> Option<Resolved> {
    Resolved::with_gpu(mix.apply(&spec.base), gpu.clone()).ok()
}

/// What a timed ledger depends on within one search: everything but the layer split.
type LedgerKey = (u32, u32, CpComm, u32, ScheduleKind, u32, u8, u64, Recompute);

fn ledger_key(m: &Mix) -> LedgerKey {
    (
        m.tp,
        m.cp,
        m.cp_comm,
        m.pp,
        m.schedule,
        m.ep,
        m.zero,
        m.mbs,
        m.recompute,
    )
}

/// The last timed ledger built while screening a run of neighbouring mixes.
type LedgerCache = Option<(LedgerKey, crate::model::Ledger, crate::model::LedgerSummary)>;

/// Phase 1: validity, the memory lower bound and the step-time lower bound; no simulation.
fn screen(
    mix: &Mix,
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
    cache: &mut LedgerCache,
) -> Screened {
    let dp = spec.base.cluster.num_gpus / (mix.tp * mix.cp * mix.pp);
    if !spec.constraints.iter().all(|c| c.holds(mix, dp)) {
        return Screened::Constraint;
    }
    let Some(r) = resolve(mix, spec, gpu) else {
        return Screened::Invalid;
    };
    let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
    let key = ledger_key(mix);
    let timed = match cache {
        Some((k, l, s)) if *k == key => Some((l.clone(), s.clone())),
        _ => None,
    };
    let Ok(prep) = Prepared::with_ledger(&r, cached, timed) else {
        return Screened::Invalid;
    };
    if !matches!(cache, Some((k, _, _)) if *k == key) {
        let (l, s) = prep.timed_ledger();
        *cache = Some((key, l, s));
    }
    if prep.memory_lower_bound() > r.gpu.usable_memory_bytes() {
        return Screened::MemoryBound;
    }
    Screened::Open {
        mix: *mix,
        time_lb: prep.time_lower_bound(),
    }
}

/// Best step times found so far: the top K, and the best per schedule and per ZeRO stage.
struct Bounds {
    top: Vec<f64>,
    k: usize,
    schedule: HashMap<ScheduleKind, f64>,
    zero: HashMap<u8, f64>,
}

impl Bounds {
    fn kth(&self) -> f64 {
        if self.top.len() < self.k {
            f64::INFINITY
        } else {
            self.top[self.k - 1]
        }
    }

    /// True when a mix whose step is at least `lb` can still enter some list.
    fn can_improve(&self, mix: &Mix, lb: f64) -> bool {
        lb < self.kth()
            || lb < *self.schedule.get(&mix.schedule).unwrap_or(&f64::INFINITY)
            || lb < *self.zero.get(&mix.zero).unwrap_or(&f64::INFINITY)
    }

    fn record(&mut self, mix: &Mix, step: f64) {
        let pos = self.top.partition_point(|&t| t <= step);
        if pos < self.k {
            self.top.insert(pos, step);
            self.top.truncate(self.k);
        }
        let s = self.schedule.entry(mix.schedule).or_insert(f64::INFINITY);
        *s = s.min(step);
        let z = self.zero.entry(mix.zero).or_insert(f64::INFINITY);
        *z = z.min(step);
    }
}

/// Runs the search. `progress(done, total)` is called as work finishes (phase 1 counts the
/// candidates, phase 2 the survivors); setting `cancel` stops it early with what has been
/// evaluated.
pub fn search(
    spec: &SearchSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<SearchResult, SearchError> {
    if spec.mbs_max == 0 {
        return Err(SearchError::MbsMax);
    }
    if spec.top == 0 {
        return Err(SearchError::Top);
    }
    crate::config::check_base(&spec.base)?;
    let start = Instant::now();
    let gpu = GpuProfile::load(&spec.base.cluster.gpu)?;
    let mixes = enumerate_in(
        &spec.base,
        spec.mbs_max,
        spec.base.cluster.nvlink_domain(&gpu),
    );
    let total = mixes.len() as u64;
    let links = network_cache(&mixes, &spec.base, &gpu);

    // Phase 1: screen every candidate.
    let done = AtomicU64::new(0);
    const CHUNK: usize = 512;
    let screened: Vec<Vec<Screened>> = mixes
        .par_chunks(CHUNK)
        .map(|chunk| {
            if cancel.load(Ordering::Relaxed) {
                return Vec::new();
            }
            let mut cache = None;
            let out: Vec<Screened> = chunk
                .iter()
                .map(|m| screen(m, spec, &gpu, &links, &mut cache))
                .collect();
            let d = done.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            progress(d, total);
            out
        })
        .collect();
    let mut pruned = Pruned::default();
    let mut open: Vec<(Mix, f64)> = Vec::new();
    for s in screened.into_iter().flatten() {
        match s {
            Screened::Constraint => pruned.constraint += 1,
            Screened::Invalid => pruned.invalid += 1,
            Screened::MemoryBound => pruned.memory_bound += 1,
            Screened::Open { mix, time_lb } => open.push((mix, time_lb)),
        }
    }

    // Phase 2: simulate in order of the lower bound, skipping what cannot win.
    open.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut bounds = Bounds {
        top: Vec::new(),
        k: spec.top.max(1),
        schedule: HashMap::new(),
        zero: HashMap::new(),
    };
    let mut fits: Vec<Ranked> = Vec::new();
    let mut evaluated = 0;
    let threads = rayon::current_num_threads().max(1);
    let mut i = 0;
    while i < open.len() && !cancel.load(Ordering::Relaxed) {
        let batch: Vec<&(Mix, f64)> = open[i..].iter().take(4 * threads).collect();
        i += batch.len();
        let (todo, skip): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|(m, lb)| spec.exhaustive || bounds.can_improve(m, *lb));
        pruned.time_bound += skip.len() as u64;
        let results: Vec<Option<Ranked>> = todo
            .par_iter()
            .map(|(mix, _)| {
                let r = resolve(mix, spec, &gpu)?;
                let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
                let e = Prepared::new(&r, cached).ok()?.finish_with(false).ok()?;
                Some(Ranked {
                    mix: *mix,
                    estimate: e,
                })
            })
            .collect();
        for r in results {
            evaluated += 1;
            match r {
                Some(r) if r.estimate.memory.fits => {
                    bounds.record(&r.mix, r.estimate.time.step_s);
                    fits.push(r);
                }
                Some(_) => pruned.memory += 1,
                None => pruned.invalid += 1,
            }
        }
        progress(total.min(done.load(Ordering::Relaxed)), total);
    }
    if cancel.load(Ordering::Relaxed) {
        pruned.time_bound += (open.len() - i) as u64;
    }

    fits.sort_by(|a, b| {
        a.estimate
            .time
            .step_s
            .total_cmp(&b.estimate.time.step_s)
            .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
    });
    let best_by = |key: &dyn Fn(&Ranked) -> String| -> Vec<Ranked> {
        let mut seen = std::collections::BTreeSet::new();
        fits.iter()
            .filter(|r| seen.insert(key(r)))
            .cloned()
            .collect()
    };
    let mut best_per_schedule = best_by(&|r| r.mix.schedule.as_str().to_string());
    let mut best_per_zero = best_by(&|r| r.mix.zero.to_string());
    fits.truncate(spec.top);
    // Ranked without the bubble's split by cause; what is reported gets the full estimate
    // (the same step time: the split only names the parts of the idle time). The mix was
    // estimated once already, so this cannot fail; were it to, the ranked figures stay.
    for list in [&mut fits, &mut best_per_schedule, &mut best_per_zero] {
        list.par_iter_mut().for_each(|ranked| {
            let m = &ranked.mix;
            let full = resolve(m, spec, &gpu).and_then(|r| {
                let cached = links.get(&(m.tp, m.cp, m.ep, m.pp)).cloned();
                Prepared::new(&r, cached).ok()?.finish().ok()
            });
            if let Some(e) = full {
                ranked.estimate = e;
            }
        });
    }
    Ok(SearchResult {
        candidates: total,
        pruned,
        evaluated,
        elapsed_s: start.elapsed().as_secs_f64(),
        interrupted: cancel.load(Ordering::Relaxed),
        top: fits,
        best_per_schedule,
        best_per_zero,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_parse_and_hold() {
        let c = Constraint::parse("tp <= 4").unwrap();
        assert_eq!((c.knob, c.cmp), (Knob::Tp, Cmp::Le));
        let m = Mix {
            tp: 8,
            cp: 1,
            cp_comm: CpComm::P2p,
            pp: 2,
            vpp: 1,
            schedule: ScheduleKind::OneFOneB,
            first_stage_layers: None,
            last_stage_layers: None,
            slots: Slots::default(),
            ep: 1,
            zero: 1,
            mbs: 1,
            recompute: Recompute::Selective,
        };
        assert!(!c.holds(&m, 4));
        assert!(Constraint::parse("pp=2").unwrap().holds(&m, 4));
        assert!(Constraint::parse("dp>=4").unwrap().holds(&m, 4));
        assert!(Constraint::parse("schedule!=gpipe").unwrap().holds(&m, 4));
        assert!(!Constraint::parse("schedule=gpipe").unwrap().holds(&m, 4));
        assert!(matches!(
            Constraint::parse("tpp<=4"),
            Err(SearchError::Syntax(_))
        ));
        assert!(matches!(
            Constraint::parse("tp<=four"),
            Err(SearchError::Value { .. })
        ));
        assert!(matches!(
            Constraint::parse("schedule<=1f1b"),
            Err(SearchError::Value { .. })
        ));
        assert!(matches!(
            Constraint::parse("schedule=foo"),
            Err(SearchError::Value { .. })
        ));
    }
}
