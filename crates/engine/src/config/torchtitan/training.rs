//! torchtitan's model, precision, activation checkpointing and optimizer settings.

use super::job::Job;
use super::parallelism::Degrees;
use super::{Out, TorchtitanError};
use crate::config::megatron::put;
use serde_json::{json, Map, Value};

/// torchtitan's model flavors that are parsim presets: (`model.name`, `model.flavor`,
/// preset). The shapes agree: torchtitan/models/llama3/__init__.py's `llama3_args` give dim,
/// layers, heads and KV heads, and `FeedForward` (model/model.py) sizes the MLP as
/// multiple_of x ceil(ffn_dim_multiplier x int(8 dim / 3) / multiple_of), the presets'
/// ffn_hidden_size (tests/engine/torchtitan_import.rs derives it).
pub const FLAVORS: &[(&str, &str, &str)] = &[
    ("llama3", "8B", "llama3-8b"),
    ("llama3", "70B", "llama3-70b"),
    ("llama3", "405B", "llama3-405b"),
];

/// The parsim preset of the job's model.
pub fn preset(job: &Job) -> Result<&'static str, TorchtitanError> {
    let name = job.string("model.name").unwrap_or_default();
    let flavor = job.string("model.flavor").unwrap_or_default();
    if !FLAVORS.iter().any(|(n, _, _)| *n == name) {
        let names: Vec<&str> = FLAVORS.iter().map(|(n, _, _)| *n).collect();
        return Err(job.unmodelled(
            "model.name",
            format!("no parsim preset for this model (read: {})", names[0]),
        ));
    }
    FLAVORS
        .iter()
        .find(|(n, f, _)| *n == name && *f == flavor)
        .map(|(_, _, p)| *p)
        .ok_or_else(|| {
            let known: Vec<&str> = FLAVORS
                .iter()
                .filter(|(n, _, _)| *n == name)
                .map(|(_, f, _)| *f)
                .collect();
            job.unmodelled(
                "model.flavor",
                format!(
                    "no parsim preset matches {name} flavor '{flavor}' (known: {})",
                    known.join(", ")
                ),
            )
        })
}

/// Puts the precision: the FSDP2 `MixedPrecisionPolicy` (`mixed_precision_param`,
/// `mixed_precision_reduce`; `apply_fsdp`), autocast under DDP or on one GPU, none with TP or
/// PP and no FSDP (`maybe_enable_amp`, torchtitan/distributed/utils.py), pure bf16
/// (`training.dtype`, [`pure_bf16`]), and the float8 or MX converters
/// (torchtitan/components/quantization/).
pub fn put_precision(job: &Job, d: &Degrees, out: &mut Out) -> Result<(), TorchtitanError> {
    let Out { layer, notes } = out;
    const PARAM: &str = "training.mixed_precision_param";
    const REDUCE: &str = "training.mixed_precision_reduce";
    let param = match job.string(PARAM).as_deref() {
        Some("bfloat16") => "bf16",
        Some("float32") => "fp32",
        _ => return Err(job.invalid(PARAM, "must be \"bfloat16\" or \"float32\"")),
    };
    if job.string(REDUCE).as_deref() != Some("float32") {
        return Err(job.invalid(REDUCE, "must be \"float32\" (its only value in torchtitan)"));
    }
    let mixed = d.fsdp || (d.tp == 1 && d.pp == 1);
    let pure_bf16 = pure_bf16(job, mixed && param == "fp32")?;
    let mut precision = match (pure_bf16, mixed) {
        (true, _) => "bf16",
        (false, true) => param,
        (false, false) => "fp32",
    };
    if !mixed && !pure_bf16 && param != "fp32" {
        notes.push(
            "no FSDP with tp or pp > 1: torchtitan trains without mixed precision (maybe_enable_amp), so fp32".into(),
        );
    }
    if pure_bf16 {
        put(layer, "training", "master_weights", json!(false));
        notes.push(PURE_BF16_NOTE.into());
    }
    let grad_dtype = if pure_bf16 { "bf16" } else { "fp32" };
    put(layer, "training", "grad_dtype", json!(grad_dtype));
    let converters = job.list("model.converters");
    for c in &converters {
        let (format, section) = match c.as_str() {
            "float8" => ("fp8", "float8"),
            "quantize.linear.float8" => ("fp8", "quantize.linear.float8"),
            "mx" => ("mxfp8", "mx"),
            "quantize.linear.mx" => ("mxfp8", "quantize.linear.mx"),
            "quantize.grouped_mm.float8" | "quantize.grouped_mm.mx" => continue,
            other => {
                return Err(job.unmodelled(
                    "model.converters",
                    format!(
                        "converter '{other}': parsim reads the float8 and mx linear converters"
                    ),
                ))
            }
        };
        if precision == "fp8" || precision == "mxfp8" {
            return Err(job.invalid("model.converters", "two linear quantization converters"));
        }
        if pure_bf16 {
            return Err(job.unmodelled(
                "model.converters",
                "training.dtype = \"bfloat16\" with a float8 or MX converter: parsim models training without a master copy at bf16 precision only",
            ));
        }
        precision = format;
        low_precision(job, section, d, layer)?;
    }
    put(layer, "training", "precision", json!(precision));
    Ok(())
}

/// What `training.dtype = "bfloat16"` means, said once in the import's notes.
const PURE_BF16_NOTE: &str = "training.dtype = \"bfloat16\": parameters, gradients and AdamW's moments in bf16 with no fp32 master copy (torchtitan builds the model under set_default_dtype(training.dtype), train.py; JobConfig's Training.dtype), so training.master_weights = false";

/// Whether the job trains in pure bf16: `training.dtype = "bfloat16"` builds the model's
/// parameters in bf16 (train.py: the model is built under `set_default_dtype(training.dtype)`;
/// job_config.py's `Training.dtype`: "all parameters, gradients, and optimizer states in
/// bfloat16, without an extra copy of fp32 weights"). `fp32_compute` (mixed precision with
/// `mixed_precision_param = "float32"`) over bf16 parameters is refused: parsim runs no fp32
/// compute over a bf16 store.
fn pure_bf16(job: &Job, fp32_compute: bool) -> Result<bool, TorchtitanError> {
    const DTYPE: &str = "training.dtype";
    match job.string(DTYPE).as_deref() {
        Some("float32") => Ok(false),
        Some("bfloat16") if fp32_compute => Err(job.unmodelled(
            "training.mixed_precision_param",
            "fp32 compute over bf16 parameters (training.dtype = \"bfloat16\") is not modelled",
        )),
        Some("bfloat16") => Ok(true),
        _ => Err(job.invalid(DTYPE, "must be \"bfloat16\" or \"float32\"")),
    }
}

/// The settings of a float8 or MX converter, read from its `section`: the recipe (float8:
/// none or "tensorwise" is dynamic per-tensor scaling, parsim's "current"; MX: an MXFP8
/// recipe), the output layer kept in high precision (`filter_fqns = ["output"]`, parsim's
/// low-precision recipes quantise the transformer layers only), and float8 all-gathers under
/// FSDP (`enable_fsdp_float8_all_gather`, effective with dp_shard > 1).
fn low_precision(
    job: &Job,
    section: &str,
    d: &Degrees,
    layer: &mut Map<String, Value>,
) -> Result<(), TorchtitanError> {
    let path = |k: &str| format!("{section}.{k}");
    let filter = path("filter_fqns");
    if job.list(&filter) != ["output"] {
        return Err(job.unmodelled(
            &filter,
            "parsim's low-precision recipes keep exactly the output layer in bf16: filter_fqns must be [\"output\"]",
        ));
    }
    let recipe = path("recipe_name");
    let name = job.string(&recipe);
    if section.ends_with("mx") {
        let name = name.unwrap_or_default();
        if !name.starts_with("mxfp8") || name.contains("emulated") {
            return Err(job.unmodelled(
                &recipe,
                "parsim's MX precision is MXFP8 on hardware (mxfp8_cublas, mxfp8_cutlass)",
            ));
        }
        return Ok(());
    }
    let gather = path("enable_fsdp_float8_all_gather");
    match name.as_deref() {
        None | Some("tensorwise") => {}
        Some(_) => {
            return Err(job.unmodelled(
                &recipe,
                "rowwise float8 scaling is not modelled (parsim: per-tensor delayed or current, or 128 x 128 blockwise)",
            ))
        }
    }
    if name.is_some() && job.flag(&gather) {
        return Err(job.invalid(
            &gather,
            "cannot be combined with recipe_name (Float8LinearConverter)",
        ));
    }
    put(layer, "training", "fp8_recipe", json!("current"));
    if job.flag(&gather) && d.shard > 1 {
        put(layer, "training", "fp8_param_gather", json!(true));
    }
    Ok(())
}

/// Puts the activation checkpointing (torchtitan/distributed/activation_checkpoint.py,
/// `apply_ac`): "none"; "full" (every block wrapped); "selective" with a layer period N
/// (`_apply_layer_sac`: every Nth block wrapped, so N = 0 or 1 is every block, parsim's full
/// recompute); per-op selective ("op", `_apply_op_sac`) is parsim's `per_op` recompute module
/// (src/model/per_op.rs); a longer layer period and "memory_budget" are refused.
pub fn put_recompute(job: &Job, out: &mut Out) -> Result<(), TorchtitanError> {
    let layer = &mut out.layer;
    const MODE: &str = "activation_checkpoint.mode";
    const OPTION: &str = "activation_checkpoint.selective_ac_option";
    let recompute = match job.string(MODE).as_deref() {
        Some("none") => "none",
        Some("full") => "full",
        Some("selective") => {
            let option = job.string(OPTION).unwrap_or_default();
            match option.parse::<u32>() {
                Ok(0 | 1) => "full",
                Ok(n) => {
                    return Err(job.unmodelled(
                        OPTION,
                        format!("checkpointing every {n}th layer is not modelled (parsim recomputes every layer or none)"),
                    ))
                }
                Err(_) if option == "op" => {
                    put(layer, "training", "recompute_modules", json!(["per_op"]));
                    "selective"
                }
                Err(_) => {
                    return Err(job.invalid(
                        OPTION,
                        "must be 'op' or a layer period such as '2' (_apply_ac_to_transformer_block)",
                    ))
                }
            }
        }
        Some("memory_budget") => {
            return Err(job.unmodelled(
                MODE,
                "the compiler's memory-budget partitioner is not modelled",
            ))
        }
        _ => {
            return Err(job.invalid(
                MODE,
                "must be \"none\", \"selective\", \"full\" or \"memory_budget\"",
            ))
        }
    };
    put(layer, "training", "recompute", json!(recompute));
    Ok(())
}

/// Puts the optimizer (torchtitan/components/optimizer.py, `build_optimizers`: Adam or AdamW,
/// both parsim's Adam with its fp32 moments) and the run's tokens (`training.steps` steps of
/// `step_tokens`: the global batch's sequences times their length).
pub fn put_run(job: &Job, step_tokens: u64, out: &mut Out) -> Result<(), TorchtitanError> {
    let layer = &mut out.layer;
    match job.string("optimizer.name").as_deref() {
        Some("Adam" | "AdamW") => put(layer, "training", "optimizer", json!("adam")),
        _ => {
            return Err(job.unmodelled("optimizer.name", "parsim reads torchtitan's Adam and AdamW"))
        }
    }
    match job.int("training.steps") {
        Some(steps) if steps >= 1 => {
            let tokens = (steps as u64).checked_mul(step_tokens).ok_or_else(|| {
                job.invalid("training.steps", "steps x batch x sequence overflows")
            })?;
            put(layer, "run", "train_tokens", json!(tokens));
            Ok(())
        }
        _ => Err(job.invalid(
            "training.steps",
            format!("must be 1 or more, got {}", job.get("training.steps")),
        )),
    }
}
