//! torchtitan job import (`parsim::config::torchtitan`): each mapped field value by value from
//! the fixtures (tests/fixtures/torchtitan/, SOURCES.md), derived by hand from torchtitan's
//! rules (cited per test), and each refusal by its TOML path.

use parsim::config::torchtitan::{import, schema, TorchtitanImport, DDP_BUCKET_PARAMS, FLAVORS};
use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::estimate;
use serde_json::{json, Value};

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/torchtitan/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read(name: &str, overrides: &[&str], world: u32) -> TorchtitanImport {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    import(&fixture(name), name, &o, world).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn refusal(name: &str, overrides: &[&str]) -> String {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    match import(&fixture(name), name, &o, 64) {
        Ok(_) => panic!("{name} {overrides:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

fn at<'a>(layer: &'a Value, path: &str) -> &'a Value {
    let (section, key) = path.split_once('.').unwrap();
    &layer[section][key]
}

/// torchtitan's llama3_70b.toml (A100 preset) on 64 GPUs: tensor_parallel_degree 8; the
/// shard degree -1 takes the GPUs left, 64 / (1 x 1 x 8 x 1) = 8 (ParallelDims._validate);
/// FSDP2 over them (ZeRO-3, torch); local_batch_size 8 is the microbatch, global -1 is
/// 8 x 8 = 64 (Trainer.__init__); mode "full"; bf16 parameters (MixedPrecisionPolicy) with fp32
/// reduction; 1000 steps x 64 x 8192 tokens.
#[test]
fn published_70b_maps_value_by_value() {
    let l = read("llama3_70b.toml", &[], 64).layer;
    let expect = [
        ("training.framework", json!("fsdp")),
        ("model.preset", json!("llama3-70b")),
        ("parallel.tp", json!(8)),
        ("parallel.sp", json!(true)),
        ("parallel.cp", json!(1)),
        ("parallel.pp", json!(1)),
        ("parallel.dp", json!(8)),
        ("parallel.zero", json!(3)),
        ("parallel.fsdp", json!("torch")),
        ("parallel.tp_comm_overlap", json!(false)),
        ("training.micro_batch_size", json!(8)),
        ("training.global_batch_size", json!(64)),
        ("training.seq_length", json!(8192)),
        ("training.precision", json!("bf16")),
        ("training.grad_dtype", json!("fp32")),
        ("training.recompute", json!("full")),
        ("training.optimizer", json!("adam")),
        ("run.train_tokens", json!(1000u64 * 64 * 8192)),
    ];
    for (path, want) in expect {
        assert_eq!(at(&l, path), &want, "{path}");
    }
    // -1 leaves the GPU count to the cluster: the layer does not set it.
    assert!(at(&l, "cluster.num_gpus").is_null());
}

/// torchtitan's llama3_405b.toml of September 2025 on its 128 H100s: tp 8, shard 128 / 8 = 16,
/// `converters = ["float8"]` with the `[float8]` section: tensorwise dynamic scaling (no
/// recipe_name: parsim's "current"), FP8 all-gathers under FSDP (shard 16 > 1), async TP with
/// compile on.
#[test]
fn published_405b_float8_maps_value_by_value() {
    let imported = read("llama3_405b.toml", &[], 128);
    let l = &imported.layer;
    assert_eq!(at(l, "parallel.dp"), &json!(16));
    assert_eq!(at(l, "training.precision"), &json!("fp8"));
    assert_eq!(at(l, "training.fp8_recipe"), &json!("current"));
    assert_eq!(at(l, "training.fp8_param_gather"), &json!(true));
    assert_eq!(at(l, "parallel.tp_comm_overlap"), &json!(true));
    assert_eq!(at(l, "training.global_batch_size"), &json!(2 * 16));
    assert!(imported
        .notes
        .iter()
        .any(|n| n.starts_with("compile.enable")));
    // The no-effect fields are named in one note, the mapped ones are not.
    let note = imported
        .notes
        .iter()
        .find(|n| n.starts_with("accepted with no effect"))
        .unwrap();
    assert!(note.contains("optimizer.lr") && note.contains("checkpoint.interval"));
    assert!(!note.contains("tensor_parallel_degree"));
}

/// Every mapped [parallelism] field of pipeline_cp.toml (64 GPUs: shard 2 x cp 4 x tp 2 x pp 4).
/// Interleaved1F1B is a multi-stage schedule: 2 stages a rank, 8 stages. The split
/// (generate_llm_fqn_per_model_part): 32 layers + 1 (embedding) + 1 (output) = 34 effective,
/// 34 / 8 = 4 a stage with 2 left over for the first two stages: 5 - 1, 5, 4 x 5, 4 - 1 =
/// 4, 5, 4, 4, 4, 4, 4, 3. The all-to-all rotation with head-tail balancing is zigzag; the
/// microbatch is pipeline_parallel_microbatch_size 2; global 16 = 8 x 2 (no accumulation).
#[test]
fn pipeline_and_context_fields_map_value_by_value() {
    let l = read("pipeline_cp.toml", &[], 8).layer;
    let expect = [
        ("cluster.num_gpus", json!(64)),
        ("parallel.dp", json!(2)),
        ("parallel.tp", json!(2)),
        ("parallel.cp", json!(4)),
        ("parallel.cp_comm", json!("zigzag")),
        ("parallel.pp", json!(4)),
        ("parallel.vpp", json!(2)),
        ("parallel.schedule", json!("interleaved-1f1b")),
        (
            "parallel.pipeline_layout",
            json!("Et*4|t*5|t*4|t*4|t*4|t*4|t*4|t*3L"),
        ),
        ("parallel.tp_comm_overlap", json!(true)),
        ("training.micro_batch_size", json!(2)),
        ("training.global_batch_size", json!(16)),
        ("training.seq_length", json!(16384)),
        ("training.recompute", json!("full")),
        ("training.precision", json!("fp8")),
        ("training.fp8_param_gather", json!(true)),
        ("run.train_tokens", json!(500u64 * 16 * 16384)),
    ];
    for (path, want) in expect {
        assert_eq!(at(&l, path), &want, "{path}");
    }
}

/// An even split is Megatron-Core's embedding/loss slots: 1F1B on 2 ranks, 34 effective
/// layers, 17 a stage, 16 decoder layers each; and the layer with it validates and resolves.
#[test]
fn even_pipeline_split_is_the_embedding_and_loss_slots() {
    let l = read(
        "pipeline_cp.toml",
        &[
            "parallelism.pipeline_parallel_degree=2",
            "parallelism.pipeline_parallel_schedule=1F1B",
            "parallelism.data_parallel_shard_degree=4",
            "training.global_batch_size=32",
        ],
        64,
    )
    .layer;
    assert_eq!(at(&l, "parallel.vpp"), &json!(1));
    assert!(at(&l, "parallel.pipeline_layout").is_null());
    assert_eq!(
        at(&l, "parallel.account_for_embedding_in_pipeline_split"),
        &json!(true)
    );
    assert_eq!(
        at(&l, "parallel.account_for_loss_in_pipeline_split"),
        &json!(true)
    );
    let cfg = Config::from_layers(&[Layer::overrides(l)]).unwrap();
    let stages = parsim::config::Resolved::new(cfg).unwrap();
    assert_eq!(stages.config.parallel.pp, 2);
}

/// Overrides beat the file, in order (the launch scripts' `--section.field value`).
#[test]
fn overrides_beat_the_file() {
    let l = read(
        "llama3_70b.toml",
        &[
            "--parallelism.tensor_parallel_degree=4",
            "parallelism.tensor_parallel_degree=2",
            "training.local_batch_size=2",
            "activation_checkpoint.mode=none",
        ],
        64,
    )
    .layer;
    assert_eq!(at(&l, "parallel.tp"), &json!(2));
    // 64 / 2 = 32 data-parallel ranks, 2 sequences each.
    assert_eq!(at(&l, "parallel.dp"), &json!(32));
    assert_eq!(at(&l, "training.global_batch_size"), &json!(64));
    assert_eq!(at(&l, "training.recompute"), &json!("none"));
}

/// DDP (replicate only): no sharding, torch DDP's 100 MiB bucket of fp32 gradients.
#[test]
fn replicate_only_is_ddp() {
    let l = read(
        "llama3_70b.toml",
        &[
            "parallelism.tensor_parallel_degree=1",
            "parallelism.data_parallel_replicate_degree=8",
            "parallelism.data_parallel_shard_degree=1",
        ],
        8,
    )
    .layer;
    assert_eq!(at(&l, "parallel.zero"), &json!(0));
    assert_eq!(at(&l, "parallel.dp"), &json!(8));
    assert_eq!(DDP_BUCKET_PARAMS * 4, 100 << 20);
    assert_eq!(
        at(&l, "parallel.ddp_bucket_size"),
        &json!(DDP_BUCKET_PARAMS)
    );
}

/// Each refusal names its TOML path (and the published 8B file's per-op checkpointing).
#[test]
fn refusals_name_their_path() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "hsdp.toml",
            &[],
            "parallelism.data_parallel_replicate_degree",
        ),
        (
            "layer_sac.toml",
            &[],
            "activation_checkpoint.selective_ac_option",
        ),
        ("unknown_section.toml", &[], "[parallelism_extra]"),
        ("unknown_key.toml", &[], "training.batch_size: unknown key"),
        ("debug_flavor.toml", &[], "model.flavor"),
        (
            "rowwise_float8.toml",
            &[],
            "quantize.linear.float8.recipe_name",
        ),
        (
            "reshard_never.toml",
            &[],
            "parallelism.fsdp_reshard_after_forward",
        ),
        ("cpu_offload.toml", &[], "training.enable_cpu_offload"),
        (
            "pipeline_accumulation.toml",
            &[],
            "training.global_batch_size",
        ),
        (
            "llama3_70b.toml",
            &[
                "parallelism.pipeline_parallel_degree=2",
                "parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
            ],
            "parallelism.pipeline_parallel_schedule",
        ),
        (
            "llama3_70b.toml",
            &[
                "training.dtype=bfloat16",
                "training.mixed_precision_param=float32",
            ],
            "training.mixed_precision_param",
        ),
        (
            "llama3_70b.toml",
            &["training.dtype=bfloat16", "model.converters=float8"],
            "model.converters",
        ),
        (
            "llama3_70b.toml",
            &["training.dtype=float16"],
            "training.dtype",
        ),
        (
            "llama3_70b.toml",
            &["activation_checkpoint.mode=memory_budget"],
            "activation_checkpoint.mode",
        ),
        (
            "llama3_70b.toml",
            &["parallelism.enable_async_tensor_parallel"],
            "parallelism.enable_async_tensor_parallel",
        ),
        (
            "llama3_70b.toml",
            &["parallelism.tensor_parallel_degree=two"],
            "parallelism.tensor_parallel_degree",
        ),
        (
            "llama3_70b.toml",
            &["parallelism.no_such_field=1"],
            "parallelism.no_such_field",
        ),
        (
            "llama3_70b.toml",
            &["parallelism.tensor_parallel_degree=3"],
            "parallelism.data_parallel_shard_degree",
        ),
    ];
    for (name, overrides, path) in cases {
        let e = refusal(name, overrides);
        assert!(e.contains(path), "{name} {overrides:?}: {e}");
    }
}

/// The flavors parsim reads are its presets: torchtitan's llama3_args (dim, layers, heads,
/// KV heads, ffn_dim_multiplier, multiple_of) and FeedForward's hidden size
/// multiple_of x ceil(int(multiplier x int(2 x 4 dim / 3)) / multiple_of)
/// (torchtitan/models/llama3/model/model.py), against the preset's fields.
#[test]
fn flavors_are_the_presets_shapes() {
    // (flavor, dim, layers, heads, kv heads, ffn_dim_multiplier, multiple_of)
    let args = [
        ("8B", 4096u64, 32u32, 32u32, 8u32, 1.3, 1024u64),
        ("70B", 8192, 80, 64, 8, 1.3, 4096),
        ("405B", 16384, 126, 128, 8, 1.2, 4096),
    ];
    assert_eq!(FLAVORS.len(), args.len());
    for (flavor, dim, layers, heads, kv, mult, multiple_of) in args {
        let (_, _, preset) = FLAVORS.iter().find(|(_, f, _)| *f == flavor).unwrap();
        let m = parsim::config::presets::preset(preset).unwrap();
        let hidden = (2 * 4 * dim / 3) as f64;
        let hidden = (mult * hidden) as u64;
        let ffn = multiple_of * hidden.div_ceil(multiple_of);
        assert_eq!(
            (
                m.hidden_size,
                m.num_layers,
                m.num_attention_heads,
                m.num_query_groups,
                m.ffn_hidden_size,
                m.vocab_size
            ),
            (dim, layers, heads, kv, ffn, 128256),
            "{flavor}"
        );
    }
}

/// The schema's paths are torchtitan's: a sample of each section is known, and the published
/// files hold no field outside it (they import).
#[test]
fn schema_covers_the_published_sections() {
    for p in [
        "job.dump_folder",
        "parallelism.context_parallel_rotate_method",
        "quantize.linear.mx.recipe_name",
        "float8.enable_fsdp_float8_all_gather",
        "training.dataloader.num_workers",
    ] {
        assert!(schema::field(p).is_some(), "{p}");
    }
    read("llama3_8b.toml", &["activation_checkpoint.mode=full"], 64);
}

/// `training.dtype = "bfloat16"` is pure-bf16 training: torchtitan builds the model under
/// `set_default_dtype(training.dtype)` (train.py) and its JobConfig's `Training.dtype` puts "all
/// parameters, gradients, and optimizer states in bfloat16, without an extra copy of fp32
/// weights". On llama3 8B over 8 GPUs (FSDP, shard 8) a rank then holds an eighth of the bf16
/// weights, bf16 gradients and AdamW's two bf16 moments: (2 + 2 + 2 + 2) p / 8 = p bytes, by
/// hand; under bf16 mixed precision (the file's float32 dtype) FSDP2 keeps the fp32 shard as
/// the master copy (no bf16 shard beside it: src/memory/fsdp2.rs), so a rank holds the fp32
/// shard, its fp32 gradient and AdamW's two fp32 moments: (4 + 4 + 4 + 4) p / 8.
#[test]
fn bf16_training_dtype_is_pure_bf16_without_master_weights() {
    let states = |overrides: &[&str]| {
        let imp = read("llama3_8b.toml", overrides, 8);
        let cfg = Config::from_layers(&[
            Layer::overrides(json!({"cluster": {"num_gpus": 8}})),
            Layer::overrides(imp.layer.clone()),
        ])
        .unwrap();
        let e = estimate(&Resolved::new(cfg).unwrap()).unwrap();
        let s = &e.memory.stages[0];
        (imp, s.weights + s.gradients + s.optimizer)
    };
    let full = "activation_checkpoint.mode=full";
    let (imp, pure) = states(&[full, "training.dtype=bfloat16"]);
    let l = &imp.layer;
    assert_eq!(at(l, "training.master_weights"), &json!(false));
    assert_eq!(at(l, "training.grad_dtype"), &json!("bf16"));
    assert_eq!(at(l, "training.precision"), &json!("bf16"));
    assert!(imp.notes.iter().any(|n| n.contains("no fp32 master copy")));
    let (_, mixed) = states(&[full]);
    // Llama 3 8B's parameters: untied embeddings 2 x 128256 x 4096, 32 layers of attention
    // (2 x 4096^2 + 2 x 4096 x 1024) and SwiGLU MLP (3 x 4096 x 14336) and two norms, the final
    // norm: 8,030,261,248 (Meta's "8.03B").
    let layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
    let p: u64 = 2 * 128256 * 4096 + 32 * layer + 4096;
    assert_eq!(p, 8_030_261_248);
    assert_eq!(pure, p, "pure bf16");
    assert_eq!(mixed, 16 * p / 8, "fp32 parameters, bf16 compute");
}

/// torchtitan's own 8B file asks for per-op selective checkpointing (`selective_ac_option =
/// "op"`, `_apply_op_sac`): parsim's `per_op` recompute module. On 8 GPUs (FSDP, tp 1) one
/// layer keeps, by hand from llama3's save list (every other matmul: wq, wv, w1, w2; the SDPA
/// kernel's output and fp32 log-sum-exp) and the checkpoint's input, for n = 8192 tokens in
/// bf16: 2 (n h + n 32 x 128 + n 8 x 128 + n 32 x 128 + n 14336 + n h) + 4 x 32 n bytes.
/// The executor refuses it by field.
#[test]
fn published_8b_per_op_checkpointing_keeps_the_save_list() {
    let imp = read("llama3_8b.toml", &[], 8);
    assert_eq!(at(&imp.layer, "training.recompute"), &json!("selective"));
    assert_eq!(
        at(&imp.layer, "training.recompute_modules"),
        &json!(["per_op"])
    );
    let cfg = Config::from_layers(&[
        Layer::overrides(json!({"cluster": {"num_gpus": 8}})),
        Layer::overrides(imp.layer),
    ])
    .unwrap();
    let r = Resolved::new(cfg).unwrap();
    let (n, h) = (8192u64, 4096u64);
    let elements = n * h + n * 32 * 128 + n * 8 * 128 + n * 32 * 128 + n * 14336 + n * h;
    let by_hand = 2 * elements + 32 * n * 4;
    let layer = parsim::model::Ledger::build(&r).dense;
    assert_eq!(
        layer.saved_bytes(parsim::config::Recompute::Selective),
        by_hand
    );
    assert!(estimate(&r).is_ok());
    let err = parsim::lower::lower(&r, &parsim::lower::LowerOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("training.recompute_modules"), "{err}");
}
