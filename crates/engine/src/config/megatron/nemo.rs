//! NeMo (1.x, Hydra) launches: `python megatron_gpt_pretraining.py trainer.devices=8
//! model.tensor_model_parallel_size=2 ...`. Each `model.*` / `trainer.*` override is turned
//! into the Megatron-LM flag it configures, so one mapping serves both; an override with no
//! counterpart keeps its own name and is reported as ignored.

/// Hydra overrides taken out of `args`: the Megatron flags they stand for, the launcher words
/// (GPU count) they give, and the remaining arguments.
pub(super) struct Translated {
    pub flags: Vec<(String, Vec<String>)>,
    pub launcher: Vec<String>,
    pub rest: Vec<String>,
}

/// NeMo model keys spelled like Megatron's flags (underscores for dashes).
const SAME_NAME: &[&str] = &[
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "micro_batch_size",
    "global_batch_size",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "make_vocab_size_divisible_by",
    "max_position_embeddings",
    "moe_router_topk",
    "hidden_dropout",
    "attention_dropout",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_aux_loss_coeff",
];

/// True for a Hydra override of the NeMo config (`model.x=1`, `+trainer.y=2`).
pub(super) fn is_override(word: &str) -> bool {
    let w = word.trim_start_matches(['+', '~']);
    (w.starts_with("model.") || w.starts_with("trainer.")) && w.contains('=')
}

fn truthy(v: &str) -> bool {
    matches!(v, "True" | "true" | "1")
}

/// The Megatron flag for one override (none for a false switch).
fn translate(key: &str, value: &str) -> Option<(String, Vec<String>)> {
    let flag = |f: &str, v: Option<&str>| {
        Some((
            f.to_string(),
            v.map(|v| vec![v.to_string()]).unwrap_or_default(),
        ))
    };
    let switch = |f: &str, on: bool| if on { flag(f, None) } else { None };
    let model_key = key.strip_prefix("model.");
    match (model_key, key) {
        (Some(k), _) if SAME_NAME.contains(&k) => {
            flag(&format!("--{}", k.replace('_', "-")), Some(value))
        }
        (Some("encoder_seq_length" | "seq_length"), _) => flag("--seq-length", Some(value)),
        (Some("num_moe_experts"), _) => flag("--num-experts", Some(value)),
        (Some("sequence_parallel"), _) => switch("--sequence-parallel", truthy(value)),
        (Some("activation"), _) => switch("--swiglu", value.contains("swiglu")),
        (Some("bias"), _) => switch("--disable-bias-linear", !truthy(value)),
        (Some("qkv_bias"), _) => switch("--add-qkv-bias", truthy(value)),
        (Some("share_embeddings_and_output_weights"), _) => {
            switch("--untie-embeddings-and-output-weights", !truthy(value))
        }
        (Some("normalization"), _) => flag(
            "--normalization",
            Some(if value.eq_ignore_ascii_case("rmsnorm") {
                "RMSNorm"
            } else {
                "LayerNorm"
            }),
        ),
        (Some("position_embedding_type"), _) => flag("--position-embedding-type", Some(value)),
        (Some("activations_checkpoint_granularity"), _) => (value != "null").then(|| {
            (
                "--recompute-granularity".to_string(),
                vec![value.to_string()],
            )
        }),
        (Some("activations_checkpoint_method"), _) => {
            (value != "null").then(|| ("--recompute-method".to_string(), vec![value.to_string()]))
        }
        (Some("activations_checkpoint_num_layers"), _) => (value != "null").then(|| {
            (
                "--recompute-num-layers".to_string(),
                vec![value.to_string()],
            )
        }),
        (Some("fp8"), _) => {
            switch("--fp8-format", truthy(value)).map(|(f, _)| (f, vec!["hybrid".into()]))
        }
        (Some("optim.name"), _) => switch(
            "--use-distributed-optimizer",
            value.starts_with("distributed"),
        ),
        (_, "trainer.precision") => match value {
            "bf16" | "bf16-mixed" => flag("--bf16", None),
            "16" | "16-mixed" | "fp16" => flag("--fp16", None),
            _ => None,
        },
        _ => flag(key, Some(value)),
    }
}

/// Takes the Hydra overrides out of `args`.
pub(super) fn take_overrides(args: &[String]) -> Translated {
    let mut out = Translated {
        flags: Vec::new(),
        launcher: Vec::new(),
        rest: Vec::new(),
    };
    for word in args {
        if !is_override(word) {
            out.rest.push(word.clone());
            continue;
        }
        let (key, value) = word
            .trim_start_matches(['+', '~'])
            .split_once('=')
            .expect("an override has '='");
        match key {
            "trainer.devices" => out
                .launcher
                .extend(["--nproc_per_node".into(), value.into()]),
            "trainer.num_nodes" => out.launcher.extend(["--nnodes".into(), value.into()]),
            _ => out.flags.extend(translate(key, value)),
        }
    }
    out
}
