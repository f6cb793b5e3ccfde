//! Megatron-LM's precision-aware optimizer flags (megatron/training/arguments.py):
//! `--use-precision-aware-optimizer` with `--main-grads-dtype` (fp32, bf16),
//! `--main-params-dtype` (fp32, fp16), `--exp-avg-dtype` and `--exp-avg-sq-dtype` (fp32, fp16,
//! bf16, fp8). What parsim does not model is refused by flag: an fp16 master copy, moments of
//! two dtypes, and the optimizer with fp32 moments (its master is then kept as 16-bit
//! remainders, which parsim models only beside narrower moments).

use serde_json::{json, Value};

const DTYPE_FLAGS: [&str; 4] = [
    "--main-grads-dtype",
    "--main-params-dtype",
    "--exp-avg-dtype",
    "--exp-avg-sq-dtype",
];

/// The training settings the flags give: (key, value) pairs for the `training` section.
/// `word` reads a kept word flag, `on` a kept switch.
pub(super) fn settings<'a>(
    word: impl Fn(&str) -> Option<&'a str>,
    on: impl Fn(&str) -> bool,
) -> Result<Vec<(&'static str, Value)>, String> {
    if !on("--use-precision-aware-optimizer") {
        // Megatron asserts fp32 for all four without it (megatron/core/optimizer/
        // optimizer_config.py, `__post_init__`).
        for flag in DTYPE_FLAGS {
            match word(flag) {
                None | Some("fp32") => {}
                Some(v) => {
                    return Err(format!(
                        "{flag} {v}: needs --use-precision-aware-optimizer (Megatron keeps fp32 without it)"
                    ))
                }
            }
        }
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    match word("--main-params-dtype").unwrap_or("fp32") {
        "fp32" => {}
        "fp16" => {
            return Err(
                "--main-params-dtype fp16: an fp16 master copy is not modelled (parsim keeps an fp32 one)"
                    .into(),
            )
        }
        other => return Err(format!("--main-params-dtype: unknown '{other}' (fp32, fp16)")),
    }
    match word("--main-grads-dtype").unwrap_or("fp32") {
        "fp32" => {}
        "bf16" => out.push(("grad_dtype", json!("bf16"))),
        other => {
            return Err(format!(
                "--main-grads-dtype: unknown '{other}' (fp32, bf16)"
            ))
        }
    }
    let avg = word("--exp-avg-dtype").unwrap_or("fp32");
    let avg_sq = word("--exp-avg-sq-dtype").unwrap_or("fp32");
    for (flag, v) in [("--exp-avg-dtype", avg), ("--exp-avg-sq-dtype", avg_sq)] {
        if !matches!(v, "fp32" | "fp16" | "bf16" | "fp8") {
            return Err(format!("{flag}: unknown '{v}' (fp32, fp16, bf16, fp8)"));
        }
    }
    if avg != avg_sq {
        return Err(format!(
            "--exp-avg-sq-dtype {avg_sq}: differs from --exp-avg-dtype {avg}; parsim keeps both moments in one dtype (training.optimizer_state_dtype)"
        ));
    }
    if avg == "fp32" {
        return Err(
            "--use-precision-aware-optimizer with fp32 moments: its master copy kept as 16-bit remainders is modelled only beside moments below fp32; give --exp-avg-dtype and --exp-avg-sq-dtype, or leave the flag out"
                .into(),
        );
    }
    out.push(("optimizer_state_dtype", json!(avg)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(
        words: &[(&str, &str)],
        precision_aware: bool,
    ) -> Result<Vec<(&'static str, Value)>, String> {
        let words: HashMap<&str, &str> = words.iter().copied().collect();
        settings(
            |f| words.get(f).copied(),
            |f| precision_aware && f == "--use-precision-aware-optimizer",
        )
    }

    #[test]
    fn moments_and_main_gradients_are_read_and_the_rest_refused_by_flag() {
        let got = read(
            &[
                ("--exp-avg-dtype", "bf16"),
                ("--exp-avg-sq-dtype", "bf16"),
                ("--main-grads-dtype", "bf16"),
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            got,
            [
                ("grad_dtype", json!("bf16")),
                ("optimizer_state_dtype", json!("bf16"))
            ]
        );
        assert!(read(&[], false).unwrap().is_empty());
        let refused = [
            (
                vec![("--exp-avg-dtype", "bf16")],
                false,
                "--exp-avg-dtype bf16",
            ),
            (
                vec![("--main-params-dtype", "fp16")],
                true,
                "--main-params-dtype fp16",
            ),
            (
                vec![("--exp-avg-dtype", "fp8"), ("--exp-avg-sq-dtype", "bf16")],
                true,
                "--exp-avg-sq-dtype bf16",
            ),
            (vec![], true, "fp32 moments"),
            (vec![("--exp-avg-dtype", "int8")], true, "unknown 'int8'"),
        ];
        for (words, on, needle) in refused {
            let e = read(&words, on).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
