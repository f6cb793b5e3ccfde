//! Extreme numbers, two and three at a time: every numeric field and flag of a configuration
//! (and of `schedule`'s, `search`'s, `layout`'s and `execute`'s own arguments) drawn from the
//! edges of the integer types, 0, 1, 2, 2^16, 2^31, 2^32-1 and 2^53, and run through the
//! command's library path. Each case must end in an answer or a refusal: no panic (an integer
//! product that wraps or overflows is one in a debug build), no case past [`CASE_LIMIT`], no
//! NaN, infinity or stray null in the JSON. One-field extremes are refused cleanly elsewhere;
//! products of two or three fields are where an overflow hides.
//!
//! The fields come from the configurations themselves (every number, boolean and unset
//! option of a base configuration serialized), so a field added later is drawn too.

use crate::common::non_numbers;
use parsim::config::{Config, CpComm, Layer, Precision, Recompute, Resolved, ScheduleKind};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestCaseError, TestRng};
use proptest::test_runner::{TestError, TestRunner};
use serde_json::{json, Value};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The values every numeric field is drawn from: the edges of u16, u32 and f64's integers.
pub const EDGES: [u64; 7] = [0, 1, 2, 1 << 16, 1 << 31, u32::MAX as u64, 1 << 53];

/// The longest one case may take (debug build, shared cores): past it the case hangs.
pub const CASE_LIMIT: Duration = Duration::from_secs(10);

/// How long a search runs before it is cancelled (a space of thousands of mixes, each
/// estimate simulating up to [`parsim::schedule::MAX_CELLS`] cells, takes minutes in a debug
/// build): the cancelled search must still answer within [`CASE_LIMIT`].
const SEARCH_BUDGET: Duration = Duration::from_secs(3);

/// What a case runs: one command's library path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Estimate,
    Search,
    Schedule,
    Layout,
    Execute,
}

impl Command {
    pub const ALL: [Command; 5] = [
        Command::Estimate,
        Command::Search,
        Command::Schedule,
        Command::Layout,
        Command::Execute,
    ];
}

/// One drawn input: a command, its base configuration and the fields set to drawn values.
#[derive(Debug, Clone)]
pub struct Case {
    pub command: Command,
    /// Index into [`bases`].
    pub base: usize,
    /// `section.key` (or a command argument's name) and its value.
    pub fields: Vec<(String, Value)>,
}

impl Case {
    /// The case as an override document (configuration fields only) and the command's own
    /// arguments.
    pub fn split(&self) -> (Value, Vec<(String, Value)>) {
        let mut doc = json!({});
        let mut args = Vec::new();
        for (path, v) in &self.fields {
            match path.split_once('.') {
                Some((section, rest)) => set_path(&mut doc[section], rest, v.clone()),
                None => args.push((path.clone(), v.clone())),
            }
        }
        (doc, args)
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (doc, args) = self.split();
        write!(f, "{:?} on base {} with {doc}", self.command, self.base)?;
        for (k, v) in args {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// Sets `path` (dot-separated) inside `v`, making objects on the way.
fn set_path(v: &mut Value, path: &str, x: Value) {
    if !v.is_object() {
        *v = json!({});
    }
    match path.split_once('.') {
        Some((head, rest)) => set_path(&mut v[head], rest, x),
        None => v[path] = x,
    }
}

/// The base configurations: the defaults (a dense model with TP and SP), a small MoE model
/// with multi-latent attention, a Mamba hybrid, and a pipeline with virtual stages. The search
/// base is small (every case searches all its mixes).
pub fn bases() -> Vec<Value> {
    vec![
        json!({}),
        json!({"model": {"preset": "deepseek-v3", "num_layers": 4, "num_experts": 8,
                         "moe_router_topk": 2, "moe_router_num_groups": 0,
                         "moe_router_group_topk": 0, "moe_first_k_dense": 1},
               "cluster": {"num_gpus": 16},
               "parallel": {"tp": 2, "ep": 4, "expert_tp": 1},
               "training": {"seq_length": 4096, "global_batch_size": 64}}),
        json!({"model": {"preset": "nemotron-h-8b"}, "cluster": {"num_gpus": 8},
               "parallel": {"tp": 2}}),
        json!({"cluster": {"num_gpus": 16},
               "parallel": {"tp": 2, "pp": 4, "vpp": 2, "schedule": "interleaved-1f1b",
                            "first_stage_layers": null},
               "training": {"global_batch_size": 64}}),
    ]
}

/// The search's base: a small dense model on 8 GPUs.
fn search_base() -> Value {
    json!({"model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                     "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1000},
           "cluster": {"num_gpus": 8},
           "training": {"seq_length": 256, "global_batch_size": 64}})
}

/// Every numeric field, flag and unset option of `cfg` as `section.key` paths, each with
/// how it is drawn.
fn leaf_paths(v: &Value, prefix: &str, out: &mut Vec<(String, FieldKind)>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_paths(x, &p, out);
            }
        }
        Value::Number(n) if n.is_f64() => out.push((prefix.to_string(), FieldKind::Fraction)),
        Value::Number(_) | Value::Null => out.push((prefix.to_string(), FieldKind::Number)),
        Value::Bool(_) => out.push((prefix.to_string(), FieldKind::Flag)),
        _ => {}
    }
}

/// The fields drawn for `command` on the base `doc`: its configuration's numbers and flags
/// (the parallel section is searched, so not drawn for `search`), the closed vocabularies
/// that choose a code path (schedule, CP exchange, precision, recompute), and the command's
/// own numeric arguments.
fn fields_of(command: Command, doc: &Value) -> Vec<(String, FieldKind)> {
    let mut out = Vec::new();
    if command != Command::Schedule {
        let cfg = Config::from_layers(&[Layer::overrides(doc.clone())]).expect("a base loads");
        let mut leaves = Vec::new();
        leaf_paths(&serde_json::to_value(&cfg).unwrap(), "", &mut leaves);
        out.extend(
            leaves
                .into_iter()
                .filter(|(path, _)| command != Command::Search || !path.starts_with("parallel.")),
        );
        let vocab = [
            (
                "parallel.schedule",
                names(ScheduleKind::ALL, ScheduleKind::as_str),
            ),
            ("parallel.cp_comm", names(CpComm::ALL, CpComm::as_str)),
            (
                "training.precision",
                names(Precision::ALL, Precision::as_str),
            ),
            (
                "training.recompute",
                names(Recompute::ALL, Recompute::as_str),
            ),
        ];
        for (path, kind) in vocab {
            if command != Command::Search || !path.starts_with("parallel.") {
                out.push((path.to_string(), kind));
            }
        }
    }
    let own: &[&str] = match command {
        Command::Estimate => &[],
        Command::Search => &["mbs_max", "top"],
        Command::Schedule => &[
            "pp",
            "vpp",
            "microbatches",
            "microbatch_group_size",
            "f",
            "b",
            "w",
            "p2p",
            "overlap_factor",
        ],
        Command::Layout => &["rank"],
        Command::Execute => &["steps", "warmup", "seed"],
    };
    out.extend(own.iter().map(|k| (k.to_string(), FieldKind::Number)));
    if command == Command::Schedule {
        out.push((
            "kind".into(),
            names(ScheduleKind::ALL, ScheduleKind::as_str),
        ));
    }
    out
}

/// A closed vocabulary's every spelling, drawn as a field's value.
fn names<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> FieldKind {
    FieldKind::Name(all.iter().map(|&k| name(k)).collect())
}

/// A base's drawn fields: `section.key` (or an argument's name) and how it is drawn.
type Fields = Vec<(String, FieldKind)>;

/// A field and the largest value the rules accept for it.
type Bounded = (String, u64);

/// How a field is drawn.
#[derive(Debug, Clone)]
enum FieldKind {
    /// An integer or an unset option: from [`EDGES`].
    Number,
    /// A real number (a probability, a factor): from [`EDGES`] too.
    Fraction,
    Flag,
    Name(Vec<&'static str>),
}

/// The strategy: four cases in five at the integer edges ([`edge_cases`]), one with sizes at
/// the largest values the rules accept ([`largest_cases`]).
pub fn cases() -> impl Strategy<Value = Case> {
    prop_oneof![4 => edge_cases(), 1 => largest_cases()]
}

/// A command, a base, and two or three distinct fields with drawn values.
fn edge_cases() -> impl Strategy<Value = Case> {
    let per_command: Vec<(Command, usize, Fields)> = Command::ALL
        .iter()
        .flat_map(|&command| {
            let docs = if command == Command::Search {
                vec![search_base()]
            } else {
                bases()
            };
            docs.into_iter()
                .enumerate()
                .map(move |(i, doc)| (command, i, fields_of(command, &doc)))
                .collect::<Vec<_>>()
        })
        .collect();
    proptest::sample::select(per_command).prop_flat_map(|(command, base, fields)| {
        // Three draws in four from the integers, where products overflow; one from every field.
        let integers: Vec<usize> = (0..fields.len())
            .filter(|&i| matches!(fields[i].1, FieldKind::Number))
            .collect();
        let every: Vec<usize> = (0..fields.len()).collect();
        let picks = prop_oneof![
            3 => proptest::sample::subsequence(integers.clone(), 2..=3.min(integers.len())),
            1 => proptest::sample::subsequence(every, 2..=3),
        ];
        picks.prop_flat_map(move |picked| {
            let values: Vec<BoxedStrategy<(String, Value)>> = picked
                .iter()
                .map(|&i| {
                    let (path, kind) = fields[i].clone();
                    value_of(kind).prop_map(move |v| (path.clone(), v)).boxed()
                })
                .collect();
            values.prop_map(move |fields| Case {
                command,
                base,
                fields,
            })
        })
    })
}

/// The largest value the rules accept for `path` on `base`: read from the violation that
/// u32::MAX draws ("must be at most N"); None where no rule bounds the field that way.
fn accepted_max(base: &Value, path: &str) -> Option<u64> {
    let mut doc = json!({});
    let (section, rest) = path.split_once('.')?;
    set_path(&mut doc[section], rest, json!(u32::MAX));
    let cfg = Config::from_layers(&[Layer::overrides(base.clone()), Layer::overrides(doc)]).ok()?;
    // The probe is a case of its own: a panic here fails the test naming the field.
    let resolved = std::panic::catch_unwind(|| Resolved::new(cfg))
        .unwrap_or_else(|_| panic!("{path} = {} on base {base} panicked", u32::MAX));
    let Err(parsim::config::ConfigError::Invalid(violations)) = resolved else {
        return None;
    };
    let v = violations.iter().find(|v| v.field == path)?;
    let (_, after) = v.rule.split_once("at most ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Sizes at the top of their accepted ranges, two to five at once, where the products the
/// edge values leave small (tokens x widths x layers) are largest: a size rule that bounds
/// each field but not their products shows here.
fn largest_cases() -> impl Strategy<Value = Case> {
    let per_base: Vec<(Command, usize, Vec<Bounded>)> = bases()
        .iter()
        .enumerate()
        .flat_map(|(i, doc)| {
            let bounded: Vec<Bounded> = fields_of(Command::Estimate, doc)
                .into_iter()
                .filter(|(_, kind)| matches!(kind, FieldKind::Number))
                .filter_map(|(path, _)| Some((path.clone(), accepted_max(doc, &path)?)))
                .collect();
            [Command::Estimate, Command::Layout, Command::Execute].map(|c| (c, i, bounded.clone()))
        })
        .collect();
    proptest::sample::select(per_base).prop_flat_map(|(command, base, fields)| {
        let n = fields.len();
        proptest::sample::subsequence(fields, 2..=5.min(n)).prop_flat_map(move |picked| {
            let values: Vec<BoxedStrategy<(String, Value)>> = picked
                .into_iter()
                .map(|(path, max)| {
                    proptest::sample::select(vec![max, max / 2, max / 64, 1])
                        .prop_map(move |v| (path.clone(), json!(v)))
                        .boxed()
                })
                .collect();
            values.prop_map(move |fields| Case {
                command,
                base,
                fields,
            })
        })
    })
}

fn value_of(kind: FieldKind) -> BoxedStrategy<Value> {
    match kind {
        FieldKind::Number | FieldKind::Fraction => proptest::sample::select(EDGES.to_vec())
            .prop_map(|v| json!(v))
            .boxed(),
        FieldKind::Flag => any::<bool>().prop_map(|b| json!(b)).boxed(),
        FieldKind::Name(names) => proptest::sample::select(names)
            .prop_map(|s| json!(s))
            .boxed(),
    }
}

/// Why a case failed.
#[derive(Debug)]
pub enum Failure {
    /// A panic, or a non-number in the JSON: shrunk to a smallest case.
    Wrong(String),
    /// No answer within [`CASE_LIMIT`]: reported as drawn (its thread runs on, so the cases
    /// after it would be timed on a busier machine).
    Hang(String),
}

/// Runs `case` on a thread of its own: a panic, a case past [`CASE_LIMIT`] (reported without
/// waiting for it to end) or a non-number in its JSON is a failure naming the case.
pub fn check(case: &Case) -> Result<(), Failure> {
    let (tx, rx) = mpsc::channel();
    let owned = case.clone();
    std::thread::Builder::new()
        .name("extreme case".into())
        .spawn(move || {
            let out = std::panic::catch_unwind(|| run(&owned));
            let _ = tx.send(out);
        })
        .map_err(|e| Failure::Wrong(format!("cannot start a thread: {e}")))?;
    match rx.recv_timeout(CASE_LIMIT) {
        Err(_) => Err(Failure::Hang(format!(
            "{case}: no answer within {CASE_LIMIT:?}"
        ))),
        Ok(Err(panic)) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Failure::Wrong(format!("{case}: panicked: {msg}")))
        }
        Ok(Ok(Some(json))) => match non_numbers(&json) {
            Some(bad) => Err(Failure::Wrong(format!("{case}: {bad} in the output"))),
            None => Ok(()),
        },
        Ok(Ok(None)) => Ok(()),
    }
}

/// The configuration of a case, or None where loading refuses it (a value that does not fit
/// the field's type, a rule it breaks: a clean refusal either way).
fn config(case: &Case, doc: &Value) -> Option<Config> {
    let base = bases()[case.base].clone();
    Config::from_layers(&[Layer::overrides(base), Layer::overrides(doc.clone())]).ok()
}

fn arg(args: &[(String, Value)], name: &str) -> Option<u64> {
    args.iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_u64())
}

/// The command's library path: its JSON where it answered, None where it refused.
fn run(case: &Case) -> Option<Value> {
    let (doc, args) = case.split();
    match case.command {
        Command::Estimate => {
            let est = parsim::estimate::estimate(&Resolved::new(config(case, &doc)?).ok()?).ok()?;
            Some(serde_json::to_value(&est).expect("an estimate serializes"))
        }
        Command::Layout => {
            let resolved = Resolved::new(config(case, &doc)?).ok()?;
            let layout = parsim::layout::Layout::of(&resolved);
            let rank = arg(&args, "rank").and_then(|r| u32::try_from(r).ok());
            let _ = parsim::report::layout::layout_text(
                &layout,
                &resolved.config.parallel.order,
                false,
                rank.filter(|&r| r < layout.world()),
            );
            // `layout --json` lists every rank of worlds of at most 2^16 ranks.
            (layout.world() <= 1 << 16).then(|| parsim::report::layout::layout_json(&layout))
        }
        Command::Execute => execute(case, &doc, &args),
        Command::Search => search(&doc, &args),
        Command::Schedule => schedule(&doc, &args),
    }
}

/// `execute --backend cpu` up to its Plan: the CPU profile and fp32 as the command sets them,
/// its checks of the run flags and of the rank count, the estimate it compares with, the
/// lowering and the Plan's validation; never the run.
fn execute(case: &Case, doc: &Value, args: &[(String, Value)]) -> Option<Value> {
    let steps = arg(args, "steps").unwrap_or(3);
    let warmup = arg(args, "warmup").unwrap_or(1);
    let seed = arg(args, "seed").unwrap_or(1234);
    if steps == 0 || warmup >= steps || steps > u32::MAX as u64 {
        return None;
    }
    let mut cfg = config(case, doc)?;
    cfg.cluster.gpu = "cpu".into();
    cfg.training.precision = Precision::Fp32;
    cfg.training.grad_dtype = parsim::config::Dtype::Fp32;
    let resolved = Resolved::new(cfg).ok()?;
    if resolved.world() > 256 {
        return None;
    }
    let est = parsim::estimate::estimate(&resolved).ok()?;
    let plan = parsim::lower::lower(
        &resolved,
        &parsim::lower::LowerOptions {
            seed,
            ..Default::default()
        },
    )
    .ok()?;
    plan.validate().ok()?;
    Some(json!({"estimate": est, "microbatches": plan.microbatches}))
}

fn search(doc: &Value, args: &[(String, Value)]) -> Option<Value> {
    use parsim::search::SearchSpec;
    use std::sync::atomic::AtomicBool;
    let base = Config::from_layers(&[
        Layer::overrides(search_base()),
        Layer::overrides(doc.clone()),
    ])
    .ok()?;
    let top = arg(args, "top").map_or(3, |t| usize::try_from(t).unwrap_or(usize::MAX));
    // A top list longer than the space turns the step-time pruning off: every mix is
    // simulated, as asked (minutes in a debug build). Such cases pin the degrees, so that a
    // handful of mixes remain.
    let constraints = if top > 16 {
        ["tp=1", "cp=1", "pp=1"]
            .iter()
            .map(|c| parsim::search::Constraint::parse(c).expect("a constraint parses"))
            .collect()
    } else {
        Vec::new()
    };
    let spec = SearchSpec {
        base,
        mbs_max: arg(args, "mbs_max").unwrap_or(4),
        top,
        constraints,
        exhaustive: false,
    };
    // A search past SEARCH_BUDGET is cancelled, as Ctrl-C cancels it: it must then answer
    // with what it evaluated well within CASE_LIMIT.
    let cancel = std::sync::Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let watchdog = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            if wait.recv_timeout(SEARCH_BUDGET) == Err(mpsc::RecvTimeoutError::Timeout) {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let result = parsim::search::search(&spec, &|_, _| {}, &cancel);
    drop(done);
    let _ = watchdog.join();
    Some(serde_json::to_value(&result.ok()?).expect("a search result serializes"))
}

fn schedule(doc: &Value, args: &[(String, Value)]) -> Option<Value> {
    use parsim::schedule::{generate_with, natural_vpp, simulate, Costs, GenerateOptions};
    let _ = doc;
    let u32_arg = |name: &str, default: u32| -> Option<u32> {
        match args.iter().find(|(k, _)| k == name) {
            Some((_, v)) => u32::try_from(v.as_u64()?).ok(),
            None => Some(default),
        }
    };
    let f64_arg = |name: &str, default: f64| {
        args.iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_f64())
            .unwrap_or(default)
    };
    let kind: ScheduleKind = args
        .iter()
        .find(|(k, _)| k == "kind")
        .and_then(|(_, v)| v.as_str()?.parse().ok())
        .unwrap_or(ScheduleKind::Interleaved1F1B);
    let pp = u32_arg("pp", 4)?;
    let vpp = u32_arg("vpp", natural_vpp(kind))?;
    let m = u32_arg("microbatches", 8)?;
    let group = match args.iter().find(|(k, _)| k == "microbatch_group_size") {
        Some((_, v)) => Some(u32::try_from(v.as_u64()?).ok()?),
        None => None,
    };
    let program = generate_with(
        kind,
        pp,
        vpp,
        m,
        &GenerateOptions {
            microbatch_group_size: group,
        },
    )
    .ok()?;
    let per_chunk = 1.0 / vpp.max(1) as f64;
    let w = args
        .iter()
        .find(|(k, _)| k == "w")
        .and_then(|(_, v)| v.as_f64());
    let costs = Costs::uniform(
        pp,
        vpp,
        f64_arg("f", 1.0) * per_chunk,
        f64_arg("b", 2.0) * per_chunk,
        w.map(|w| w * per_chunk),
        f64_arg("p2p", 0.0),
    )
    .and_then(|c| c.with_overlap_factor(f64_arg("overlap_factor", 1.0)))
    .ok()?;
    let sim = simulate(&program, &costs).ok()?;
    let doc = parsim::report::schedule_json::schedule_json(&program, &sim);
    // Large timelines (2^16 microbatches print 150 MB of JSON) are checked number by number.
    if doc.ranks.iter().map(|r| r.actions.len()).sum::<usize>() <= 1 << 14 {
        return Some(serde_json::to_value(&doc).expect("a schedule serializes"));
    }
    let spans = doc.ranks.iter().flat_map(|r| &r.actions);
    let numbers: Vec<f64> = [doc.makespan, doc.bubble_fraction]
        .into_iter()
        .chain(spans.flat_map(|a| [a.start, a.end]))
        .collect();
    // A NaN or an infinity becomes a null, which the check names.
    let bad = numbers.iter().find(|x| !x.is_finite());
    Some(bad.map_or_else(|| json!({}), |x| json!({"span": x})))
}

/// The seed `PARSIM_FUZZ_SEED` names (default 18, the fuzz suite's), as proptest's 32 bytes.
pub fn seed() -> (u64, [u8; 32]) {
    let seed: u64 = std::env::var("PARSIM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(18);
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes(),
        );
    }
    (seed, bytes)
}

/// A runner over the suite's seed and `cases_n` cases, as [`run_cases`] draws them.
pub fn runner(cases_n: u32) -> TestRunner {
    let (_, bytes) = seed();
    TestRunner::new_with_rng(
        RunnerConfig {
            cases: cases_n,
            failure_persistence: None,
            max_shrink_iters: 256,
            ..RunnerConfig::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// The configuration a case draws (its base with its fields over it), or None where loading
/// refuses it.
pub fn case_config(case: &Case) -> Option<Config> {
    config(case, &case.split().0)
}

/// Runs `cases` drawn cases from the seed; a failure is shrunk to a smallest failing case and
/// reported with the seed that replays it.
pub fn run_cases(cases_n: u32) -> Result<u32, String> {
    let (seed, _) = seed();
    eprintln!(
        "extreme numbers: {cases_n} cases, seed {seed} (PARSIM_FUZZ_SEED={seed} replays them)"
    );
    let mut runner = runner(cases_n);
    let start = Instant::now();
    let hang = std::cell::RefCell::new(None);
    let result = runner.run(&cases(), |case| {
        if hang.borrow().is_some() {
            return Ok(());
        }
        match check(&case) {
            Ok(()) => Ok(()),
            Err(Failure::Wrong(why)) => Err(TestCaseError::fail(why)),
            Err(Failure::Hang(why)) => {
                *hang.borrow_mut() = Some(why);
                Ok(())
            }
        }
    });
    eprintln!("extreme numbers: {cases_n} cases in {:?}", start.elapsed());
    if let Some(why) = hang.into_inner() {
        return Err(format!("seed {seed} (PARSIM_FUZZ_SEED={seed}): {why}"));
    }
    match result {
        Ok(()) => Ok(cases_n),
        Err(TestError::Fail(why, case)) => Err(format!(
            "seed {seed} (PARSIM_FUZZ_SEED={seed}): {why}\nsmallest failing case: {case}"
        )),
        Err(e) => Err(format!("seed {seed}: {e}")),
    }
}
