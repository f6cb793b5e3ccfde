//! DeepSpeed configuration import: the JSON passed to `deepspeed.initialize(config=...)`
//! becomes one override layer shaped like a configuration file, merged like a Megatron-LM
//! launch (over `--config`, under the flags), with `training.framework = "deepspeed"`.
//!
//! Every key is read from DeepSpeed's own config code ([`keys`]): what parsim models lands in
//! the layer; what changes neither memory nor step time is listed in one note; anything else
//! (an unknown key, parameter or NVMe offload, ZeRO++, a setting away from the default parsim
//! models) is refused by its JSON path; the optimizer's CPU offload is read
//! (`training.optimizer_offload_fraction`). The batch fields are checked against DeepSpeed's identity
//! train_batch_size = micro x accumulation x dp once the data-parallel size is known
//! ([`DeepspeedImport::batch_layer`]).

mod batch;
mod keys;
mod walk;

pub use batch::{BatchFields, DeepspeedBatch};

use super::load::parse_json;
use super::megatron::put;
use super::Config;
use serde_json::{Map, Value};

/// Why a DeepSpeed configuration cannot be read; each names the JSON path and the rule.
pub type DeepspeedError = super::import::ImportError;

/// The result of reading a DeepSpeed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepspeedImport {
    /// Keys accepted because they change neither memory nor step time (or sit at the
    /// default parsim models), by JSON path.
    pub accepted: Vec<String>,
    /// Values taken from elsewhere or read with a caveat, one sentence each.
    pub notes: Vec<String>,
    /// An override layer (`{"parallel": {...}, "training": {...}}`), without the batch.
    pub layer: Value,
    /// The batch fields as written, resolved against the data-parallel size later.
    pub batch: BatchFields,
}

impl DeepspeedImport {
    /// One warning line per kind of note (empty when nothing needs saying).
    pub fn warnings(&self) -> Vec<String> {
        let what = "DeepSpeed key(s) that change neither memory nor step time";
        let accepted = super::import::listed("accepted", what, &self.accepted);
        accepted
            .into_iter()
            .chain(self.notes.iter().cloned())
            .collect()
    }

    /// The batch layer at the data-parallel size of `merged` (the configuration with this
    /// import's layer and the others merged), and a note saying which value was derived.
    /// `None` when the JSON gives no batch field (or only "auto" ones).
    pub fn batch_layer(&self, merged: &Config) -> Result<Option<(Value, String)>, DeepspeedError> {
        let Some(dp) = super::rules::data_parallel(merged) else {
            return Ok(None);
        };
        let Some(b) = self.batch.resolve(dp)? else {
            return Ok(None);
        };
        let layer = serde_json::json!({"training": {
            "micro_batch_size": b.micro,
            "global_batch_size": b.global,
        }});
        Ok(Some((layer, format!("deepspeed: {}", b.note))))
    }
}

/// Reads a DeepSpeed configuration (JSON; a key given twice is an error, as DeepSpeed's
/// `dict_raise_error_on_duplicate_keys` makes it). `origin` names it in parse errors.
pub fn import(text: &str, origin: &str) -> Result<DeepspeedImport, DeepspeedError> {
    let doc = parse_json(text, origin)?;
    let walked = walk::walk(&doc)?;
    let mut m = Map::new();
    let mut notes = Vec::new();
    let mut accepted = walked.accepted.clone();
    put(&mut m, "training", "framework", "deepspeed".into());
    let stage = zero_stage(&walked)?;
    put(&mut m, "parallel", "zero", stage.into());
    precision(&walked, &mut m, &mut notes)?;
    zero_settings(&walked, stage, &mut m, &mut accepted)?;
    optimizer(&walked, &mut m)?;
    offload_optimizer(&walked, stage, &mut m)?;
    bf16_optimizer_precision(&walked, &mut m)?;
    if let Some(v) = walked.get("data_types.grad_accum_dtype") {
        let Some(dtype @ ("fp32" | "bf16" | "fp16")) = v.as_str() else {
            return Err(invalid(
                "data_types.grad_accum_dtype",
                format!("must be \"fp32\", \"bf16\" or \"fp16\", got {v}"),
            ));
        };
        put(&mut m, "training", "grad_dtype", dtype.into());
    }
    let batch = BatchFields::read(&walked)?;
    if batch.has_auto {
        notes.push(
            "the batch fields set to \"auto\" (filled by the Hugging Face Trainer) come from \
             --config or the flags (--mbs, --gbs)"
                .into(),
        );
    }
    if accepted
        .iter()
        .any(|p| p.starts_with("activation_checkpointing."))
    {
        notes.push(
            "activation_checkpointing configures DeepSpeed's checkpoint function; whether \
             layers are recomputed is the model's choice: give it as --recompute"
                .into(),
        );
    }
    Ok(DeepspeedImport {
        layer: Value::Object(m),
        batch,
        accepted,
        notes,
    })
}

fn invalid(path: &str, rule: impl Into<String>) -> DeepspeedError {
    DeepspeedError::field(path, rule)
}

/// A whole number of elements (JSON numbers such as `5e8` are floats), or `None` for "auto".
fn count(path: &str, v: &Value) -> Result<Option<u64>, DeepspeedError> {
    if v.as_str() == Some("auto") {
        return Ok(None);
    }
    if let Some(n) = v.as_u64() {
        return Ok(Some(n));
    }
    match v.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 => Ok(Some(f as u64)),
        _ => Err(invalid(
            path,
            format!("must be a whole number of at least 0, got {v}"),
        )),
    }
}

/// `zero_optimization.stage`: 0-3 (`ZeroStageEnum`); absent, DeepSpeed's 0.
fn zero_stage(w: &walk::Walked) -> Result<u8, DeepspeedError> {
    let path = "zero_optimization.stage";
    match w.get(path) {
        None => Ok(0),
        Some(v) => match v.as_u64() {
            Some(s) if s <= 3 => Ok(s as u8),
            _ => Err(invalid(path, format!("must be 0, 1, 2 or 3, got {v}"))),
        },
    }
}

/// `bf16.enabled` (or the old `bfloat16`) and `fp16.enabled` -> `training.precision`;
/// neither: DeepSpeed trains in fp32. Both: DeepSpeed refuses (`_initialize_params`).
fn precision(
    w: &walk::Walked,
    m: &mut Map<String, Value>,
    notes: &mut Vec<String>,
) -> Result<(), DeepspeedError> {
    let mut auto = false;
    let mut flag = |path: &str| -> Result<bool, DeepspeedError> {
        match w.get(path) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) if v.as_str() == Some("auto") => {
                auto = true;
                Ok(false)
            }
            Some(v) => Err(invalid(path, format!("must be true or false, got {v}"))),
        }
    };
    let bf16 = flag("bf16.enabled")? || flag("bfloat16.enabled")?;
    let fp16 = flag("fp16.enabled")?;
    let precision = match (bf16, fp16) {
        (true, true) => {
            return Err(invalid(
                "fp16.enabled",
                "bf16 and fp16 cannot both be enabled (DeepSpeed refuses it)",
            ))
        }
        (true, false) => "bf16",
        (false, true) => "fp16",
        (false, false) if auto => {
            notes.push(
                "bf16/fp16 \"auto\" (filled by the Hugging Face Trainer): the precision comes \
                 from --config or --precision"
                    .into(),
            );
            return Ok(());
        }
        (false, false) => "fp32",
    };
    put(m, "training", "precision", precision.into());
    Ok(())
}

/// `bf16.bf16_master_weights_and_grads` -> no fp32 master copy and bf16 gradients
/// (`training.master_weights = false`, `grad_dtype = "bf16"`: stage_1_and_2.py keeps the rank's
/// partition in bf16), `bf16.bf16_optimizer_states` -> bf16 Adam moments
/// (`training.optimizer_state_dtype = "bf16"`); the configuration rules then say which pairs
/// DeepSpeed runs (precision_config.py `DeepSpeedBF16Config`).
fn bf16_optimizer_precision(
    w: &walk::Walked,
    m: &mut Map<String, Value>,
) -> Result<(), DeepspeedError> {
    let on = |path: &str| -> Result<bool, DeepspeedError> {
        match w.get(path) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(invalid(path, format!("must be true or false, got {v}"))),
        }
    };
    // The section's older name, `bfloat16`, holds the same keys (keys.txt).
    let either = |key: &str| -> Result<bool, DeepspeedError> {
        Ok(on(&format!("bf16.{key}"))? || on(&format!("bfloat16.{key}"))?)
    };
    if either("bf16_master_weights_and_grads")? {
        put(m, "training", "master_weights", false.into());
        put(m, "training", "grad_dtype", "bf16".into());
    }
    if either("bf16_optimizer_states")? {
        put(m, "training", "optimizer_state_dtype", "bf16".into());
    }
    Ok(())
}

/// The ZeRO settings parsim has a knob for. Stage-3 keys at another stage are not read by
/// DeepSpeed (its stage 1/2 optimizer never sees them), so they are listed as accepted;
/// `reduce_bucket_size` at stage 0 likewise (engine.py `allreduce_gradients` buckets at its
/// own `MEMORY_OPT_ALLREDUCE_SIZE`, 5e8, which is parsim's DeepSpeed bucket).
fn zero_settings(
    w: &walk::Walked,
    stage: u8,
    m: &mut Map<String, Value>,
    accepted: &mut Vec<String>,
) -> Result<(), DeepspeedError> {
    let knobs: [(&[&str], &str, u8); 4] = [
        (&["reduce_bucket_size"], "ddp_bucket_size", 1),
        (
            &["stage3_prefetch_bucket_size", "prefetch_bucket_size"],
            "zero3_prefetch_bucket_size",
            3,
        ),
        (
            &[
                "stage3_param_persistence_threshold",
                "param_persistence_threshold",
            ],
            "zero3_param_persistence_threshold",
            3,
        ),
        (
            &["stage3_max_live_parameters", "max_live_parameters"],
            "zero3_max_live_parameters",
            3,
        ),
    ];
    for (names, field, from_stage) in knobs {
        for name in names {
            let path = format!("zero_optimization.{name}");
            let Some(v) = w.get(&path) else { continue };
            if stage < from_stage {
                accepted.push(path);
                continue;
            }
            let Some(n) = count(&path, v)? else {
                return Err(invalid(
                    &path,
                    "\"auto\" is filled by the Hugging Face Trainer from the model's hidden size; give the number",
                ));
            };
            if field == "ddp_bucket_size" && n == 0 {
                return Err(invalid(
                    &path,
                    "a bucket of 0 elements is not modelled; give at least 1",
                ));
            }
            put(m, "parallel", field, n.into());
        }
    }
    // overlap_comm: DeepSpeed's default (None) is on at stage 3 only, as parsim's DeepSpeed
    // default; an explicit value sets the gradient reduction's overlap (stage_1_and_2.py and
    // stage3.py reduce on a side stream with it).
    if let Some(v) = w.get("zero_optimization.overlap_comm") {
        match v {
            Value::Bool(b) => put(m, "parallel", "overlap_grad_reduce", (*b).into()),
            v if v.as_str() == Some("auto") || v.is_null() => {
                accepted.push("zero_optimization.overlap_comm".into())
            }
            v => {
                return Err(invalid(
                    "zero_optimization.overlap_comm",
                    format!("must be true or false, got {v}"),
                ))
            }
        }
    }
    Ok(())
}

/// `zero_optimization.offload_optimizer` with `device` "cpu": ZeRO-Offload keeps the
/// partition's master copy and moments in host memory and steps them with `DeepSpeedCPUAdam`
/// (src/memory/optimizer_offload.rs), all of them (`optimizer_offload_fraction` 1). The
/// section belongs to the ZeRO config (`DeepSpeedZeroConfig.offload_optimizer`) and only the
/// ZeRO optimizers read it (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py): at stage 0
/// it would do nothing, so it is refused there rather than dropped.
fn offload_optimizer(
    w: &walk::Walked,
    stage: u8,
    m: &mut Map<String, Value>,
) -> Result<(), DeepspeedError> {
    let path = "zero_optimization.offload_optimizer";
    if w.get(&format!("{path}.device")).is_none() {
        return Ok(());
    }
    if stage == 0 {
        return Err(invalid(
            path,
            "CPU optimizer offload needs ZeRO stage 1, 2 or 3 (DeepSpeed offloads the ZeRO optimizer's partition)",
        ));
    }
    put(m, "training", "optimizer_offload_fraction", 1.0.into());
    Ok(())
}

/// `optimizer.type`: the Adam family (DeepSpeed's `adam`, `adamw`, and torch's `Adam`,
/// `AdamW`) and `muon` have parsim counterparts; any other optimizer keeps states or
/// communicates in ways parsim does not model.
fn optimizer(w: &walk::Walked, m: &mut Map<String, Value>) -> Result<(), DeepspeedError> {
    let path = "optimizer.type";
    let Some(v) = w.get(path) else { return Ok(()) };
    let name = v
        .as_str()
        .ok_or_else(|| invalid(path, format!("must be a string, got {v}")))?;
    match name.to_ascii_lowercase().as_str() {
        "adam" | "adamw" | "fusedadam" => put(m, "training", "optimizer", "adam".into()),
        "muon" => put(m, "training", "optimizer", "muon".into()),
        _ => {
            return Err(invalid(
                path,
                format!(
                    "the optimizer \"{name}\" is not modelled (parsim models Adam/AdamW and Muon)"
                ),
            ))
        }
    }
    Ok(())
}
