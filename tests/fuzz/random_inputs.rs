//! Bounded random-input testing (issue 18), run by `cargo test` in CI: seeded, so a failure
//! is reproducible, and printed with the input that caused it. Configurations, Hugging Face
//! files, measurement lines and schedules go through the library in-process (thousands of
//! cases in seconds); a few dozen flag sets go through the binary. Each must finish without
//! a panic, within a time bound, and with no null (other than an unset optional field), NaN
//! or infinity in its JSON. Set `PARSIM_FUZZ_SEED` to explore other inputs, and
//! `PARSIM_FUZZ_CASES` to run that many cases in each in-process test (other than the
//! search's, whose every case searches a whole space).

use crate::common::non_numbers;
use crate::extreme_numbers_rules as extreme_numbers;
use assert_cmd::cargo::cargo_bin_cmd;
use parsim::config::{Config, Layer, Resolved};
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The longest one in-process case may take (debug build, shared cores).
const CASE_LIMIT: Duration = Duration::from_secs(10);

/// `default` cases, or `PARSIM_FUZZ_CASES` where set.
fn case_count(default: usize) -> usize {
    std::env::var("PARSIM_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: small, seeded, good enough to pick inputs.
struct Rng(u64);

impl Rng {
    fn seeded(salt: u64) -> Rng {
        let seed = std::env::var("PARSIM_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(18);
        Rng(seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A value from the edges of every type: zero, huge, negative, fractional, a string, a bool.
fn wild(r: &mut Rng) -> Value {
    r.pick(&[
        json!(0),
        json!(1),
        json!(-1),
        json!(3),
        json!(1000),
        json!(65536),
        json!(u32::MAX),
        json!(1u64 << 32),
        json!(1u64 << 53),
        json!(u64::MAX),
        json!(0.5),
        json!(1.5),
        json!(1e300),
        json!(-1e-300),
        json!(1e-300),
        json!("yes"),
        json!("8"),
        json!(true),
        json!(null),
        json!([1]),
        json!({}),
    ])
}

/// Plausible values per field, so that many random configurations validate and go deep.
fn plausible(r: &mut Rng, key: &str) -> Value {
    let ints = |r: &mut Rng, xs: &[u64]| json!(r.pick(xs));
    match key {
        "preset" => json!(r.pick(parsim::config::presets::PRESET_NAMES)),
        "num_layers" => ints(r, &[1, 2, 4, 8, 12, 16, 24, 32, 61, 80, 126]),
        "hidden_size" => ints(r, &[64, 128, 1024, 4096, 8192, 12288]),
        "num_attention_heads" | "num_query_groups" => ints(r, &[1, 2, 4, 8, 16, 32, 64, 96]),
        "ffn_hidden_size" | "moe_ffn_hidden_size" | "moe_shared_expert_intermediate_size" => {
            ints(r, &[0, 256, 1024, 2048, 14336, 28672])
        }
        "vocab_size" => ints(r, &[1, 1000, 32000, 128256]),
        "kv_channels" => ints(r, &[0, 64, 128]),
        "num_experts" => ints(r, &[0, 1, 2, 8, 64, 256]),
        "moe_router_topk" => ints(r, &[0, 1, 2, 8, 9]),
        "moe_first_k_dense" | "mtp_num_layers" => ints(r, &[0, 1, 3, 32]),
        "moe_load_imbalance" => json!(r.pick(&[1.0, 1.3, 4.0, 100.0, 1e300])),
        "moe_capacity_factor" => json!(r.pick(&[0.0, 0.5, 1.0, 1.25])),
        "moe_dropped_fraction" => json!(r.pick(&[0.0, 0.5, 0.99, 1.0, -0.1])),
        "attention_dropout" | "hidden_dropout" => json!(r.pick(&[0.0, 0.1, 0.99, 1.0])),
        "max_position_embeddings" => ints(r, &[512, 4096, 131072]),
        "make_vocab_size_divisible_by" => ints(r, &[1, 64, 128]),
        "window_size" => ints(r, &[0, 1, 128, 4096, 1 << 20]),
        "attention_chunk_size" => ints(r, &[0, 1, 8192]),
        "window_attn_skip_freq" => ints(r, &[0, 1, 2, 4]),
        "moe_layer_pattern" => json!(r.pick(&[vec![0u8, 1], vec![1, 0, 1, 0], vec![], vec![2]])),
        "hybrid_layer_pattern" => json!(r.pick(&[
            "M*M-",
            "M-M-M-M*",
            "MEME",
            "",
            "MX",
            "E",
            "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
            "m*m-",
            "M*M-\u{0}"
        ])),
        "mamba" => json!(r.pick(&[
            json!({"num_heads": 8, "head_dim": 64, "state_dim": 16, "num_groups": 2}),
            json!({"num_heads": 0, "head_dim": 64, "state_dim": 16, "num_groups": 0}),
            json!({"num_heads": 6, "head_dim": 1, "state_dim": 1, "num_groups": 4, "chunk_size": 0}),
        ])),
        "tied_embeddings"
        | "qk_layernorm"
        | "attention_sinks"
        | "moe_router_linear_bias"
        | "sp"
        | "tp_comm_overlap"
        | "overlap_grad_reduce"
        | "overlap_param_gather"
        | "cp_comm_overlap"
        | "account_for_embedding_in_pipeline_split"
        | "account_for_loss_in_pipeline_split"
        | "flash_attention" => json!(r.chance(50)),
        "pipeline_layout" => json!(r.pick(&[
            "Et*16|t*16L",
            "Et*8|(t*8|)*2,t*8L",
            "Et|t|tL",
            "E(t|)*31,tL",
            "((t|)*99999)*99999",
            "Et*16||t*16L",
            "Ex|L",
            ""
        ])),
        // Every shipped profile (config/gpu.rs `SHIPPED`), so a new one is fuzzed too.
        "gpu" => json!(r.pick(&parsim::config::GpuProfile::shipped_names())),
        "num_gpus" => ints(r, &[1, 2, 4, 8, 16, 64, 512, 4096, 65536]),
        "gpus_per_node" => ints(r, &[1, 2, 4, 8, 16]),
        "nvlink_domain_size" => ints(r, &[0, 1, 4, 8, 64, 72, 576]),
        "tp" | "cp" | "ep" | "expert_tp" | "dp" => ints(r, &[1, 2, 4, 8, 16]),
        "pp" => ints(r, &[1, 2, 3, 4, 8, 16, 32, 64]),
        "vpp" => ints(r, &[1, 2, 3, 4]),
        "zero" => ints(r, &[0, 1, 2, 3, 4]),
        "fsdp" => json!(r.pick(&["megatron", "torch", "jax", ""])),
        "first_stage_layers" | "last_stage_layers" => ints(r, &[0, 1, 2, 5, 30]),
        "ddp_bucket_size" => ints(r, &[0, 1, 1000, 40_000_000]),
        "cp_comm" => json!(r.pick(&["p2p", "zigzag", "allgather", "a2a"])),
        "pp_p2p" => json!(r.pick(&["overlapped", "blocking"])),
        "schedule" => json!(r.pick(&[
            "gpipe",
            "1f1b",
            "interleaved-1f1b",
            "zb-h1",
            "zb-v",
            "dualpipe-v"
        ])),
        "order" => json!(r.pick(&["tp-cp-ep-dp-pp", "tp-dp-pp", "pp-dp-tp-cp-ep"])),
        "seq_length" => ints(r, &[1, 128, 2048, 8192, 131072, 1 << 20]),
        "micro_batch_size" => ints(r, &[1, 2, 4, 16]),
        "global_batch_size" => ints(r, &[1, 8, 64, 512, 4096, 1 << 20, 1 << 32]),
        "precision" => json!(r.pick(&["bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"])),
        "fp8_recipe" => json!(r.pick(&["delayed", "current", "blockwise", "hourly"])),
        "fp8_param_gather" => json!(r.pick(&[true, false])),
        "bf16_layers_at_start" | "bf16_layers_at_end" => ints(r, &[0, 1, 2, 1000]),
        "grad_dtype" => json!(r.pick(&["fp32", "bf16", "fp16", "fp8"])),
        "recompute" => json!(r.pick(&["none", "selective", "full"])),
        "recompute_modules" => r.pick(&[
            json!(["core_attn"]),
            json!(["layernorm", "moe_act"]),
            json!(["mla_up_proj", "mlp"]),
            json!(["moe", "shared_experts"]),
            json!([]),
            json!(["attention"]),
        ]),
        "offload_activation_layers" => ints(r, &[0, 1, 3, 1000]),
        "optimizer_offload_fraction" => json!(r.pick(&[0.0, 0.5, 1.0, 1.5, -0.25])),
        "optimizer" => json!(r.pick(&["adam", "muon", "sgd"])),
        "flops_attention" => json!(r.pick(&["causal", "full"])),
        "cuda_graphs" => json!(r.pick(&[json!(true), json!(false), json!("yes")])),
        "launch_blocking" => json!(r.pick(&[json!(true), json!(false), json!(1)])),
        "mode" => json!(r.pick(&["full", "lora"])),
        "lora" => json!({"rank": r.pick(&[0u64, 8, 64, 100_000])}),
        _ => wild(r),
    }
}

const FIELDS: &[(&str, &[&str])] = &[
    (
        "model",
        &[
            "preset",
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "ffn_hidden_size",
            "vocab_size",
            "kv_channels",
            "num_experts",
            "moe_router_topk",
            "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size",
            "moe_first_k_dense",
            "moe_load_imbalance",
            "moe_capacity_factor",
            "moe_dropped_fraction",
            "mtp_num_layers",
            "attention_dropout",
            "hidden_dropout",
            "max_position_embeddings",
            "make_vocab_size_divisible_by",
            "tied_embeddings",
            "qk_layernorm",
            "attention_sinks",
            "window_size",
            "attention_chunk_size",
            "window_attn_skip_freq",
            "moe_layer_pattern",
            "moe_router_linear_bias",
            "hybrid_layer_pattern",
            "mamba",
        ],
    ),
    (
        "cluster",
        &["gpu", "num_gpus", "gpus_per_node", "nvlink_domain_size"],
    ),
    (
        "parallel",
        &[
            "tp",
            "sp",
            "cp",
            "cp_comm",
            "pp",
            "vpp",
            "schedule",
            "ep",
            "expert_tp",
            "zero",
            "fsdp",
            "dp",
            "order",
            "first_stage_layers",
            "last_stage_layers",
            "pipeline_layout",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
            "tp_comm_overlap",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "ddp_bucket_size",
            "cp_comm_overlap",
            "pp_p2p",
        ],
    ),
    (
        "training",
        &[
            "seq_length",
            "micro_batch_size",
            "global_batch_size",
            "precision",
            "fp8_recipe",
            "fp8_param_gather",
            "bf16_layers_at_start",
            "bf16_layers_at_end",
            "grad_dtype",
            "recompute",
            "recompute_modules",
            "offload_activation_layers",
            "optimizer_offload_fraction",
            "optimizer",
            "flash_attention",
            "flops_attention",
            "cuda_graphs",
            "launch_blocking",
            "mode",
            "lora",
        ],
    ),
];

/// A configuration document: a few fields changed from the defaults (or a preset).
fn random_config(r: &mut Rng) -> Value {
    let mut doc = json!({});
    for _ in 0..1 + r.below(7) {
        let (section, keys) = FIELDS[r.below(FIELDS.len())];
        let key = r.pick(keys);
        let v = if r.chance(90) {
            plausible(r, key)
        } else {
            wild(r)
        };
        doc[section][key] = v;
    }
    doc
}

/// Runs `case` on `input`: a panic, an overlong case or a non-number in the returned JSON
/// fails the test with the input printed.
fn run_case(what: &str, i: usize, input: &str, case: impl FnOnce() -> Option<Value>) {
    let start = Instant::now();
    let out = catch_unwind(AssertUnwindSafe(case));
    let took = start.elapsed();
    let seed = std::env::var("PARSIM_FUZZ_SEED").unwrap_or_else(|_| "18".into());
    match out {
        Err(_) => panic!("{what} case {i} (seed {seed}) panicked on input:\n{input}"),
        Ok(_) if took > CASE_LIMIT => {
            panic!("{what} case {i} (seed {seed}) took {took:?} on input:\n{input}")
        }
        Ok(Some(json)) => {
            if let Some(bad) = non_numbers(&json) {
                panic!("{what} case {i} (seed {seed}): {bad} in the output of input:\n{input}");
            }
        }
        Ok(None) => {}
    }
}

/// The estimate of a configuration document, as JSON, when it validates.
fn estimate_json(doc: &Value) -> Option<Value> {
    let cfg = Config::from_layers(&[Layer::overrides(doc.clone())]).ok()?;
    let resolved = Resolved::new(cfg).ok()?;
    let est = parsim::estimate::estimate(&resolved).ok()?;
    Some(serde_json::to_value(&est).expect("estimate serializes"))
}

#[test]
fn fuzz_configurations_in_process() {
    let mut r = Rng::seeded(1);
    let mut estimated = 0;
    let start = Instant::now();
    let n = case_count(2000);
    for i in 0..n {
        let doc = random_config(&mut r);
        let input = doc.to_string();
        run_case("configuration", i, &input, || {
            let out = estimate_json(&doc);
            estimated += out.is_some() as u32;
            out
        });
    }
    eprintln!(
        "{n} configurations ({estimated} estimated) in {:?}",
        start.elapsed()
    );
    assert!(
        estimated as usize > n / 20,
        "too few random configurations validate ({estimated})"
    );
}

/// Every numeric field and flag at the integer edges, two and three at a time, through
/// estimate, search, schedule, layout and execute's path up to its Plan (extreme_numbers.rs).
#[test]
fn fuzz_extreme_numbers_in_process() {
    let n = case_count(1000) as u32;
    if let Err(e) = extreme_numbers::run_cases(n) {
        panic!("{e}");
    }
}

/// The property catches the wrap it was written for: with the layer split's former u32
/// arithmetic put back in place of the rules (pp x vpp chunks, wrapping, then the layers taken
/// modulo the chunks: `--pp 2147483648 --vpp 2` divided by zero), the same cases from the same
/// seed and count as `fuzz_extreme_numbers_in_process` find a failing case, and it sets
/// parallel.pp or parallel.vpp (the other may come from its base).
#[test]
fn extreme_numbers_catch_the_former_pipeline_wrap() {
    use proptest::test_runner::{TestCaseError, TestError};
    // The layer split as it was: Ok where the former code went on, Err where it divided by 0.
    let former_split = |layers: u32, pp: u32, vpp: u32| -> Result<(), TestCaseError> {
        if pp < 2 || vpp == 0 {
            return Ok(()); // one stage, or a zero degree: refused or split before the product
        }
        match layers.checked_rem(pp.wrapping_mul(vpp)) {
            Some(_) => Ok(()),
            None => Err(TestCaseError::fail(format!(
                "pp x vpp = {pp} x {vpp} wraps to 0 in u32: remainder with a divisor of zero"
            ))),
        }
    };
    let n = case_count(1000) as u32;
    let result = extreme_numbers::runner(n).run(&extreme_numbers::cases(), |case| {
        let Some(cfg) = extreme_numbers::case_config(&case) else {
            return Ok(()); // refused while loading, before any rule
        };
        let p = &cfg.parallel;
        former_split(cfg.model.num_layers, p.pp, p.vpp)
    });
    let Err(TestError::Fail(why, case)) = result else {
        panic!(
            "{n} cases of the extreme-number property never reached the former wrap: {result:?}"
        );
    };
    let fields: Vec<&str> = case.fields.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        fields.contains(&"parallel.pp") || fields.contains(&"parallel.vpp"),
        "the failing case should set pp or vpp: {case} ({why})"
    );
}

#[test]
fn fuzz_hugging_face_files_in_process() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    let fixtures: Vec<Value> = [
        "llama3-8b",
        "mixtral-8x7b",
        "deepseek-v3",
        "gpt2",
        "qwen2-7b",
        "qwen3-30b-a3b",
        "gpt-oss-20b",
        "llama4-maverick",
        "kimi-k2",
        "nemotron-h-8b",
    ]
    .iter()
    .map(|n| {
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{n}.json"))).unwrap())
            .unwrap()
    })
    .collect();
    let mut r = Rng::seeded(2);
    for i in 0..case_count(500) {
        let mut v = r.pick(&fixtures);
        let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        for _ in 0..1 + r.below(3) {
            let key = r.pick(&keys);
            if r.chance(15) {
                v.as_object_mut().unwrap().remove(&key);
            } else if r.chance(30) {
                // Issue 31's inputs: unknown architectures, patterns of the wrong length or
                // with unknown layers, a latent MoE.
                let (k, x) = r.pick(&[
                    ("architectures", json!(["MambaForCausalLM"])),
                    ("architectures", json!(["NemotronHForCausalLM"])),
                    ("hybrid_override_pattern", json!("M-M*")),
                    ("hybrid_override_pattern", json!("MEMX".repeat(13))),
                    (
                        "layers_block_type",
                        json!(["mamba", "moe", "attention", "other"]),
                    ),
                    ("moe_latent_size", json!(1024)),
                    ("sliding_window", json!(1u64 << 40)),
                ]);
                v[k] = x;
            } else {
                v[&key] = wild(&mut r);
            }
        }
        let input = v.to_string();
        run_case("hf config", i, &input, || {
            let model = parsim::config::hf::import(&v, "fuzz.json").ok()?;
            let cfg = Config {
                model,
                ..Config::default()
            };
            let resolved = Resolved::new(cfg).ok()?;
            let est = parsim::estimate::estimate(&resolved).ok()?;
            Some(serde_json::to_value(&est).unwrap())
        });
    }
}

/// Megatron argument lists built from issue 31's flags with good and bad values: each is
/// imported and estimated, or refused with an error naming a flag; none panics.
#[test]
fn fuzz_megatron_args_in_process() {
    let flag_values: &[(&str, &[&str])] = &[
        ("--num-layers", &["4", "0", "5", "99999"]),
        ("--seq-length", &["1", "512", "4096"]),
        (
            "--hybrid-layer-pattern",
            &["M*M-", "M*M", "M*QE", "\"M-M*\"", "EEEE"],
        ),
        ("--mamba-num-heads", &["8", "0", "7"]),
        ("--mamba-head-dim", &["64", "0"]),
        ("--num-experts", &["0", "4", "128"]),
        ("--moe-router-topk", &["1", "0", "9"]),
        ("--window-size", &["127,0", "4095,0", "-1,0", "127,16", "x"]),
        ("--window-attn-skip-freq", &["2", "0", "[1,0,0,1]"]),
        ("--softmax-type", &["vanilla", "learnable", "bogus"]),
        (
            "--data-parallel-sharding-strategy",
            &["optim_grads_params", "optim", "zero3"],
        ),
        ("--use-megatron-fsdp", &[]),
        ("--use-torch-fsdp2", &[]),
        ("--use-distributed-optimizer", &[]),
        ("--tensor-model-parallel-size", &["1", "2", "3"]),
        ("--optimizer", &["adam", "muon", "sgd"]),
        ("--muon-tp-mode", &["blockwise", "duplicated"]),
        ("--recompute-granularity", &["selective", "full"]),
        (
            "--recompute-modules",
            &["layernorm moe_act", "mlp", "core_attn foo"],
        ),
        ("--cpu-offloading", &[]),
        ("--cpu-offloading-num-layers", &["0", "2", "99"]),
        ("--optimizer-cpu-offload", &[]),
        ("--optimizer-offload-fraction", &["0.5", "1.0", "2", "nan"]),
    ];
    let mut r = Rng::seeded(7);
    for i in 0..case_count(400) {
        let mut args = String::from(
            "--hidden-size 256 --num-attention-heads 4 --max-position-embeddings 8192",
        );
        for _ in 0..1 + r.below(5) {
            let (flag, values) = flag_values[r.below(flag_values.len())];
            args.push(' ');
            args.push_str(flag);
            if !values.is_empty() {
                args.push(' ');
                args.push_str(r.pick(values));
            }
        }
        run_case("megatron args", i, &args, || {
            let imp = match parsim::config::megatron::import(&args, "fuzz") {
                Ok(imp) => imp,
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains("--"), "no flag named for {args}: {msg}");
                    return None;
                }
            };
            let run = json!({"cluster": {"num_gpus": 2}, "training": {"global_batch_size": 2}});
            let cfg =
                Config::from_layers(&[Layer::overrides(imp.layer), Layer::overrides(run)]).ok()?;
            let resolved = Resolved::new(cfg).ok()?;
            let est = parsim::estimate::estimate(&resolved).ok()?;
            Some(serde_json::to_value(&est).unwrap())
        });
    }
}

#[test]
fn fuzz_measurement_lines_in_process() {
    let mut r = Rng::seeded(3);
    for i in 0..case_count(500) {
        let mut line = json!({"config": random_config(&mut r), "step_s": 1.0});
        for _ in 0..r.below(3) {
            let key = r.pick(&[
                "step_s",
                "peak_bytes",
                "label",
                "holdout",
                "config",
                "extra",
            ]);
            line[key] = wild(&mut r);
        }
        let input = line.to_string();
        run_case("measurement line", i, &input, || {
            let _ = parsim::calibrate::measurements::parse(&input, "fuzz.jsonl");
            None
        });
    }
}

#[test]
fn fuzz_schedules_in_process() {
    use parsim::schedule::{generate_with, simulate, Costs, GenerateOptions, ScheduleKind};
    let kinds = [
        ScheduleKind::Gpipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbV,
        ScheduleKind::DualPipeV,
    ];
    let mut r = Rng::seeded(4);
    for i in 0..case_count(500) {
        let kind = r.pick(&kinds);
        // Large programs are bounded (schedule::MAX_CELLS) but take seconds each in a debug
        // build: the sizes here stay small, except those refused outright.
        let pp = r.pick(&[0u32, 1, 2, 3, 4, 8, 16, 64]);
        let vpp = r.pick(&[0u32, 1, 2, 3, 4]);
        let m = r.pick(&[0u32, 1, 2, 4, 7, 8, 16, 64, 1000, 10_000_000, u32::MAX]);
        let group = r.chance(20).then(|| r.pick(&[0u32, 1, 4, 8, 1000]));
        let f = r.pick(&[0.0, 1.0, 1e-9, 1e308, -1.0]);
        let b = r.pick(&[0.0, 2.0, 1e308, -1.0]);
        let w = r.chance(30).then(|| r.pick(&[0.0, 1.0, 1e308]));
        let p2p = r.pick(&[0.0, 0.1, 1e308]);
        let overlap = r.pick(&[1.0, 0.5, 0.0, 2.0]);
        let input = format!(
            "{kind} pp {pp} vpp {vpp} microbatches {m} group {group:?} f {f} b {b} w {w:?} p2p {p2p} overlap {overlap}"
        );
        run_case("schedule", i, &input, || {
            let opts = GenerateOptions {
                microbatch_group_size: group,
            };
            let program = generate_with(kind, pp, vpp, m, &opts).ok()?;
            let costs = Costs::uniform(pp, vpp, f, b, w, p2p)
                .and_then(|c| c.with_overlap_factor(overlap))
                .ok()?;
            let sim = simulate(&program, &costs).ok()?;
            Some(
                serde_json::to_value(parsim::report::schedule_json::schedule_json(&program, &sim))
                    .unwrap(),
            )
        });
    }
}

#[test]
fn fuzz_search_in_process() {
    use parsim::search::{search, SearchSpec};
    use std::sync::atomic::AtomicBool;
    let mut r = Rng::seeded(5);
    for i in 0..6 {
        let mut doc = json!({
            "model": {"num_layers": r.pick(&[1u64, 2, 4]), "hidden_size": r.pick(&[64u64, 256]),
                      "num_attention_heads": 4, "num_query_groups": r.pick(&[1u64, 4]),
                      "ffn_hidden_size": 512, "vocab_size": 1000},
            "cluster": {"num_gpus": r.pick(&[0u64, 1, 2, 4, 8]), "gpus_per_node": r.pick(&[1u64, 4, 8])},
            "training": {"seq_length": r.pick(&[0u64, 64, 256]), "global_batch_size": r.pick(&[0u64, 1, 8, 64])}
        });
        if r.chance(50) {
            doc["model"]["num_experts"] = json!(4);
            doc["model"]["moe_router_topk"] = json!(2);
            doc["model"]["moe_ffn_hidden_size"] = json!(256);
        }
        let mbs_max = r.pick(&[0u64, 1, 4, u64::MAX]);
        let top = r.pick(&[0usize, 1, 3]);
        let input = format!("{doc} mbs_max {mbs_max} top {top}");
        run_case("search", i, &input, || {
            let base = Config::from_layers(&[Layer::overrides(doc.clone())]).ok()?;
            let spec = SearchSpec {
                base,
                mbs_max,
                top,
                constraints: Vec::new(),
                exhaustive: false,
            };
            let result = search(&spec, &|_, _| {}, &AtomicBool::new(false)).ok()?;
            Some(serde_json::to_value(&result).unwrap())
        });
    }
}

/// The exit statuses a fuzzed command may end with: those `parsim --help` documents
/// (`EXIT_CODES_HELP`: 0 success, 1 refused, 2 bad flag, 3 does not fit) but 130, which only
/// a Ctrl-C the test never sends can cause.
const FUZZ_EXIT_CODES: [i32; 4] = [0, 1, 2, 3];

/// Flag sets through the binary: a documented exit status (0, 1 refused, 2 bad flag, 3 does
/// not fit), never a panic or a signal, and finite JSON from every command that ran to its
/// end (0 and 3). Issue 30's inputs are among the flags: the Blackwell GPUs, NVLink domains
/// (0, not whole nodes, not dividing the GPUs), MXFP8/NVFP4 and the FP8 recipes.
#[test]
fn fuzz_command_lines() {
    let mut r = Rng::seeded(6);
    // Every shipped profile (config/gpu.rs `SHIPPED`), so a new one is fuzzed too.
    let gpus = parsim::config::GpuProfile::shipped_names();
    let flag_values: &[(&str, &[&str])] = &[
        ("--gpus", &["0", "1", "8", "64", "4294967295"]),
        ("--tp", &["0", "1", "2", "8", "3"]),
        ("--pp", &["0", "1", "2", "4", "9999"]),
        ("--cp", &["1", "2", "64"]),
        ("--mbs", &["0", "1", "65536"]),
        (
            "--gbs",
            &["0", "1", "64", "4294967296", "18446744073709551615"],
        ),
        ("--seq", &["0", "1", "8192", "16777217"]),
        (
            "--model",
            &["llama3-8b", "mixtral-8x7b", "deepseek-v3", "nope"],
        ),
        (
            "--schedule",
            &["1f1b", "zb-v", "dualpipe-v", "interleaved-1f1b"],
        ),
        ("--vpp", &["0", "1", "2", "1024"]),
        ("--zero", &["0", "3", "4"]),
        ("--moe-load-imbalance", &["1", "2", "1e300", "nan"]),
        ("--lora-rank", &["0", "16", "99999999"]),
        ("--mode", &["lora", "full"]),
        ("--precision", &["fp8", "fp32", "mxfp8", "nvfp4"]),
        ("--gpu", &gpus),
        ("--gpus-per-node", &["1", "4", "8"]),
        (
            "--nvlink-domain-size",
            &["0", "4", "6", "64", "72", "4294967295"],
        ),
        (
            "--fp8-recipe",
            &["delayed", "current", "blockwise", "hourly"],
        ),
    ];
    // `schedule`'s own flags (the others answer exit 2 to them).
    let schedule_values: &[(&str, &[&str])] = &[
        ("--pp", &["0", "1", "4", "10000"]),
        ("--vpp", &["0", "1", "2", "3"]),
        ("--microbatches", &["0", "1", "8", "100000000"]),
        (
            "--schedule",
            &["gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v"],
        ),
        ("--f", &["1", "1e308", "-1", "nan", "0"]),
        ("--b", &["2", "1e308", "inf"]),
        ("--w", &["0", "1", "1e308"]),
        ("--p2p", &["0", "0.5", "1e308"]),
        ("--overlap-factor", &["0", "0.5", "1", "2"]),
        ("--microbatch-group-size", &["0", "4", "1000"]),
        (
            "--compare",
            &["1f1b,zb-v", "gpipe,interleaved-1f1b,dualpipe-v"],
        ),
        ("--max-columns", &["0", "8", "100000"]),
    ];
    // The statuses accepted are the ones the binary documents.
    let help = cargo_bin_cmd!("parsim").arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let documented: Vec<i32> = help
        .split("Exit status:")
        .nth(1)
        .expect("`parsim --help` lists the exit statuses")
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(documented, [0, 1, 2, 3, 130], "{help}");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..48 {
        let command = r.pick(&["estimate", "layout", "search", "schedule"]);
        let flag_values = if command == "schedule" {
            schedule_values
        } else {
            flag_values
        };
        let mut args: Vec<String> = vec![command.to_string()];
        for _ in 0..r.below(5) {
            let (flag, values) = flag_values[r.below(flag_values.len())];
            args.push(flag.to_string());
            args.push(r.pick(values).to_string());
        }
        if args[0] == "search" {
            // Keep the binary's searches small.
            args.extend([
                "--model".into(),
                "llama3-8b".into(),
                "--gpus".into(),
                "8".into(),
            ]);
            args.extend(["--top".into(), "1".into()]);
        }
        args.push("--json".into());
        let input = format!("parsim {}", args.join(" "));
        let out = cargo_bin_cmd!("parsim")
            .args(&args)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            code.is_some_and(|c| FUZZ_EXIT_CODES.contains(&c)),
            "case {i}: {input}: status {:?}\n{stderr}",
            out.status
        );
        seen.insert(code);
        assert!(!stderr.contains("panicked"), "case {i}: {input}:\n{stderr}");
        if matches!(code, Some(0 | 3)) {
            let v: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("case {i}: {input}: not JSON: {e}"));
            if let Some(bad) = non_numbers(&v) {
                panic!("case {i}: {input}: {bad}");
            }
        }
    }
    eprintln!("exit statuses seen: {seen:?}");
}

/// Profiles with random measured rate tables (`[tables]`: a flash_mma attention curve, a
/// memory curve, a GEMM bucket, an all-reduce curve, the host gap) with wild values mixed
/// in: parsing refuses the bad ones, and every profile that parses estimates a small model
/// without a panic or a non-number.
#[test]
fn fuzz_profile_tables_in_process() {
    let mut r = Rng::seeded(11);
    let base = toml::Value::try_from(parsim::config::GpuProfile::load("h100-sxm").unwrap())
        .expect("a profile serializes");
    let prov = json!({"date": "d", "device": "d", "driver": "d", "software": "s"});
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..case_count(150) {
        let rate = |r: &mut Rng| {
            if r.chance(4) {
                wild(r)
            } else {
                json!(r.pick(&[1e9, 1e11, 5e12, 1.5e14, 9e14]))
            }
        };
        let keys = |r: &mut Rng, scale: u64| -> Value {
            let n = if r.chance(5) { 0 } else { 1 + r.below(3) };
            let mut ks: Vec<u64> = (0..n).map(|j| scale << (2 * j + r.below(2))).collect();
            if r.chance(5) {
                ks.reverse();
            }
            json!(ks)
        };
        let seq = keys(&mut r, 512);
        let n = seq.as_array().unwrap().len();
        let curve = |r: &mut Rng, pass: &str| {
            json!({"pass": pass, "mask": r.pick(&["causal", "full"]), "head_dim": r.pick(&[64, 128]),
                   "seq_len": seq.clone(), "flops_per_s": (0..n).map(|_| rate(r)).collect::<Vec<_>>(),
                   "count": vec![1; n]})
        };
        let mut tables = json!({
            "attention_kernel": if r.chance(5) { "other" } else { "flash_mma" },
            "attention": {"flash_mma": {"provenance": prov, "curves": [curve(&mut r, "forward"), curve(&mut r, "backward")]}},
        });
        let bytes = keys(&mut r, 1 << 16);
        let m = bytes.as_array().unwrap().len();
        if r.chance(60) {
            tables["memory"] = json!({"provenance": prov, "bytes": bytes,
                "bytes_per_s": (0..m).map(|_| rate(&mut r)).collect::<Vec<_>>(), "count": vec![1; m]});
        }
        if r.chance(60) {
            tables["gemm"] = json!({"provenance": prov, "buckets": [{"dtype": "bf16",
                "m": if r.chance(10) { 3000 } else { 4096 }, "n": 4096, "k": 1024, "efficiency": rate(&mut r), "count": 1}]});
        }
        if r.chance(60) {
            tables["collective"] = json!({"provenance": prov, "curves": [{"op": "all_reduce",
                "group_size": if r.chance(10) { 1 } else { 8 }, "placement": "intra_node", "bytes": bytes,
                "bus_bytes_per_s": (0..m).map(|_| rate(&mut r)).collect::<Vec<_>>(), "count": vec![1; m]}]});
        }
        if r.chance(50) {
            let gap = if r.chance(50) {
                json!(2e-6)
            } else {
                wild(&mut r)
            };
            tables["host_gap"] = json!({"provenance": prov, "seconds_per_op": gap, "count": 1});
        }
        let Ok(t) = toml::Value::try_from(&tables) else {
            continue;
        };
        let mut profile = base.clone();
        profile.as_table_mut().unwrap().insert("tables".into(), t);
        let input = toml::to_string(&profile).unwrap_or_default();
        match parsim::config::GpuProfile::parse(&input, "fuzz.toml") {
            Ok(_) => accepted += 1,
            Err(_) => refused += 1,
        }
        run_case("profile tables", i, &input, || {
            let gpu = parsim::config::GpuProfile::parse(&input, "fuzz.toml").ok()?;
            let doc = json!({"model": {"preset": "llama3-8b", "num_layers": 2},
                             "cluster": {"num_gpus": 8}, "training": {"seq_length": 2048}});
            let cfg = Config::from_layers(&[Layer::overrides(doc)]).ok()?;
            let est = parsim::estimate::estimate(&Resolved::with_gpu(cfg, gpu).ok()?).ok()?;
            Some(serde_json::to_value(&est).expect("estimate serializes"))
        });
    }
    // Both sides are exercised: tables that time ops, and tables refused by field.
    assert!(
        accepted >= 10 && refused >= 10,
        "{accepted} accepted, {refused} refused"
    );
}
