//! The DeepSpeed configuration reader (tests/fixtures/deepspeed/, sources in its SOURCES.md):
//! each mapped field lands where it should, value by value from the fixture; each refusal
//! names its JSON path; the batch follows DeepSpeed's identity train_batch_size =
//! micro x accumulation x dp (deepspeed/runtime/config.py `_set_batch_related_parameters`,
//! `_batch_assertion`), checked here by hand.

use parsim::config::deepspeed::{import, BatchFields, DeepspeedError, DeepspeedImport};
use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::estimate;

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/deepspeed/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).expect("fixture")
}

fn read(name: &str) -> DeepspeedImport {
    import(&fixture(name), name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The error of a fixture, as shown.
fn refusal(name: &str) -> String {
    import(&fixture(name), name)
        .err()
        .unwrap_or_else(|| panic!("{name} was accepted"))
        .to_string()
}

#[test]
fn every_mapped_zero3_field_lands_in_the_layer() {
    // zero3_every_knob.json, field by field.
    let imp = read("zero3_every_knob");
    let p = &imp.layer["parallel"];
    let t = &imp.layer["training"];
    assert_eq!(t["framework"], "deepspeed");
    assert_eq!(p["zero"], 3);
    assert_eq!(t["precision"], "bf16");
    assert_eq!(t["grad_dtype"], "bf16");
    assert_eq!(t["optimizer"], "adam");
    assert_eq!(p["overlap_grad_reduce"], false);
    assert_eq!(p["ddp_bucket_size"], 200_000_000u64);
    assert_eq!(p["zero3_prefetch_bucket_size"], 30_000_000u64);
    assert_eq!(p["zero3_param_persistence_threshold"], 10_000u64);
    assert_eq!(p["zero3_max_live_parameters"], 600_000_000u64);
    assert_eq!(
        imp.batch,
        BatchFields {
            train_batch_size: None,
            micro_batch_per_gpu: Some(2),
            accumulation_steps: Some(8),
            has_auto: false,
        }
    );
    // Keys with no effect on memory or time are listed, not mapped.
    for key in [
        "gradient_clipping",
        "optimizer.params",
        "steps_per_print",
        "zero_optimization.allgather_bucket_size",
        "zero_optimization.offload_optimizer",
    ] {
        assert!(
            imp.accepted.iter().any(|a| a == key),
            "{key}: {:?}",
            imp.accepted
        );
    }
    // Nothing else lands: the layer holds the mapped sections only.
    let keys: Vec<&String> = imp.layer.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["parallel", "training"]);
}

#[test]
fn published_configs_map_their_stage_and_precision() {
    // Megatron-DeepSpeed finetune_hf_llama: stage 0, bf16, 256 / 16.
    let a = read("megatron_deepspeed_finetune_llama_zero0_bf16");
    assert_eq!(a.layer["parallel"]["zero"], 0);
    assert_eq!(a.layer["training"]["precision"], "bf16");
    assert_eq!(a.batch.train_batch_size, Some(256));
    assert_eq!(a.batch.micro_batch_per_gpu, Some(16));
    // Megatron-DeepSpeed curriculum baseline: stage 1, fp16, Adam, 512 with 1 step.
    let b = read("megatron_deepspeed_gpt_zero1_fp16");
    assert_eq!(b.layer["parallel"]["zero"], 1);
    assert_eq!(b.layer["training"]["precision"], "fp16");
    assert_eq!(b.layer["training"]["optimizer"], "adam");
    assert_eq!(
        (b.batch.train_batch_size, b.batch.accumulation_steps),
        (Some(512), Some(1))
    );
    // DeepSpeedExamples autotuning: stage 3, fp16, the micro batch "auto".
    let c = read("deepspeedexamples_autotuning_fp16_z3");
    assert_eq!(c.layer["parallel"]["zero"], 3);
    assert_eq!(c.layer["training"]["precision"], "fp16");
    assert!(c.batch.has_auto && c.batch.micro_batch_per_gpu.is_none());
    assert!(c.warnings().iter().any(|w| w.contains("\"auto\"")));
}

#[test]
fn each_refusal_names_its_path() {
    for (name, path) in [
        (
            "refuse_offload_optimizer_nvme",
            "zero_optimization.offload_optimizer: optimizer offload to NVMe is not modelled",
        ),
        (
            "refuse_offload_param_nvme",
            "zero_optimization.offload_param: parameter offload",
        ),
        (
            "refuse_unknown_key",
            "zero_optimization.overlap_gradients: unknown key (not a key of DeepSpeed's configuration)",
        ),
        (
            "refuse_partition_activations",
            "activation_checkpointing.partition_activations:",
        ),
        (
            "refuse_zeropp_quantized_weights",
            "zero_optimization.zero_quantized_weights:",
        ),
        ("refuse_both_precisions", "fp16.enabled: bf16 and fp16"),
        (
            "deepspeedexamples_imagenet_fp16_z1",
            "cuda_visible_devices: unknown key (not a key of DeepSpeed's configuration)",
        ),
        (
            "deepspeedexamples_zero3_leaf_module",
            "zero_optimization.leaf_module:",
        ),
    ] {
        let e = refusal(name);
        assert!(e.starts_with(path), "{name}: {e}");
    }
}

#[test]
fn bad_values_are_refused_by_path() {
    let cases = [
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}}"#,
            "zero_optimization.stage:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 0}"#,
            "train_micro_batch_size_per_gpu:",
        ),
        (
            r#"{"gradient_accumulation_steps": 2}"#,
            "train_batch_size: either",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}"#,
            "zero_optimization.reduce_bucket_size:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "OneBitAdam"}}"#,
            "optimizer.type:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "amp": {"enabled": true}}"#,
            "amp:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"cpu_offload": true}}"#,
            "zero_optimization.cpu_offload:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_scatter": false}}"#,
            "zero_optimization.reduce_scatter:",
        ),
        (
            r#"{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}"#,
            "x:",
        ),
        ("[1]", "(top level):"),
    ];
    for (text, path) in cases {
        let e = import(text, "x").expect_err(text);
        assert!(e.to_string().starts_with(path), "{text}: {e}");
    }
    // A disabled section, DeepSpeed's defaults and "auto" on a default-only key are accepted.
    let ok = r#"{"train_micro_batch_size_per_gpu": 1, "amp": {"enabled": false},
        "zero_optimization": {"stage": 2, "reduce_scatter": true, "sub_group_size": "auto",
        "offload_optimizer": {"device": "none"}}}"#;
    assert!(import(ok, "x").is_ok());
    assert!(matches!(import("{", "x"), Err(DeepspeedError::Parse(_))));
}

#[test]
fn stage3_keys_below_stage3_are_not_read() {
    // DeepSpeed's stage 1/2 optimizer never reads the stage-3 keys; parsim's rules refuse them
    // off stage 3, so they must not land in the layer.
    let text = r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
        "stage3_prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9}}"#;
    let imp = import(text, "x").unwrap();
    assert!(imp.layer["parallel"]
        .get("zero3_prefetch_bucket_size")
        .is_none());
    assert!(imp
        .accepted
        .contains(&"zero_optimization.stage3_prefetch_bucket_size".to_string()));
}

#[test]
fn batch_follows_deepspeeds_identity() {
    let fields = |t, m, g| BatchFields {
        train_batch_size: t,
        micro_batch_per_gpu: m,
        accumulation_steps: g,
        has_auto: false,
    };
    // Two given derive the third: 256 / (16 x 4) = 4 steps; 512 / (1 x 8) = 64 a GPU;
    // 2 x 8 x 4 = 64.
    let b = fields(Some(256), Some(16), None)
        .resolve(4)
        .unwrap()
        .unwrap();
    assert_eq!((b.micro, b.global, b.accumulation_steps), (16, 256, 4));
    assert!(b.note.starts_with("gradient_accumulation_steps derived"));
    let b = fields(Some(512), None, Some(1))
        .resolve(8)
        .unwrap()
        .unwrap();
    assert_eq!((b.micro, b.global), (64, 512));
    let b = fields(None, Some(2), Some(8)).resolve(4).unwrap().unwrap();
    assert_eq!(b.global, 64);
    // One given: one accumulation step.
    let b = fields(None, Some(3), None).resolve(5).unwrap().unwrap();
    assert_eq!((b.global, b.accumulation_steps), (15, 1));
    // Inconsistent (100 != 4 x 5 x 4) or not divisible (256 / (16 x 3) is no whole number of
    // steps): refused, naming train_batch_size.
    for (f, dp) in [
        (fields(Some(100), Some(4), Some(5)), 4),
        (fields(Some(256), Some(16), None), 3),
    ] {
        let e = f.resolve(dp).unwrap_err().to_string();
        assert!(
            e.starts_with("train_batch_size: DeepSpeed's identity"),
            "{e}"
        );
    }
}

#[test]
fn published_configs_estimate_end_to_end() {
    // Each published config that parsim can model, on the built-in Llama-3-8B over 8 H100s
    // at tp 2 (dp 4), estimates with its batch: the global batch over micro x dp is the
    // accumulation DeepSpeed runs.
    for (name, micro, global) in [
        ("megatron_deepspeed_finetune_llama_zero0_bf16", 16, 256),
        ("megatron_deepspeed_gpt_zero1_fp16", 128, 512),
        ("zero3_every_knob", 2, 64),
    ] {
        let imp = read(name);
        let base = [Layer::overrides(imp.layer.clone())];
        let merged = Config::from_layers(&base).unwrap();
        let (batch, _) = imp.batch_layer(&merged).unwrap().unwrap();
        let cfg =
            Config::from_layers(&[Layer::overrides(imp.layer.clone()), Layer::overrides(batch)])
                .unwrap();
        assert_eq!(cfg.training.micro_batch_size, micro, "{name}");
        assert_eq!(cfg.training.global_batch_size, global, "{name}");
        let r = Resolved::new(cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.dp, 4);
        let e = estimate(&r).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0, "{name}");
    }
    // The autotuning config leaves the batch to the other sources.
    let imp = read("deepspeedexamples_autotuning_fp16_z3");
    let merged = Config::from_layers(&[Layer::overrides(imp.layer.clone())]).unwrap();
    assert!(imp.batch_layer(&merged).unwrap().is_none());
    let r = Resolved::new(merged).unwrap();
    assert!(estimate(&r).is_ok());
}

/// `bf16.bf16_master_weights_and_grads` and `bf16.bf16_optimizer_states` (DeepSpeed's
/// precision_config.py) are the run without an fp32 master: on Llama-2-7B over 8 GPUs at
/// ZeRO-1 the rank holds bf16 weights and gradients (2 + 2 bytes a parameter) and an eighth of
/// the bf16 partition copy and the two bf16 moments (2 + 2 + 2): 4p + 6p/8, by hand. bf16
/// moments beside an fp32 master are refused by the configuration rules, naming the field.
#[test]
fn bf16_master_weights_and_optimizer_states_map_to_pure_bf16() {
    let text = r#"{"bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
                   "bf16_optimizer_states": true},
                   "zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 1}"#;
    let imp = import(text, "inline").unwrap();
    let t = &imp.layer["training"];
    assert_eq!(t["master_weights"], false);
    assert_eq!(t["grad_dtype"], "bf16");
    assert_eq!(t["optimizer_state_dtype"], "bf16");
    // The section's older name reads the same (it was accepted and not applied).
    let older = import(&text.replace("\"bf16\"", "\"bfloat16\""), "inline").unwrap();
    assert_eq!(older.layer["training"], imp.layer["training"]);
    let cfg = Config::from_layers(&[
        Layer::overrides(serde_json::json!({"model": {"preset": "llama2-7b"},
            "cluster": {"num_gpus": 8}, "parallel": {"tp": 1, "sp": false},
            "training": {"seq_length": 4096, "global_batch_size": 8}})),
        Layer::overrides(imp.layer),
    ])
    .unwrap();
    let e = estimate(&Resolved::new(cfg).unwrap()).unwrap();
    let s = &e.memory.stages[0];
    let p: u64 = 6_738_415_616; // Llama-2-7B's parameters
    assert_eq!(s.weights + s.gradients + s.optimizer, 4 * p + 6 * p / 8);

    let moments_only = r#"{"bf16": {"enabled": true, "bf16_optimizer_states": true},
                           "zero_optimization": {"stage": 1}, "train_batch_size": 64}"#;
    let imp = import(moments_only, "inline").unwrap();
    let cfg = Config::from_layers(&[Layer::overrides(imp.layer)]).unwrap();
    let err = Resolved::new(cfg).unwrap_err().to_string();
    assert!(err.contains("optimizer_state_dtype"), "{err}");
    let bad = r#"{"bf16": {"enabled": true, "bf16_optimizer_states": "yes"},
                  "train_batch_size": 64}"#;
    let err = import(bad, "inline").unwrap_err().to_string();
    assert!(err.contains("bf16.bf16_optimizer_states"), "{err}");
}
