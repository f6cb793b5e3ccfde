//! The Megatron-Bridge fields the import reads with code rather than as one flag: what
//! Bridge's own setup copies between sections (mixed precision, communication overlap), the
//! model's activation, vocabulary padding and recomputation, and the dataset, tokenizer and
//! environment sections.

use super::fields::{rule, Rule};
use super::{BridgeError, Walked};
use serde_json::{json, Map, Value};

/// Why a mixed-precision recipe given by name is refused.
pub const MIXED_PRECISION_BY_NAME: &str =
    "a mixed-precision recipe given by name is not expanded: \
give its MixedPrecisionConfig fields (a saved run_config.yaml has them)";

/// `MixedPrecisionConfig.setup` (training/mixed_precision.py,
/// `update_config_with_precision_overrides`): every field of the mixed-precision section
/// overwrites the model, ddp and optimizer field of the same name.
pub fn apply_mixed_precision(top: &mut Map<String, Value>) -> Result<(), BridgeError> {
    let Some(Value::Object(mp)) = top.get("mixed_precision").cloned() else {
        return Ok(());
    };
    for (key, value) in mp {
        if rule(&format!("mixed_precision.{key}")) != Some(&Rule::Precision) {
            continue;
        }
        // Where the copy lands on a field that changes nothing it is left out (so the note
        // of accepted fields lists only what the file says).
        for section in ["model", "ddp", "optimizer"] {
            let target = rule(&format!("{section}.{key}"));
            if target.is_some_and(|r| *r != Rule::NoEffect) {
                section_mut(top, section)?.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(())
}

/// `CommOverlapConfig.setup` (training/comm_overlap.py): with a comm_overlap section the
/// model's TP overlap and EP overlap are its values (off when not given:
/// `_get_model_comm_overlap_cfgs`), and with the distributed optimizer the gradient
/// reduce-scatter and parameter all-gather overlap with 128 Mi-element buckets unless it says
/// otherwise (`_get_optimizer_overlap_cfgs`; with one data-parallel rank there is nothing to
/// overlap, so the values do not matter there).
pub fn apply_comm_overlap(top: &mut Map<String, Value>) -> Result<(), BridgeError> {
    let Some(Value::Object(co)) = top.get("comm_overlap").cloned() else {
        return Ok(());
    };
    let given = |k: &str| co.get(k).filter(|v| !v.is_null()).cloned();
    let model = section_mut(top, "model")?;
    for key in ["tp_comm_overlap", "overlap_moe_expert_parallel_comm"] {
        model.insert(key.into(), given(key).unwrap_or(Value::Bool(false)));
    }
    let distributed = top
        .get("ddp")
        .and_then(|d| d.get("use_distributed_optimizer"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if distributed {
        let ddp = section_mut(top, "ddp")?;
        ddp.insert(
            "overlap_grad_reduce".into(),
            given("overlap_grad_reduce").unwrap_or(json!(true)),
        );
        ddp.insert(
            "overlap_param_gather".into(),
            given("overlap_param_gather").unwrap_or(json!(true)),
        );
        ddp.insert(
            "bucket_size".into(),
            given("bucket_size").unwrap_or(json!(128u64 * 1024 * 1024)),
        );
    }
    Ok(())
}

fn section_mut<'a>(
    top: &'a mut Map<String, Value>,
    name: &str,
) -> Result<&'a mut Map<String, Value>, BridgeError> {
    match top.entry(name).or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(m) => Ok(m),
        v => Err(BridgeError::field(
            name,
            format!("must be a mapping, got {v}"),
        )),
    }
}

/// A torch dtype (`torch.bfloat16`) as Megatron-LM's word for it (`bf16`); none for null.
pub fn dtype_word(path: &str, value: &Value) -> Result<Option<&'static str>, BridgeError> {
    let word = match value {
        Value::Null => return Ok(None),
        Value::String(s) => match s.trim_start_matches("torch.") {
            "float32" | "float" => "fp32",
            "bfloat16" => "bf16",
            "float16" | "half" => "fp16",
            "uint8" => "fp8",
            _ => "",
        },
        _ => "",
    };
    if word.is_empty() {
        return Err(BridgeError::field(
            path,
            format!("must be a torch dtype (torch.float32, torch.bfloat16, torch.float16, torch.uint8), got {value}"),
        ));
    }
    Ok(Some(word))
}

impl Walked {
    fn flag(&self, flag: &str) -> Option<&[String]> {
        self.flags
            .iter()
            .rev()
            .find(|(f, _, _)| f == flag)
            .map(|(_, v, _)| v.as_slice())
    }

    fn int(&self, flag: &str) -> Option<u64> {
        self.flag(flag)?.first()?.parse().ok()
    }

    fn push(&mut self, flag: &str, values: &[&str], path: &str) {
        let values = values.iter().map(|v| v.to_string()).collect();
        self.flags
            .push((flag.to_string(), values, path.to_string()));
    }

    fn read(&self, path: &str) -> &Value {
        self.read.get(path).unwrap_or(&Value::Null)
    }
}

/// Reads the `read` fields into flags (and `extra`, the layer's values no flag carries);
/// returns the notes.
pub fn read_fields(
    w: &mut Walked,
    extra: &mut Map<String, Value>,
) -> Result<Vec<String>, BridgeError> {
    let mut notes = Vec::new();
    provider(w)?;
    if let Some(g) = w.read("model.num_query_groups").as_u64() {
        let g = g.to_string();
        w.push("--num-query-groups", &[&g], "model.num_query_groups");
        w.push("--group-query-attention", &[], "model.num_query_groups");
    }
    notes.extend(activation(w)?);
    // `should_pad_vocab` false (GPTModelProvider's default): the vocabulary is used as given.
    if w.read("model.should_pad_vocab") != &Value::Bool(true) {
        w.push(
            "--make-vocab-size-divisible-by",
            &["1"],
            "model.should_pad_vocab",
        );
    }
    recompute(w)?;
    dtypes(w)?;
    if w.read("ddp.grad_reduce_in_fp32") == &Value::Bool(false) {
        w.push("--grad-reduce-in-bf16", &[], "ddp.grad_reduce_in_fp32");
    }
    sections(w, &mut notes)?;
    // The sharding strategies configure Megatron-FSDP only; without it they do nothing
    // (`DistributedDataParallelConfig.data_parallel_sharding_strategy`: "Sharding strategy for
    // FSDP").
    if w.flag("--use-megatron-fsdp").is_none() {
        let strategies = [
            "--data-parallel-sharding-strategy",
            "--outer-dp-sharding-strategy",
        ];
        let (unused, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut w.flags)
            .into_iter()
            .partition(|(f, _, _)| strategies.contains(&f.as_str()));
        w.flags = kept;
        w.accepted.extend(unused.into_iter().map(|(_, _, p)| p));
    }
    if let Some(dp) = w.read("comm_overlap.data_parallel_size").as_u64() {
        let degree = |f: &str| w.int(f).unwrap_or(1);
        let gpus = dp
            * degree("--tensor-model-parallel-size")
            * degree("--pipeline-model-parallel-size")
            * degree("--context-parallel-size");
        extra.insert("cluster".into(), json!({"num_gpus": gpus}));
        notes.push(format!(
            "comm_overlap.data_parallel_size {dp}: {gpus} GPUs (data x tensor x pipeline x context parallel)"
        ));
    }
    Ok(notes)
}

/// `model._target_`: a Megatron-Bridge GPT-style model provider; `transformer_layer_spec`:
/// Megatron's own layer specs (the local one runs Megatron's unfused attention).
fn provider(w: &mut Walked) -> Result<(), BridgeError> {
    if let Some(target) = w.read("model._target_").as_str().map(str::to_string) {
        let class = target.rsplit('.').next().unwrap_or(&target);
        if !target.starts_with("megatron.bridge.models.") || class.starts_with("T5") {
            return Err(BridgeError::field(
                "model._target_",
                format!("{target} is not a Megatron-Bridge GPT-style model provider (T5 and custom models are not modelled)"),
            ));
        }
    }
    let spec = w.read("model.transformer_layer_spec").clone();
    match spec.as_str() {
        None if spec.is_null() => {}
        Some(s)
            if s.starts_with("megatron.")
                && s.rsplit('.').next().is_some_and(|f| f.contains("spec")) =>
        {
            if s.rsplit('.').next().is_some_and(|f| f.contains("local")) {
                w.push(
                    "--attention-backend",
                    &["local"],
                    "model.transformer_layer_spec",
                );
            }
            w.accepted.push("model.transformer_layer_spec".into());
        }
        _ => {
            return Err(BridgeError::field(
                "model.transformer_layer_spec",
                format!("{spec}: a layer spec other than Megatron's own is not modelled"),
            ))
        }
    }
    Ok(())
}

/// `activation_func` with `gated_linear_unit` (TransformerConfig; default GeLU, not gated).
fn activation(w: &mut Walked) -> Result<Vec<String>, BridgeError> {
    let func = match w.read("model.activation_func") {
        Value::Null => "gelu".to_string(),
        Value::String(s) => s.rsplit('.').next().unwrap_or(s).to_string(),
        v => {
            return Err(BridgeError::field(
                "model.activation_func",
                format!("must be a function's name (torch.nn.functional.silu), got {v}"),
            ))
        }
    };
    let gated = match w.read("model.gated_linear_unit") {
        Value::Null => false,
        Value::Bool(b) => *b,
        v => {
            return Err(BridgeError::field(
                "model.gated_linear_unit",
                format!("must be true or false, got {v}"),
            ))
        }
    };
    let gelu = matches!(
        func.as_str(),
        "gelu" | "fast_gelu" | "openai_gelu" | "erf_gelu"
    );
    let path = "model.activation_func";
    let mut notes = Vec::new();
    match (func.as_str(), gated) {
        ("silu", true) => w.push("--swiglu", &[], path),
        ("quick_gelu", true) => w.push("--quick-geglu", &[], path),
        (_, true) if gelu => {
            w.push("--swiglu", &[], path);
            notes.push(format!(
                "model.activation_func {func} with gated_linear_unit: GeGLU, counted with SwiGLU's shapes"
            ));
        }
        ("squared_relu", false) => w.push("--squared-relu", &[], path),
        (_, false) if gelu => {}
        _ => {
            return Err(BridgeError::field(
                path,
                format!(
                    "{func}{} is not modelled (SwiGLU, GeGLU, GeLU and squared ReLU are)",
                    if gated {
                        " with gated_linear_unit"
                    } else {
                        " without gated_linear_unit"
                    }
                ),
            ))
        }
    }
    Ok(notes)
}

/// `recompute_method` and `recompute_num_layers` (TransformerConfig): with full
/// granularity, every layer recomputed one by one (uniform of 1, or block covering every
/// layer of a virtual stage) is what parsim models; recomputing some layers, or layers in
/// chunks, is refused.
fn recompute(w: &mut Walked) -> Result<(), BridgeError> {
    let full = w
        .flag("--recompute-granularity")
        .is_some_and(|v| v.first().map(String::as_str) == Some("full"));
    let method = w.read("model.recompute_method").clone();
    let layers = w.read("model.recompute_num_layers").clone();
    if !full {
        for (path, v) in [
            ("model.recompute_method", &method),
            ("model.recompute_num_layers", &layers),
        ] {
            if !v.is_null() {
                return Err(BridgeError::field(
                    path,
                    format!("{v}: only with recompute_granularity full (Megatron-Core's rule)"),
                ));
            }
        }
        return Ok(());
    }
    let n = match &layers {
        Value::Null => 1,
        v => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
            BridgeError::field(
                "model.recompute_num_layers",
                format!("must be a whole number of at least 1, got {v}"),
            )
        })?,
    };
    let stages = w.int("--pipeline-model-parallel-size").unwrap_or(1)
        * w.int("--virtual-pipeline-model-parallel-size").unwrap_or(1);
    let per_stage = w.int("--num-layers").map(|l| l.div_ceil(stages.max(1)));
    match method.as_str() {
        Some("uniform") if n == 1 => Ok(()),
        Some("uniform") => Err(BridgeError::field(
            "model.recompute_num_layers",
            format!("{n}: uniform recomputation of {n}-layer chunks is not modelled (parsim recomputes layer by layer: 1)"),
        )),
        Some("block") if per_stage.is_some_and(|p| n >= p) => Ok(()),
        Some("block") => Err(BridgeError::field(
            "model.recompute_num_layers",
            format!(
                "{n}: block recomputation of {n} of the {} layers of each virtual pipeline stage is not modelled (parsim recomputes all of them or none)",
                per_stage.map_or_else(|| "?".to_string(), |p| p.to_string())
            ),
        )),
        _ => Err(BridgeError::field(
            "model.recompute_method",
            format!("must be \"uniform\" or \"block\" with recompute_granularity full, got {method}"),
        )),
    }
}

/// `params_dtype` agrees with the precision (bf16 parameters under bf16, ...);
/// `pipeline_dtype` and `autocast_dtype` are dtypes (the pipeline sends the activations' dtype;
/// autocast is off: `model.enable_autocast` is modelled at false).
fn dtypes(w: &mut Walked) -> Result<(), BridgeError> {
    let precision = if w.flag("--bf16").is_some() {
        "bf16"
    } else if w.flag("--fp16").is_some() {
        "fp16"
    } else {
        "fp32"
    };
    let params = w.read("model.params_dtype").clone();
    if let Some(word) = dtype_word("model.params_dtype", &params)? {
        if word != precision {
            return Err(BridgeError::field(
                "model.params_dtype",
                format!("{params} with {precision} training is not modelled (the parameters are kept in the training precision)"),
            ));
        }
    }
    for path in ["model.pipeline_dtype", "model.autocast_dtype"] {
        let v = w.read(path).clone();
        if dtype_word(path, &v)?.is_some() {
            w.accepted.push(path.into());
        }
    }
    Ok(())
}

/// The dataset's sequence length (GPTDatasetConfig `seq_length`, older `sequence_length`), the
/// tokenizer's vocabulary where the model gives none, and the environment variables.
fn sections(w: &mut Walked, notes: &mut Vec<String>) -> Result<(), BridgeError> {
    let dataset = w.read("dataset").clone();
    if let Value::Object(d) = &dataset {
        for key in ["seq_length", "sequence_length"] {
            let path = format!("dataset.{key}");
            let Some(v) = d.get(key).filter(|v| !v.is_null()) else {
                continue;
            };
            let s = v.as_u64().ok_or_else(|| {
                BridgeError::field(&path, format!("must be a whole number, got {v}"))
            })?;
            match w.int("--seq-length") {
                Some(m) if m != s => {
                    return Err(BridgeError::field(
                        path,
                        format!("{s} differs from model.seq_length {m} (Megatron-Bridge requires them equal)"),
                    ))
                }
                Some(_) => {}
                None => w.push("--seq-length", &[&s.to_string()], &path),
            }
        }
        w.accepted.push("dataset".into());
    } else if !dataset.is_null() {
        return Err(BridgeError::field(
            "dataset",
            format!("must be a mapping, got {dataset}"),
        ));
    }
    let tokenizer = w.read("tokenizer").clone();
    if let Value::Object(t) = &tokenizer {
        if let Some(v) = t.get("vocab_size").filter(|v| !v.is_null()) {
            let n = v.as_u64().ok_or_else(|| {
                BridgeError::field(
                    "tokenizer.vocab_size",
                    format!("must be a whole number, got {v}"),
                )
            })?;
            if w.flag("--vocab-size").is_none() {
                w.push("--vocab-size", &[&n.to_string()], "tokenizer.vocab_size");
            }
        }
        w.accepted.push("tokenizer".into());
    } else if !tokenizer.is_null() {
        return Err(BridgeError::field(
            "tokenizer",
            format!("must be a mapping, got {tokenizer}"),
        ));
    }
    match w.read("env_vars") {
        Value::Null => {}
        Value::Object(vars) if vars.is_empty() => {}
        Value::Object(vars) => notes.push(format!(
            "env_vars are not modelled (parsim times the framework profile's defaults): {}",
            vars.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
        v => {
            return Err(BridgeError::field(
                "env_vars",
                format!("must be a mapping, got {v}"),
            ))
        }
    }
    Ok(())
}
