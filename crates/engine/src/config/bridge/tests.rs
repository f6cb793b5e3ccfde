use super::*;
use crate::config::{Config, Layer};
use serde_json::json;

/// Megatron-Bridge's Llama 3 8B H100 FP8-CS performance recipe, written with Bridge's field
/// names (the fixture's header cites the recipe's files).
const RECIPE: &str =
    include_str!("../../../../../tests/fixtures/bridge/llama3_8b_pretrain_8gpu_h100_fp8cs.yaml");

fn refused(text: &str) -> (String, String) {
    match import(text, "t.yaml").unwrap_err() {
        BridgeError::Field { at, rule } => (at, rule),
        e @ BridgeError::Parse(_) => panic!("not a field error: {e}"),
    }
}

/// The recipe recomputes 5 of its 32 layers as blocks (`recompute_method: block`,
/// `recompute_num_layers: 5`), which parsim cannot say (it recomputes all layers or none): the
/// import refuses it by the field's name and says why, rather than taking it as full or none.
#[test]
fn the_recipes_partial_block_recompute_is_refused_by_name() {
    let (at, rule) = refused(RECIPE);
    assert_eq!(at, "model.recompute_num_layers");
    assert!(
        rule.contains("block recomputation of 5 of the 32 layers"),
        "{rule}"
    );
}

/// The recipe, at the two settings where the published row differs from it (the 25.11 table
/// prints FSDP 8 for this row, and no recomputation is what the row is predicted with), imports
/// to the configuration that validate/megatron_bridge.rs builds for the row from the
/// table and bridge_models.rs: a second way to the same run. What remains different is
/// named: the model as explicit fields against the preset (the same padded vocabulary and
/// head width), sequence parallelism at TP 1 (nothing to split), and the 128 Mi-element DDP
/// bucket Bridge's `CommOverlapConfig` sets that the row leaves at the framework's default.
#[test]
fn the_recipe_imports_to_the_published_rows_configuration() {
    let doc = RECIPE
        .replace("recompute_granularity: full", "recompute_granularity: null")
        .replace("recompute_method: block", "recompute_method: null")
        .replace("recompute_num_layers: 5", "recompute_num_layers: null")
        .replace("use_megatron_fsdp: false", "use_megatron_fsdp: true")
        .replace(
            "data_parallel_sharding_strategy: no_shard",
            "data_parallel_sharding_strategy: optim_grads_params",
        );
    let imported = import(&doc, "recipe.yaml").unwrap();
    let rows = crate::validate::megatron_bridge::rows().unwrap();
    let row = rows
        .iter()
        .find(|r| r.label.starts_with("25.11 LLAMA3_8B H100 x8 FP8"))
        .expect("the published row");
    let want = Config::from_layers(&[Layer::overrides(row.setup.clone().unwrap())]).unwrap();
    let cluster = json!({"cluster": {"gpu": "h100-sxm", "num_gpus": 8}});
    let mut got = Config::from_layers(&[
        Layer::overrides(imported.layer.clone()),
        Layer::overrides(cluster),
    ])
    .unwrap();

    let (gm, wm) = (&got.model, &want.model);
    assert_eq!(gm.padded_vocab_size(1), wm.padded_vocab_size(1));
    assert_eq!(
        (
            gm.make_vocab_size_divisible_by,
            wm.make_vocab_size_divisible_by
        ),
        (128, 1)
    );
    assert_eq!(
        gm.kv_channels,
        Some(wm.hidden_size / u64::from(wm.num_attention_heads))
    );
    assert_eq!(wm.kv_channels, None);
    assert_eq!(
        (got.parallel.sp, want.parallel.sp, got.parallel.tp),
        (false, true, 1)
    );
    assert_eq!(got.parallel.ddp_bucket_size, Some(128 * 1024 * 1024));
    assert_eq!(want.parallel.ddp_bucket_size, None);
    got.model.name = want.model.name.clone();
    got.model.make_vocab_size_divisible_by = 1;
    got.model.kv_channels = None;
    got.parallel.sp = true;
    got.parallel.ddp_bucket_size = None;
    assert_eq!(got, want);
}

/// A field Megatron-Bridge does not have is refused naming it; so is a known one at a value
/// parsim does not model, and one of the wrong type names the field and the rule.
#[test]
fn unknown_unmodelled_and_bad_fields_are_refused_by_name() {
    let base = "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n";
    let (at, rule) = refused(&format!("{base}  flux_capacitor: true\n"));
    assert_eq!(at, "model.flux_capacitor");
    assert!(rule.starts_with("unknown field"), "{rule}");
    let (at, rule) = refused(&format!("{base}  moe_token_dropping: true\n"));
    assert_eq!(at, "model.moe_token_dropping");
    assert!(rule.contains("default (false)"), "{rule}");
    let (at, rule) = refused(&format!("{base}  tensor_model_parallel_size: two\n"));
    assert_eq!(at, "model.tensor_model_parallel_size");
    assert!(rule.contains("integer") && rule.contains("'two'"), "{rule}");
    let (at, rule) = refused(&format!(
        "{base}  activation_func: torch.nn.functional.silu\n"
    ));
    assert_eq!(at, "model.activation_func");
    assert!(rule.contains("silu without gated_linear_unit"), "{rule}");
    let (at, _) = refused(&format!("{base}peft: {{dim: 16}}\n"));
    assert_eq!(at, "peft");
    let (at, rule) = refused(&format!("{base}mixed_precision: bf16_mixed\n"));
    assert_eq!(at, "mixed_precision");
    assert!(rule.contains("by name"), "{rule}");
    let (at, rule) = refused(&format!(
        "{base}dataset:\n  seq_length: 4096\n  blend: null\n  sequence_length: 2048\n"
    ));
    assert_eq!(at, "dataset.sequence_length");
    assert!(rule.contains("differs"), "{rule}");
    let (at, _) = refused("train:\n  micro_batch_size: 1\n");
    assert_eq!(at, "model");
}

/// `MixedPrecisionConfig.setup` copies its fields onto the model and ddp: the section decides
/// the precision over the model's own fields, as in Bridge; the comm_overlap section turns
/// the distributed optimizer's overlaps on; `data_parallel_size` gives the GPU count.
#[test]
fn mixed_precision_and_comm_overlap_apply_as_bridges_setup_does() {
    let text = "model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n  \
                tensor_model_parallel_size: 2\n  bf16: false\n  fp8: null\n\
                mixed_precision:\n  bf16: true\n  fp8: e4m3\n  fp8_recipe: mxfp8\n  grad_reduce_in_fp32: true\n\
                ddp:\n  use_distributed_optimizer: true\n  overlap_grad_reduce: false\n\
                comm_overlap:\n  tp_comm_overlap: true\n  data_parallel_size: 4\n";
    let imported = import(text, "t.yaml").unwrap();
    let l = &imported.layer;
    assert_eq!(l["training"]["precision"], "mxfp8");
    assert_eq!(l["training"]["grad_dtype"], "fp32");
    assert_eq!(l["parallel"]["tp_comm_overlap"], true);
    assert_eq!(l["parallel"]["overlap_grad_reduce"], true);
    assert_eq!(l["parallel"]["zero"], 1);
    assert_eq!(l["cluster"]["num_gpus"], 8);
    assert!(
        imported.notes.iter().any(|n| n.contains("8 GPUs")),
        "{:?}",
        imported.notes
    );
}

/// Every published Megatron-Bridge recompute setting parsim can say imports; the ones it
/// cannot are refused naming the field: uniform chunks of several layers, a method without
/// full granularity.
#[test]
fn recompute_settings_are_read_or_refused_by_name() {
    let base = "model:\n  num_layers: 8\n  hidden_size: 64\n  num_attention_heads: 4\n  \
                pipeline_model_parallel_size: 2\n";
    let full = |method: &str, n: u32| {
        format!("{base}  recompute_granularity: full\n  recompute_method: {method}\n  recompute_num_layers: {n}\n")
    };
    let l = import(&full("block", 4), "t.yaml").unwrap().layer;
    assert_eq!(l["training"]["recompute"], "full");
    let l = import(&full("uniform", 1), "t.yaml").unwrap().layer;
    assert_eq!(l["training"]["recompute"], "full");
    let (at, rule) = refused(&full("uniform", 2));
    assert_eq!(at, "model.recompute_num_layers");
    assert!(rule.contains("2-layer chunks"), "{rule}");
    let (at, rule) = refused(&full("block", 3));
    assert!(rule.contains("3 of the 4 layers"), "{at}: {rule}");
    let (at, _) = refused(&format!(
        "{base}  recompute_granularity: selective\n  recompute_method: block\n"
    ));
    assert_eq!(at, "model.recompute_method");
    let l = import(
        &format!(
            "{base}  recompute_granularity: selective\n  recompute_modules: [core_attn, mlp]\n"
        ),
        "t.yaml",
    )
    .unwrap()
    .layer;
    assert_eq!(
        l["training"]["recompute_modules"],
        json!(["core_attn", "mlp"])
    );
}
