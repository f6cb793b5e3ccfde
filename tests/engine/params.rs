//! Parameter totals against the published counts.

use super::common::{est, single};

fn total(preset: &str) -> u64 {
    est(single(preset)).params.total
}

#[test]
fn llama_totals_equal_published_counts() {
    // Hugging Face model cards / safetensors metadata of the released checkpoints.
    assert_eq!(total("llama2-7b"), 6_738_415_616);
    assert_eq!(total("llama2-70b"), 68_976_648_192);
    assert_eq!(total("llama3-8b"), 8_030_261_248);
    assert_eq!(total("llama3-70b"), 70_553_706_496);
    assert_eq!(total("llama3-405b"), 405_853_388_800);
}

#[test]
fn mixtral_total_equals_published_count() {
    // Mixtral-8x7B checkpoint: 46,702,792,704 parameters.
    assert_eq!(total("mixtral-8x7b"), 46_702_792_704);
}

#[test]
fn gpt3_175b_total() {
    // Learned positions (2048 x 12288), biases, tied embeddings, vocab 50257: by hand,
    // 96 x (12h^2 + 13h) + 50257h + 2048h + 2h = 174,604,259,328 (Brown et al. 2020 call it 175B).
    let h: u64 = 12288;
    let by_hand = 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h;
    assert_eq!(by_hand, 174_604_259_328);
    assert_eq!(total("gpt3-175b"), by_hand);
}

#[test]
fn deepseek_v3_total_and_activated() {
    // DeepSeek-V3 Technical Report, abstract: 671B total parameters, 37B activated per token
    // (the issue asks 671.0B within 0.1% and 37.5B within 1%; MTP is off).
    let e = est(serde_json::json!({
        "model": {"preset": "deepseek-v3"},
        "cluster": {"num_gpus": 1},
        "parallel": {"tp": 1, "sp": false},
        "training": {"global_batch_size": 1, "seq_length": 4096}
    }));
    let total = e.params.total as f64;
    assert!((total / 671.0e9 - 1.0).abs() < 1e-3, "total {total}");
    let act = e.params.activated_per_token as f64;
    assert!((act / 37.5e9 - 1.0).abs() < 1e-2, "activated {act}");
}

#[test]
fn deepseek_v3_mtp_module_adds_one_moe_layer_and_its_projection() {
    // One MTP module = two norms (2h) + the 2h -> h projection (2h^2) + one MoE layer + the
    // shared head's norm (h); embedding and output head are shared (DeepSeek-V3 report, 2.2).
    let base = est(serde_json::json!({
        "model": {"preset": "deepseek-v3"},
        "cluster": {"num_gpus": 1},
        "parallel": {"tp": 1, "sp": false},
        "training": {"global_batch_size": 1, "seq_length": 4096}
    }));
    let with = est(serde_json::json!({
        "model": {"preset": "deepseek-v3", "mtp_num_layers": 1},
        "cluster": {"num_gpus": 1},
        "parallel": {"tp": 1, "sp": false},
        "training": {"global_batch_size": 1, "seq_length": 4096}
    }));
    let h = 7168u64;
    let moe_layer = base.params.per_layer_moe.unwrap();
    assert_eq!(
        with.params.total - base.params.total,
        3 * h + 2 * h * h + moe_layer
    );
}

#[test]
fn vocab_padding_follows_megatron() {
    // Megatron pads the vocabulary to a multiple of N x TP: 50257 with N = 128, TP = 8 is
    // ceil(50257 / 1024) x 1024 = 51200 rows (GPT-2 vocabulary, Megatron's default N = 128).
    let mut v = single("gpt3-175b");
    v["model"]["make_vocab_size_divisible_by"] = 128.into();
    v["parallel"]["tp"] = 8.into();
    v["cluster"]["num_gpus"] = 8.into();
    let e = est(v);
    assert_eq!(e.params.embedding, 51200 * 12288 + 2048 * 12288);
}
