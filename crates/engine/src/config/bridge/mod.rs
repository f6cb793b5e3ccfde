//! Megatron-Bridge configuration import: the YAML that `ConfigContainer.to_yaml()` writes
//! (the `run_config.yaml` saved with a run's checkpoint, or one written by hand with the same
//! field names) becomes one override layer, merged like a Megatron-LM launch.
//!
//! Megatron-Bridge's model, ddp and optimizer sections are Megatron-Core's own dataclasses,
//! whose field names are Megatron-LM's flags; so every field parsim models is turned into the
//! flag it configures and read by the Megatron import's one mapping (config/megatron). Every
//! field has a row in [`fields`] (read from the dataclasses): mapped, accepted as changing
//! neither memory nor step time (listed in one warning), accepted as a kernel detail (listed
//! apart), modelled at its default only, or refused; a field in no row is refused by name.
//!
//! | Bridge field (dataclass)                                   | parsim                         |
//! |------------------------------------------------------------|--------------------------------|
//! | model.num_layers, hidden_size, ffn_hidden_size, num_attention_heads, kv_channels (`TransformerConfig`) | model.* |
//! | model.num_query_groups (`TransformerConfig`)               | model.num_query_groups (GQA)   |
//! | model.activation_func + gated_linear_unit                  | model.activation (silu+GLU: swiglu) |
//! | model.normalization, add_bias_linear, add_qkv_bias, share_embeddings_and_output_weights, position_embedding_type | model.* |
//! | model.vocab_size (tokenizer.vocab_size), make_vocab_size_divisible_by, should_pad_vocab (`GPTModelProvider`) | model.vocab_size, padding |
//! | model.seq_length (`GPTModelProvider`), dataset.seq_length  | training.seq_length            |
//! | model.num_moe_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq, moe_token_dispatcher_type, moe_flex_dispatcher_backend, ... | model.* / parallel.moe_* |
//! | model.multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim (`MLATransformerConfig`) | model.mla |
//! | model.tensor/pipeline/context/expert_model_parallel_size, expert_tensor_parallel_size, virtual_pipeline_model_parallel_size, sequence_parallel (`ModelParallelConfig`) | parallel.tp, pp, cp, ep, expert_tp, vpp, sp |
//! | model.pipeline_model_parallel_layout, num_layers_in_first/last_pipeline_stage, account_for_embedding/loss_in_pipeline_split | parallel.* |
//! | model.recompute_granularity, recompute_method, recompute_num_layers, recompute_modules | training.recompute, recompute_modules |
//! | model.cpu_offloading, cpu_offloading_num_layers, cpu_offloading_weights | training.offload_activation_layers |
//! | model.cuda_graph_impl, cuda_graph_scope, enable_cuda_graph | training.cuda_graphs      |
//! | model.attention_backend                                    | training.flash_attention       |
//! | mixed_precision.bf16, fp16, fp8, fp8_recipe, fp4, fp4_recipe, fp8_param_gather, first_last_layers_bf16, num_layers_at_start/end_in_bf16 (`MixedPrecisionConfig`, copied onto model and ddp as its `setup` does) | training.precision, fp8_recipe, fp8_param_gather, bf16_layers_at_* |
//! | ddp.grad_reduce_in_fp32 (`DistributedDataParallelConfig`) | training.grad_dtype            |
//! | ddp.use_distributed_optimizer, use_megatron_fsdp, data_parallel_sharding_strategy, overlap_grad_reduce, overlap_param_gather, bucket_size | parallel.zero, fsdp, overlaps, ddp_bucket_size |
//! | comm_overlap.tp_comm_overlap, overlap_grad_reduce, overlap_param_gather, bucket_size (`CommOverlapConfig.setup`) | parallel.tp_comm_overlap, overlaps |
//! | comm_overlap.data_parallel_size                            | cluster.num_gpus (dp x tp x pp x cp) |
//! | optimizer.optimizer, use_precision_aware_optimizer, main_grads_dtype, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype (`OptimizerConfig`) | training.optimizer, optimizer_state_dtype, grad_dtype |
//! | train.micro_batch_size, global_batch_size (`TrainingConfig`) | training.micro_batch_size, global_batch_size |

mod fields;
mod read;
mod yaml;

pub use fields::{all as field_rows, Rule};

use super::import::ImportError;
use fields::rule;
use serde_json::{Map, Value};

/// Why a Megatron-Bridge configuration cannot be read; each names the field and the rule.
pub type BridgeError = ImportError;

/// The result of reading a Megatron-Bridge configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeImport {
    /// An override layer (`{"model": {...}, "parallel": {...}, "training": {...}}`).
    pub layer: Value,
    /// Fields (and sections) accepted because they change neither memory nor step time.
    pub accepted: Vec<String>,
    /// Kernel fusions and communication-kernel details accepted as the same work.
    pub kernels: Vec<String>,
    /// Values taken from elsewhere or read with a caveat, one sentence each.
    pub notes: Vec<String>,
}

impl BridgeImport {
    /// One warning line per kind of note (empty when nothing needs saying).
    pub fn warnings(&self) -> Vec<String> {
        let accepted = super::import::listed(
            "accepted",
            "Megatron-Bridge field(s) that change neither memory nor step time",
            &self.accepted,
        );
        let kernels = super::import::listed(
            "accepted",
            "kernel fusion or communication-kernel field(s) timed as the framework profile's measured kernels",
            &self.kernels,
        );
        accepted
            .into_iter()
            .chain(kernels)
            .chain(self.notes.iter().cloned())
            .collect()
    }
}

/// What the walk over the document found.
#[derive(Debug, Default)]
struct Walked {
    /// Megatron flags with their values and the field each came from.
    flags: Vec<(String, Vec<String>, String)>,
    /// Fields the import's code reads ([`read`]), by path.
    read: Map<String, Value>,
    accepted: Vec<String>,
    kernels: Vec<String>,
}

/// Reads a Megatron-Bridge configuration (YAML). `origin` names it in parse errors.
pub fn import(text: &str, origin: &str) -> Result<BridgeImport, BridgeError> {
    let doc = yaml::parse(text, origin)?;
    let Value::Object(mut top) = doc else {
        return Err(BridgeError::field(
            "(top level)",
            "a Megatron-Bridge configuration is a mapping of sections (model, train, ddp, ...)",
        ));
    };
    if !top.get("model").is_some_and(Value::is_object) {
        return Err(BridgeError::field(
            "model",
            "the model section (Megatron-Bridge's model provider) is required",
        ));
    }
    read::apply_mixed_precision(&mut top)?;
    read::apply_comm_overlap(&mut top)?;
    let mut w = Walked::default();
    section(&top, "", &mut w)?;
    let mut extra = Map::new();
    let mut notes = read::read_fields(&mut w, &mut extra)?;
    let flags = std::mem::take(&mut w.flags);
    let pairs: Vec<(String, Vec<String>)> = flags
        .iter()
        .map(|(f, v, _)| (f.clone(), v.clone()))
        .collect();
    let field_of = |flag: &str| {
        flags
            .iter()
            .rev()
            .find(|(f, _, _)| f == flag)
            .map_or_else(|| flag.to_string(), |(_, _, p)| p.clone())
    };
    let imported = super::megatron::import_flags(
        &pairs,
        |flag, message| BridgeError::field(field_of(flag), message),
        |message| BridgeError::field(blame(&message, &flags), message),
    )?;
    if let Some(flag) = imported.ignored.first() {
        // The field table names only flags the Megatron import reads (unit-tested).
        return Err(BridgeError::field(
            field_of(flag),
            format!("{flag} is not read by the Megatron mapping"),
        ));
    }
    let mut layer = imported.layer;
    merge(&mut layer, Value::Object(extra));
    notes.extend(imported.notes.into_iter().map(|n| rename_flags(&n, &flags)));
    Ok(BridgeImport {
        layer,
        accepted: w.accepted,
        kernels: w.kernels,
        notes,
    })
}

/// The Bridge field whose flag a combined error names (the first one it mentions), or the
/// model section.
fn blame(message: &str, flags: &[(String, Vec<String>, String)]) -> String {
    flags
        .iter()
        .find(|(f, _, _)| mentions(message, f))
        .map_or_else(|| "model".to_string(), |(_, _, p)| p.clone())
}

/// True when `text` names `flag` as a whole word (not `--fp8` inside `--fp8-format`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let next = text[i + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// A note of the Megatron mapping with each flag it names replaced by the Bridge field it
/// came from.
fn rename_flags(note: &str, flags: &[(String, Vec<String>, String)]) -> String {
    // The flags translated here first, then any other the table maps (a note may name a
    // flag the configuration did not give, such as the switch a setting needs).
    let table = fields::all();
    let mut pairs: Vec<(&str, &str)> = flags
        .iter()
        .map(|(f, _, p)| (f.as_str(), p.as_str()))
        .chain(table.iter().filter_map(|(p, r)| match r {
            Rule::Flag(f) | Rule::FlagOff(f) | Rule::FlagDtype(f) => Some((*f, *p)),
            _ => None,
        }))
        .collect();
    pairs.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let mut out = note.to_string();
    for (flag, path) in pairs {
        if mentions(&out, flag) {
            out = out.replace(flag, path);
        }
    }
    out
}

/// Merges `extra` into `layer`, section by section.
fn merge(layer: &mut Value, extra: Value) {
    let (Value::Object(l), Value::Object(e)) = (layer, extra) else {
        return;
    };
    for (section, fields) in e {
        let Value::Object(fields) = fields else {
            continue;
        };
        for (k, v) in fields {
            super::megatron::put(l, &section, &k, v);
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn section(obj: &Map<String, Value>, prefix: &str, w: &mut Walked) -> Result<(), BridgeError> {
    for (key, value) in obj {
        let path = join(prefix, key);
        let Some(rule) = rule(&path) else {
            return Err(BridgeError::field(
                path,
                "unknown field (not a field of Megatron-Bridge's configuration that parsim reads)",
            ));
        };
        apply(rule, &path, value, w)?;
    }
    Ok(())
}

fn apply(rule: &Rule, path: &str, value: &Value, w: &mut Walked) -> Result<(), BridgeError> {
    match rule {
        Rule::Flag(flag) => {
            if let Some(values) = flag_values(path, value)? {
                w.flags.push((flag.to_string(), values, path.to_string()));
            }
        }
        Rule::FlagOff(flag) => match value {
            Value::Bool(false) => w
                .flags
                .push((flag.to_string(), Vec::new(), path.to_string())),
            Value::Bool(true) | Value::Null => {}
            v => {
                return Err(BridgeError::field(
                    path,
                    format!("must be true or false, got {v}"),
                ))
            }
        },
        Rule::FlagDtype(flag) => {
            if let Some(word) = read::dtype_word(path, value)? {
                w.flags
                    .push((flag.to_string(), vec![word.into()], path.to_string()));
            }
        }
        Rule::Read => {
            w.read.insert(path.to_string(), value.clone());
        }
        // Copied onto the model, ddp and optimizer fields already.
        Rule::Precision => {}
        Rule::NoEffect | Rule::NoEffectSection => w.accepted.push(path.to_string()),
        Rule::Kernel => w.kernels.push(path.to_string()),
        Rule::Default(default) => {
            if !same(value, default) {
                return Err(BridgeError::field(
                    path,
                    format!(
                        "{value} is not modelled: parsim models this field at Megatron's default ({default}) only"
                    ),
                ));
            }
        }
        Rule::Section => match value {
            Value::Object(m) => section(m, path, w)?,
            Value::Null => {}
            Value::String(name) if path == "mixed_precision" => {
                return Err(BridgeError::field(
                    path,
                    format!("\"{name}\": {}", read::MIXED_PRECISION_BY_NAME),
                ))
            }
            v => {
                return Err(BridgeError::field(
                    path,
                    format!("must be a mapping, got {v}"),
                ))
            }
        },
        Rule::Unmodelled(why) => {
            if is_set(value) {
                return Err(BridgeError::field(path, *why));
            }
        }
    }
    Ok(())
}

/// The flag's values for a field's value: a switch for true, none for false or null, the
/// number or word, or the list's items.
fn flag_values(path: &str, value: &Value) -> Result<Option<Vec<String>>, BridgeError> {
    let scalar = |v: &Value| match v {
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(s.clone()),
        v => Err(BridgeError::field(
            path,
            format!("must be a number, a word or a list of them, got {v}"),
        )),
    };
    Ok(match value {
        Value::Bool(true) => Some(Vec::new()),
        Value::Bool(false) | Value::Null => None,
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) => Some(items.iter().map(scalar).collect::<Result<_, _>>()?),
        v => Some(vec![scalar(v)?]),
    })
}

/// True when a field sets something: not null, false, 0 or empty.
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Bool(true) => true,
    }
}

/// Equal values, numbers compared as numbers (`1` is `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests;
