//! Hugging Face config.json import: the imported model has the published parameter count.
//! Fixtures in tests/fixtures/hf/ are copies of the released config.json files (fields that
//! parsim reads, plus a few it ignores).

use super::common::est;
use serde_json::json;

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/hf/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn total(name: &str) -> u64 {
    est(json!({"model": {"hf_config": fixture(name)}, "cluster": {"num_gpus": 1},
               "parallel": {"tp": 1, "sp": false}, "training": {"seq_length": 1024, "global_batch_size": 1}}))
    .params
    .total
}

#[test]
fn published_counts() {
    // Model cards: Llama-3-8B 8,030,261,248; Mistral-7B-v0.1 7,241,732,096; Mixtral-8x7B
    // 46,702,792,704; Qwen2-7B 7,615,616,512 (QKV biases); GPT-2 124,439,808 (tied, learned
    // positions, biases).
    assert_eq!(total("llama3-8b"), 8_030_261_248);
    assert_eq!(total("mistral-7b"), 7_241_732_096);
    assert_eq!(total("mixtral-8x7b"), 46_702_792_704);
    assert_eq!(total("qwen2-7b"), 7_615_616_512);
    assert_eq!(total("gpt2"), 124_439_808);
}

#[test]
fn deepseek_v3_import_matches_the_preset() {
    let preset = est(
        json!({"model": {"preset": "deepseek-v3"}, "cluster": {"num_gpus": 1},
                            "parallel": {"tp": 1, "sp": false}, "training": {"seq_length": 1024, "global_batch_size": 1}}),
    );
    assert_eq!(total("deepseek-v3"), preset.params.total);
}

#[test]
fn unsupported_architecture_is_a_clear_error() {
    let err =
        parsim::config::hf::import_file(std::path::Path::new(&fixture("unsupported"))).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("FalconForCausalLM") && msg.contains("LlamaForCausalLM"),
        "{msg}"
    );
}
