//! Issue 31's models: Qwen3 (dense and MoE), GPT-OSS, Kimi K2, Llama 4, imported from their
//! config.json (tests/fixtures/hf/, sources in tests/fixtures/hf/SOURCES.md) and as presets,
//! against the model cards' parameter counts; and what their sliding-window and chunked
//! attention change in the ledger (FLOPs against a brute-force count of the attended pairs,
//! the context-parallel exchange against the window's neighbours by hand).

use super::common::{est, resolve};
use parsim::config::{AttentionSpan, Config, ConfigError, Layer, Resolved};
use parsim::layout::GroupKind;
use parsim::model::{chunks_per_rank, Ledger, Op};
use serde_json::{json, Value};

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/hf/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// One GPU, no parallelism, the model given by `model`.
fn one_gpu(model: Value) -> Value {
    json!({"model": model, "cluster": {"num_gpus": 1},
           "parallel": {"tp": 1, "sp": false},
           "training": {"seq_length": 4096, "global_batch_size": 1}})
}

fn hf(name: &str) -> parsim::estimate::Estimate {
    est(one_gpu(json!({"hf_config": fixture(name)})))
}

fn preset(name: &str) -> parsim::estimate::Estimate {
    est(one_gpu(json!({"preset": name})))
}

/// `x` in billions rounded to `places` decimals, as a model card prints it.
fn billions(x: u64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x as f64 / 1e9 * k).round() / k
}

#[test]
fn qwen3_totals_equal_the_model_cards() {
    // Hugging Face model cards (Qwen/Qwen3-8B, Qwen3-30B-A3B, Qwen3-235B-A22B, "Model
    // Overview"): 8.2B (6.95B non-embedding); 30.5B total, 3.3B activated (29.9B
    // non-embedding); 235B total, 22B activated (234B non-embedding). Embeddings untied:
    // 2 x 151,936 x hidden.
    let q8 = hf("qwen3-8b");
    assert_eq!(billions(q8.params.total, 1), 8.2);
    assert_eq!(billions(q8.params.total - 2 * 151_936 * 4096, 2), 6.95);
    let q30 = hf("qwen3-30b-a3b");
    assert_eq!(billions(q30.params.total, 1), 30.5);
    assert_eq!(billions(q30.params.total - 2 * 151_936 * 2048, 1), 29.9);
    // 3.35B activated: the card truncates to 3.3B.
    let active = q30.params.activated_per_token;
    assert!((3_300_000_000..3_400_000_000).contains(&active), "{active}");
    let q235 = hf("qwen3-235b-a22b");
    assert_eq!(billions(q235.params.total, 0), 235.0);
    assert_eq!(billions(q235.params.total - 2 * 151_936 * 4096, 0), 234.0);
    assert_eq!(billions(q235.params.activated_per_token, 0), 22.0);
}

#[test]
fn qwen3_30b_a3b_total_by_hand() {
    // Per layer: attention 2048 x 32 x 128 (q) + 2 x 2048 x 4 x 128 (k, v) + 32 x 128 x 2048
    // (o); QK norm 2 x 128; two norms 2 x 2048; 128 experts of 3 x 2048 x 768 and the router
    // 2048 x 128. Plus the final norm and two 151,936 x 2048 embeddings.
    let layer = 2048 * 4096
        + 2 * 2048 * 512
        + 4096 * 2048
        + 2 * 128
        + 2 * 2048
        + 128 * 3 * 2048 * 768
        + 2048 * 128;
    let by_hand: u64 = 48 * layer + 2048 + 2 * 151_936 * 2048;
    assert_eq!(by_hand, 30_532_122_624);
    assert_eq!(hf("qwen3-30b-a3b").params.total, by_hand);
}

#[test]
fn presets_equal_their_imported_config_json() {
    for (name, file) in [
        ("qwen3-8b", "qwen3-8b"),
        ("qwen3-30b-a3b", "qwen3-30b-a3b"),
        ("qwen3-235b-a22b", "qwen3-235b-a22b"),
        ("gpt-oss-20b", "gpt-oss-20b"),
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("kimi-k2", "kimi-k2"),
        ("llama4-scout", "llama4-scout"),
        ("llama4-maverick", "llama4-maverick"),
    ] {
        let (p, h) = (preset(name), hf(file));
        assert_eq!(p.params.total, h.params.total, "{name}");
        assert_eq!(
            p.params.activated_per_token, h.params.activated_per_token,
            "{name}"
        );
        assert_eq!(p.flops.per_step_model, h.flops.per_step_model, "{name}");
    }
}

#[test]
fn gpt_oss_totals_equal_the_model_card() {
    // OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), Table 1: gpt-oss-120b has
    // 116.83B parameters (MLP 114.71B, attention 0.96B, embedding + unembedding 1.16B) and
    // 5.13B active; gpt-oss-20b 20.91B (19.12B, 0.64B, 1.16B) and 3.61B active. The card's
    // active count leaves out the input embedding (a lookup): 201,088 x 2880.
    let embedding = 201_088 * 2880;
    for (name, total, active) in [("gpt-oss-120b", 116.83, 5.13), ("gpt-oss-20b", 20.91, 3.61)] {
        let e = hf(name);
        assert_eq!(billions(e.params.total, 2), total, "{name}");
        assert_eq!(
            billions(e.params.activated_per_token - embedding, 2),
            active,
            "{name}"
        );
        assert_eq!(billions(2 * embedding, 2), 1.16);
    }
    // By hand (gpt-oss-120b): attention with biases and 64 sinks, 2 norms; 128 experts of
    // 2880 x 5760 + 5760 and 2880 x 2880 + 2880, the router 2880 x 128 + 128.
    let attention = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64;
    let mlp = 128 * (2880 * 5760 + 5760 + 2880 * 2880 + 2880) + 2880 * 128 + 128;
    let by_hand: u64 = 36 * (attention + 2 * 2880 + mlp) + 2880 + 2 * embedding;
    assert_eq!(hf("gpt-oss-120b").params.total, by_hand);
    assert_eq!(billions(36 * mlp, 2), 114.71);
    assert_eq!(billions(36 * attention, 2), 0.96);
}

#[test]
fn kimi_k2_matches_its_card() {
    // Moonshot AI, Kimi-K2-Instruct model card, "Model Summary": 1T total parameters, 32B
    // activated; 61 layers, 384 experts, 8 selected per token, one shared, 64 heads,
    // vocabulary 160K. Here 1,026.4B and 32.86B: the card rounds to 1T and truncates to 32B.
    let e = hf("kimi-k2");
    assert_eq!(
        billions(e.params.total / 1000, 1),
        1.0,
        "{}",
        e.params.total
    );
    let active = e.params.activated_per_token;
    assert!(
        (32_000_000_000..33_000_000_000).contains(&active),
        "{active}"
    );
}

#[test]
fn llama4_totals_by_hand() {
    // The language model of Llama 4 Scout and Maverick (the cards' 109B and 400B add the
    // vision encoder): per layer attention 5120 x (40 + 2 x 8 + 40) x 128 and two norms;
    // a MoE layer has E experts and one shared of 3 x 5120 x 8192 and a router 5120 x E; a
    // dense layer an MLP of 3 x 5120 x 16384. Two 202,048 x 5120 embeddings, a final norm.
    let attention: u64 = 5120 * 96 * 128 + 2 * 5120;
    let expert: u64 = 3 * 5120 * 8192;
    let moe = |e: u64| (e + 1) * expert + 5120 * e;
    let dense: u64 = 3 * 5120 * 16384;
    let ends: u64 = 2 * 202_048 * 5120 + 5120;
    let scout = 48 * (attention + moe(16)) + ends;
    let maverick = 24 * (attention + moe(128)) + 24 * (attention + dense) + ends;
    assert_eq!(hf("llama4-scout").params.total, scout);
    assert_eq!(hf("llama4-maverick").params.total, maverick);
    // Both cards: 17B active parameters.
    assert_eq!(
        billions(hf("llama4-scout").params.activated_per_token, 0),
        17.0
    );
    assert_eq!(
        billions(hf("llama4-maverick").params.activated_per_token, 0),
        17.0
    );
    // The cards' totals with the vision encoder: the language model is within 2% below them.
    assert!(
        scout < 109_000_000_000 && scout as f64 > 0.98 * 109e9,
        "{scout}"
    );
    assert!((maverick as f64 / 400e9 - 1.0).abs() < 0.01, "{maverick}");
}

/// The resolved configuration of a GPT-OSS-20b run with `over` merged into its parallel and
/// training sections.
fn gpt_oss_20b(over: Value) -> Resolved {
    let mut v = json!({"model": {"hf_config": fixture("gpt-oss-20b")},
        "cluster": {"num_gpus": 1, "gpus_per_node": 8},
        "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 4096, "global_batch_size": 8}});
    parsim::config::load::merge(&mut v, over);
    resolve(v)
}

fn core(ops: &[Op]) -> &Op {
    ops.iter().find(|o| o.name == "attn.core").expect("core")
}

/// Query-key pairs under a causal mask where query i (1-based) sees `keys(i)` keys.
fn pairs(s: u64, keys: impl Fn(u64) -> u64) -> f64 {
    (1..=s).map(keys).sum::<u64>() as f64
}

#[test]
fn a_sliding_window_cuts_the_attention_flops_to_its_pairs() {
    // GPT-OSS-20b alternates a 128-token window (layer 1, 3, ...: 12) with full attention
    // (12): one full MoE block and one windowed variant, 12 layers each.
    let r = gpt_oss_20b(json!({}));
    let l = Ledger::build(&r);
    assert_eq!(l.variants.len(), 1);
    let chunks = chunks_per_rank(&r);
    assert_eq!(chunks[0][0].moe_layers, 12);
    assert_eq!(chunks[0][0].variant_layers[0], 12);
    assert_eq!(chunks[0][0].dense_layers, 0);
    let full = core(&l.moe.as_ref().expect("moe").ops).model_flops.fwd;
    let windowed = core(&l.variants[0].ops).model_flops.fwd;
    // Brute force: query i sees min(i, 128) keys, against i under full causal attention.
    let s = 4096;
    let expected = pairs(s, |i| i.min(128)) / pairs(s, |i| i);
    assert!(
        (windowed / full / expected - 1.0).abs() < 1e-3,
        "{} vs {expected}",
        windowed / full
    );
    // The flash kernel computes the same share of the pairs.
    let (fw, ff) = (
        core(&l.variants[0].ops).rank_flops.fwd,
        core(&l.moe.as_ref().expect("moe").ops).rank_flops.fwd,
    );
    assert!((fw / ff / expected - 1.0).abs() < 1e-3);
}

#[test]
fn chunked_attention_cuts_the_flops_to_its_chunks() {
    // Llama 4 Scout at 32768 tokens: chunks of 8192 on three layers in four (36), full
    // attention on every fourth (12). Brute force: query i sees the keys of its chunk up to
    // itself, ((i - 1) mod 8192) + 1.
    let r = resolve(json!({"model": {"preset": "llama4-scout"},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 32768, "global_batch_size": 1}}));
    let l = Ledger::build(&r);
    assert_eq!(chunks_per_rank(&r)[0][0].variant_layers[0], 36);
    assert_eq!(chunks_per_rank(&r)[0][0].moe_layers, 12);
    let s = 32768;
    let expected = pairs(s, |i| (i - 1) % 8192 + 1) / pairs(s, |i| i);
    let full = core(&l.moe.as_ref().expect("moe").ops).model_flops.fwd;
    let chunked = core(&l.variants[0].ops).model_flops.fwd;
    assert!((chunked / full / expected - 1.0).abs() < 1e-3);
    // At 8192 tokens a chunk is the whole sequence: the same pairs as full attention.
    let r = resolve(json!({"model": {"preset": "llama4-scout"},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 8192, "global_batch_size": 1}}));
    let l = Ledger::build(&r);
    let full = core(&l.moe.as_ref().expect("moe").ops).model_flops.fwd;
    assert_eq!(core(&l.variants[0].ops).model_flops.fwd, full);
}

#[test]
fn under_cp_a_window_exchanges_only_its_neighbours_keys() {
    // GPT-OSS-20b, 16384 tokens over cp 4 (p2p ring, 4096 tokens a rank). A full layer's ring
    // passes every shard's K/V three hops forward and K/V plus dK/dV back: 3 x 3 x 4096
    // tokens. A 128-token window needs the 127 keys before the rank's shard, from one
    // neighbour: 3 x 127 tokens. K/V per token: 8 heads x (64 + 64) x 2 bytes.
    let r = gpt_oss_20b(json!({"cluster": {"num_gpus": 4},
        "parallel": {"cp": 4, "cp_comm": "p2p"},
        "training": {"seq_length": 16384}}));
    let l = Ledger::build(&r);
    let kv_per_token = 8 * 128 * 2;
    let cp_bytes = |ops: &[Op]| -> f64 {
        core(ops)
            .comms
            .iter()
            .filter(|c| c.group == GroupKind::Cp)
            .map(|c| c.wire_bytes())
            .sum()
    };
    let full = cp_bytes(&l.moe.as_ref().expect("moe").ops);
    assert_eq!(full, (3 * 3 * 4096 * kv_per_token) as f64);
    let windowed = cp_bytes(&l.variants[0].ops);
    assert_eq!(windowed, (3 * 127 * kv_per_token) as f64);
    // Zigzag: two pieces of 2048 tokens, each needing the 127 keys before it.
    let r = gpt_oss_20b(json!({"cluster": {"num_gpus": 4},
        "parallel": {"cp": 4, "cp_comm": "zigzag"},
        "training": {"seq_length": 16384}}));
    let l = Ledger::build(&r);
    assert_eq!(
        cp_bytes(&l.variants[0].ops),
        (3 * 2 * 127 * kv_per_token) as f64
    );
    // Ulysses moves heads, not the window's neighbours: the same all-to-all as full layers.
    let r = gpt_oss_20b(json!({"cluster": {"num_gpus": 4},
        "parallel": {"cp": 4, "cp_comm": "a2a"},
        "training": {"seq_length": 16384}}));
    let l = Ledger::build(&r);
    assert_eq!(
        cp_bytes(&l.variants[0].ops),
        cp_bytes(&l.moe.as_ref().expect("moe").ops)
    );
}

#[test]
fn windows_and_chunks_lower_the_step_flops_of_a_whole_estimate() {
    // The estimate sums the windowed layers: GPT-OSS-20b's model FLOPs lie between those of
    // the same model with every layer windowed and every layer full.
    let flops = |window: Value, freq: u32| {
        est(json!({"model": {"hf_config": fixture("gpt-oss-20b"),
                "window_size": window, "window_attn_skip_freq": freq},
            "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
            "training": {"seq_length": 8192, "global_batch_size": 1}}))
        .flops
        .per_step_model
    };
    let (all_full, mixed, all_windowed) = (
        flops(Value::Null, 0),
        flops(json!(128), 2),
        flops(json!(128), 0),
    );
    assert!(all_windowed < mixed && mixed < all_full);
    // Half the layers windowed: the mean of the two.
    assert!(((all_full + all_windowed) / 2.0 / mixed - 1.0).abs() < 1e-9);
}

fn violations(overlay: Value) -> Vec<parsim::config::Violation> {
    let cfg = Config::from_layers(&[Layer::overrides(overlay)]).expect("loads");
    match Resolved::new(cfg) {
        Err(ConfigError::Invalid(v)) => v,
        other => panic!("expected violations, got {other:?}"),
    }
}

#[test]
fn a_window_larger_than_the_sequence_is_refused_by_name() {
    let v = violations(json!({"model": {"preset": "gpt-oss-20b"},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 64, "global_batch_size": 1}}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].field, "model.window_size");
    assert!(
        v[0].rule.contains("128") && v[0].rule.contains("64"),
        "{}",
        v[0].rule
    );
    let v = violations(
        json!({"model": {"preset": "llama4-scout", "attention_chunk_size": 0},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 4096, "global_batch_size": 1}}),
    );
    assert_eq!(v[0].field, "model.attention_chunk_size");
    let v = violations(
        json!({"model": {"preset": "gpt-oss-20b", "attention_chunk_size": 512},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 4096, "global_batch_size": 1}}),
    );
    assert_eq!(v[0].field, "model.attention_chunk_size");
    assert!(v[0].rule.contains("not both"), "{}", v[0].rule);
}

#[test]
fn layer_patterns_of_another_length_are_refused_by_name() {
    let v = violations(
        json!({"model": {"preset": "qwen3-30b-a3b", "moe_layer_pattern": [0, 1, 1]},
        "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
        "training": {"seq_length": 4096, "global_batch_size": 1}}),
    );
    assert_eq!(v[0].field, "model.moe_layer_pattern");
    assert!(
        v[0].rule.contains("3 layers") && v[0].rule.contains("48"),
        "{}",
        v[0].rule
    );
}

fn import_error(v: Value) -> String {
    parsim::config::hf::import(&v, "config.json")
        .unwrap_err()
        .to_string()
}

#[test]
fn import_errors_name_the_field() {
    let mut g: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gpt-oss-20b")).unwrap()).unwrap();
    // Full attention on layers 0 and 1, windows after: not every N-th layer.
    let mut types = vec![json!("sliding_attention"); 24];
    types[0] = json!("full_attention");
    g["layer_types"] = json!(types);
    let msg = import_error(g.clone());
    assert!(msg.contains("layer_types"), "{msg}");
    g["layer_types"] = json!(["sliding_attention"]);
    let msg = import_error(g);
    assert!(msg.contains("layer_types") && msg.contains("24"), "{msg}");
    let mut q: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen3-8b")).unwrap()).unwrap();
    q["use_sliding_window"] = json!(true);
    assert!(import_error(q).contains("use_sliding_window"));
    let msg = import_error(json!({"architectures": ["Qwen3NextForCausalLM"]}));
    assert!(
        msg.contains("Qwen3NextForCausalLM") && msg.contains("GptOssForCausalLM"),
        "{msg}"
    );
}

#[test]
fn gpt_oss_layer_types_become_megatrons_skip_frequency() {
    // layer_types alternate from a sliding layer: Megatron's --window-attn-skip-freq 2
    // (1-based layer l attends in full when l % 2 == 0).
    let m = parsim::config::hf::import_file(std::path::Path::new(&fixture("gpt-oss-120b")))
        .expect("imports");
    assert_eq!(m.window_size, Some(128));
    assert_eq!(m.window_attn_skip_freq, 2);
    assert_eq!(m.attention_span(0), AttentionSpan::Window(128));
    assert_eq!(m.attention_span(1), AttentionSpan::Full);
    assert!(m.attention_sinks && m.moe_router_linear_bias && m.add_bias_linear);
    assert_eq!((m.num_experts, m.moe_router_topk), (128, 4));
    // Llama 4 Maverick: MoE on odd layers, full attention on every fourth.
    let m = parsim::config::hf::import_file(std::path::Path::new(&fixture("llama4-maverick")))
        .expect("imports");
    assert_eq!(m.num_moe_layers(), 24);
    assert!(!m.is_moe_layer(0) && m.is_moe_layer(1));
    assert_eq!(m.attention_span(3), AttentionSpan::Full);
    assert_eq!(m.attention_span(4), AttentionSpan::Chunk(8192));
}

#[test]
fn the_executor_lowering_refuses_the_new_layer_kinds_by_name() {
    // The kinds the executor runs now lower (tests/executor/modern_layers.rs runs them);
    // what it still cannot run is refused naming the field: sinks outside flash attention.
    let lowered = |name: &str, flash: bool| {
        let r = resolve(json!({"model": {"preset": name},
            "cluster": {"num_gpus": 1, "gpu": "cpu"}, "parallel": {"tp": 1, "sp": false},
            "training": {"seq_length": 4096, "global_batch_size": 1, "flash_attention": flash}}));
        parsim::lower::lower(&r, &parsim::lower::LowerOptions::default())
    };
    let oss = lowered("gpt-oss-20b", true).expect("gpt-oss lowers");
    let a = &oss.model.attention;
    assert_eq!((a.window, a.full_every, a.sinks), (Some(128), 2, true));
    assert!(oss.model.moe.as_ref().is_some_and(|m| m.router_linear_bias));
    let qwen = lowered("qwen3-8b", true).expect("qwen3 lowers");
    assert!(qwen.model.attention.qk_norm);
    let err = lowered("gpt-oss-20b", false).expect_err("refused");
    assert!(
        err.to_string().starts_with("training.flash_attention"),
        "{err}"
    );
}

#[test]
fn new_presets_estimate_with_expert_parallelism() {
    // 64 GPUs, ep 8: every new MoE preset estimates (a step time, a parameter count).
    for (name, ep) in [("qwen3-30b-a3b", 8), ("gpt-oss-120b", 8), ("kimi-k2", 8)] {
        let e = est(json!({"model": {"preset": name},
            "cluster": {"num_gpus": 64, "gpus_per_node": 8},
            "parallel": {"tp": 1, "pp": 1, "ep": ep, "sp": false},
            "training": {"seq_length": 4096, "global_batch_size": 512}}));
        assert!(e.time.step_s > 0.0 && e.params.total > 0, "{name}");
    }
}
