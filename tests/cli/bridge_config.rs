//! `--bridge-config` through the binary: the docs' Megatron-Bridge recipe estimates end to end
//! with what it accepts named, flags override it, and a refusal exits 1 naming the field.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

const EXAMPLE: &str = "docs/examples/bridge_llama3_8b_h100_bf16.yaml";

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

/// The recipe's parallel layout, batch and precision reach the resolved configuration; 8 GPUs
/// at CP 2 leave 4 data-parallel ranks (the recipe's own layout, perf_recipes/llama/h100).
#[test]
fn estimate_reads_the_docs_recipe() {
    let out = parsim()
        .args([
            "estimate",
            "--bridge-config",
            EXAMPLE,
            "--gpus",
            "8",
            "--json",
        ])
        .assert()
        .success()
        .stderr(
            predicate::str::contains("optimizer.lr")
                .and(predicate::str::contains("env_vars are not modelled")),
        )
        .get_output()
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["config"];
    assert_eq!(c["training"]["framework"], "megatron-core");
    assert_eq!(c["training"]["precision"], "bf16");
    assert_eq!(c["training"]["grad_dtype"], "bf16");
    assert_eq!(c["training"]["recompute"], "none");
    assert_eq!(c["training"]["global_batch_size"], 128);
    assert_eq!(
        (c["parallel"]["cp"].clone(), c["parallel"]["zero"].clone()),
        (2.into(), 1.into())
    );
    assert_eq!(c["parallel"]["dp"], 4);
    assert_eq!(c["model"]["activation"], "swiglu");
    assert_eq!(c["model"]["num_query_groups"], 8);
}

/// A flag goes over the file (exit 3: without CP the recipe's 8192 tokens do not fit).
#[test]
fn flags_override_the_bridge_config() {
    let out = parsim()
        .args([
            "estimate",
            "--bridge-config",
            EXAMPLE,
            "--gpus",
            "8",
            "--cp",
            "1",
            "--json",
        ])
        .assert()
        .code(predicate::in_iter([0, 3]))
        .get_output()
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["parallel"]["cp"], 1);
    assert_eq!(v["config"]["parallel"]["dp"], 8);
}

/// The recipe's block recomputation of 5 of 32 layers is refused by its field, with the file.
#[test]
fn a_refusal_exits_1_naming_the_field() {
    parsim()
        .args([
            "estimate",
            "--bridge-config",
            "tests/fixtures/bridge/llama3_8b_pretrain_8gpu_h100_fp8cs.yaml",
            "--gpus",
            "8",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "llama3_8b_pretrain_8gpu_h100_fp8cs.yaml: model.recompute_num_layers: 5: block recomputation of 5 of the 32 layers",
        ));
}
