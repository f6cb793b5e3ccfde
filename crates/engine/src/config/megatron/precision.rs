//! Megatron-LM's low-precision flags (megatron/training/arguments.py): `--fp8-format`
//! (e4m3, hybrid) with `--fp8-recipe` (delayed, tensorwise, mxfp8, blockwise),
//! `--fp4-format` (e2m1) with `--fp4-recipe` (nvfp4), `--fp8-param-gather`, and
//! `--first-last-layers-bf16` with `--num-layers-at-start-in-bf16` /
//! `--num-layers-at-end-in-bf16` (1 each by default). Unknown values are errors naming the
//! flag; FP4 recipes parsim does not model (mxfp4) are refused by name.

use serde_json::{json, Value};

/// The training settings the flags give: (key, value) pairs for the `training` section.
/// `word` reads a kept word flag, `on` a kept switch, `int` a kept integer flag.
pub(super) fn settings<'a>(
    word: impl Fn(&str) -> Option<&'a str>,
    on: impl Fn(&str) -> bool,
    int: impl Fn(&str) -> Option<u64>,
) -> Result<Vec<(&'static str, Value)>, String> {
    let mut out = Vec::new();
    let fp8 = word("--fp8-format");
    let fp4 = word("--fp4-format");
    if let Some(f) = fp8 {
        if !matches!(f, "e4m3" | "hybrid") {
            return Err(format!("--fp8-format: unknown '{f}' (e4m3, hybrid)"));
        }
    }
    if let Some(f) = fp4 {
        if f != "e2m1" {
            return Err(format!("--fp4-format: unknown '{f}' (e2m1)"));
        }
    }
    let precision = match (fp8, fp4) {
        (Some(_), Some(_)) => {
            return Err(
                "--fp4-format: FP8 and FP4 training are exclusive (give one of --fp8-format, --fp4-format)"
                    .into(),
            )
        }
        (Some(_), None) => match word("--fp8-recipe").unwrap_or("delayed") {
            "delayed" => {
                if word("--fp8-recipe").is_some() {
                    out.push(("fp8_recipe", json!("delayed")));
                }
                "fp8"
            }
            "tensorwise" => {
                out.push(("fp8_recipe", json!("current")));
                "fp8"
            }
            "blockwise" => {
                out.push(("fp8_recipe", json!("blockwise")));
                "fp8"
            }
            "mxfp8" => "mxfp8",
            other => {
                return Err(format!(
                    "--fp8-recipe: unknown '{other}' (delayed, tensorwise, mxfp8, blockwise)"
                ))
            }
        },
        (None, Some(_)) => match word("--fp4-recipe").unwrap_or("nvfp4") {
            "nvfp4" => "nvfp4",
            "mxfp4" => return Err("--fp4-recipe: mxfp4 training is not modelled (nvfp4 is)".into()),
            other => return Err(format!("--fp4-recipe: unknown '{other}' (nvfp4)")),
        },
        (None, None) => {
            if on("--bf16") {
                "bf16"
            } else if on("--fp16") {
                "fp16"
            } else {
                "fp32"
            }
        }
    };
    out.push(("precision", json!(precision)));
    let low = matches!(precision, "fp8" | "mxfp8" | "nvfp4");
    if on("--fp8-param-gather") || (precision == "nvfp4" && on("--fp4-param-gather")) {
        out.push(("fp8_param_gather", json!(true)));
    }
    if low && on("--first-last-layers-bf16") {
        let start = int("--num-layers-at-start-in-bf16").unwrap_or(1);
        let end = int("--num-layers-at-end-in-bf16").unwrap_or(1);
        out.push(("bf16_layers_at_start", json!(start)));
        out.push(("bf16_layers_at_end", json!(end)));
    } else if precision == "nvfp4" {
        // Without the switch Megatron runs every layer in FP4 (parsim's nvfp4 default keeps
        // one at each end in bf16).
        out.push(("bf16_layers_at_start", json!(0)));
        out.push(("bf16_layers_at_end", json!(0)));
    }
    Ok(out)
}
