//! Megatron-LM's modelopt conf files (tests/fixtures/megatron/modelopt/, sources in its
//! SOURCES.md) through the Megatron import: each gives its model card's total (the same model
//! as parsim's preset of it, whose total tests/engine/model_cards.rs checks against the
//! card) or is refused with the reason, naming the flag; none is estimated as another model.

use parsim::config::megatron::{import, to_megatron_args};
use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::estimate;
use serde_json::json;

fn conf(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/megatron/modelopt/{name}.sh",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).expect("fixture")
}

/// The parameter total of a conf file on one GPU (tp 1, no SP).
fn conf_total(name: &str) -> u64 {
    let imp = import(&conf(name), name).expect("imports");
    let run = json!({"cluster": {"num_gpus": 1, "gpus_per_node": 1},
        "parallel": {"tp": 1, "pp": 1, "ep": 1, "expert_tp": 1, "sp": false},
        "training": {"global_batch_size": 1, "micro_batch_size": 1}});
    let cfg =
        Config::from_layers(&[Layer::overrides(imp.layer), Layer::overrides(run)]).expect("merges");
    let r = Resolved::new(cfg).expect("validates");
    estimate(&r).expect("estimates").params.total
}

fn preset_total(name: &str) -> u64 {
    let r = Resolved::new(
        Config::from_layers(&[Layer::overrides(json!({
            "model": {"preset": name},
            "cluster": {"num_gpus": 1},
            "parallel": {"tp": 1, "sp": false},
            "training": {"global_batch_size": 1, "seq_length": 4096}
        }))])
        .expect("merges"),
    )
    .expect("validates");
    estimate(&r).expect("estimates").params.total
}

#[test]
fn conf_files_give_their_models_totals() {
    for (file, preset) in [
        // Qwen3: the vocabulary from the tokenizer the file names (TOKENIZER_MODEL).
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("Qwen3-235B-A22B", "qwen3-235b-a22b"),
        // DeepSeek-V3's architecture: MLA (its latent norms are --qk-layernorm), the first
        // layer(s) dense by --moe-layer-freq.
        ("Kimi-K2-Instruct", "kimi-k2"),
        ("DeepSeek-R1", "deepseek-v3"),
        // Llama 4: an L2 QK norm without weights; Maverick's MoE on odd layers.
        ("Llama-4-Scout-17B-16E-Instruct", "llama4-scout"),
        ("Llama-4-Maverick-17B-128E-Instruct", "llama4-maverick"),
        // GPT-OSS: biases everywhere (no --disable-bias-linear, the router's too), GeGLU,
        // learnable softmax sinks, a 128-token window on odd layers, YaRN positions.
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("gpt-oss-20b", "gpt-oss-20b"),
        // Nemotron-H and Nemotron 3 Nano: the hybrid pattern, Mamba-2 widths (state 256 for
        // the 47B, Megatron's 128 for the Nano) and squared-ReLU MLPs or MoE.
        ("Nemotron-H-47B-Reasoning-128K", "nemotron-h-47b"),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nemotron-3-nano"),
        // Nemotron 3 Super: the same layer kinds with a latent MoE (--moe-latent-size 1024).
        ("NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "nemotron-3-super"),
    ] {
        assert_eq!(conf_total(file), preset_total(preset), "{file}");
    }
    // And not the default model's (Llama-3-8B, 8,030,261,248), which the import gave before.
    assert_ne!(conf_total("Qwen3-30B-A3B"), 8_030_261_248);
}

#[test]
fn gpt_oss_conf_reads_its_attention_flags() {
    let imp = import(&conf("gpt-oss-120b"), "gpt-oss-120b").expect("imports");
    let m = &imp.layer["model"];
    // --window-size 127,0: 127 keys before the query and itself.
    assert_eq!(m["window_size"], json!(128));
    assert_eq!(m["window_attn_skip_freq"], json!(2));
    assert_eq!(m["attention_sinks"], json!(true));
    assert_eq!(m["moe_router_linear_bias"], json!(true));
    assert_eq!(m["activation"], json!("swiglu"));
    assert_eq!(m["position_embedding"], json!("rope"));
    for flag in [
        "--window-size",
        "--window-attn-skip-freq",
        "--softmax-type",
        "--quick-geglu",
    ] {
        assert!(!imp.ignored.iter().any(|f| f == flag), "{flag} read");
    }
}

#[test]
fn hybrid_conf_files_give_their_cards_totals() {
    // Nemotron-H-47B (NVIDIA, "Nemotron-H: A Family of Accurate and Efficient Hybrid
    // Mamba-Transformer Models", 2025, and its model card: 47B): 98 layers, 45 Mamba-2, 5
    // attention, 48 MLP. By hand, a Mamba-2 layer: its norm 8192; in_proj 8192 x (2 x 16384 +
    // 2 x 8 x 256 + 256); the convolution over 16384 + 2 x 8 x 256 channels, 4 weights and a
    // bias each; A, D and dt's bias 3 x 256; the gated norm 16384; out_proj 16384 x 8192.
    let (h, inner, conv): (u64, u64, u64) = (8192, 16384, 16384 + 2 * 8 * 256);
    let mamba = h + h * (2 * inner + 2 * 8 * 256 + 256) + conv * 5 + 3 * 256 + inner + inner * h;
    let attention = h + h * 64 * 128 + 2 * h * 8 * 128 + 64 * 128 * h;
    let mlp = h + 2 * h * 30720;
    let by_hand = 45 * mamba + 5 * attention + 48 * mlp + 2 * 131_072 * h + h;
    let total = conf_total("Nemotron-H-47B-Reasoning-128K");
    assert_eq!(total, by_hand);
    assert_eq!((total as f64 / 1e9).round(), 47.0, "{total}");
    // Nemotron 3 Nano 30B-A3B (model card: 31.6B total): Mamba-2, attention and MoE layers
    // (128 experts of squared-ReLU MLPs, top-6, and a shared expert).
    // By hand as tests/engine/hybrid.rs does for the preset: 23 Mamba-2 layers, 6 attention,
    // 23 MoE (router and its 128 biases, 128 experts of two 2688 x 1856, the shared expert's two 2688 x 3712).
    let total = conf_total("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
    let (h, inner, conv): (u64, u64, u64) = (2688, 4096, 4096 + 2 * 8 * 128);
    let mamba = h + h * (2 * inner + 2 * 8 * 128 + 64) + conv * 5 + 3 * 64 + inner + inner * h;
    let attention = h + 2 * h * 32 * 128 + 2 * h * 2 * 128;
    let moe = h + h * 128 + 128 + 128 * 2 * h * 1856 + 2 * h * 3712;
    assert_eq!(
        total,
        23 * mamba + 6 * attention + 23 * moe + 2 * 131_072 * h + h
    );
    assert_eq!((total as f64 / 1e8).round() / 10.0, 31.6, "{total}");
}

#[test]
fn conf_files_parsim_cannot_model_are_refused_naming_the_flag() {
    // A gated shared expert (--moe-use-shared-expert-gate) changes the MoE layer: refused,
    // not estimated as another model.
    let file = "NVIDIA-Nemotron-3-Super-120B-A12B-BF16";
    let text = conf(file).replace(
        "--moe-latent-size 1024",
        "--moe-latent-size 1024 --moe-use-shared-expert-gate",
    );
    let err = import(&text, file).unwrap_err().to_string();
    assert!(err.contains("--moe-use-shared-expert-gate"), "{err}");
    assert!(err.contains("not modelled"), "{err}");
}

#[test]
fn model_and_layout_flags_that_are_not_understood_are_errors() {
    let base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512";
    for (extra, needle) in [
        ("--window-size 127,16", "--window-size"),
        (
            "--window-size 127,0 --window-attn-skip-freq [1,0,0,1]",
            "--window-attn-skip-freq",
        ),
        ("--window-attn-skip-freq 2", "--window-attn-skip-freq"),
        ("--softmax-type bogus", "--softmax-type"),
        (
            "--num-experts 4 --moe-layer-freq \"([0,1]*3)\"",
            "--moe-layer-freq",
        ),
        (
            "--num-experts 4 --moe-layer-freq [0,2]*2",
            "--moe-layer-freq",
        ),
        (
            "--num-experts 4 --moe-token-dispatcher-type bogus",
            "--moe-token-dispatcher-type",
        ),
        (
            "--use-megatron-fsdp --data-parallel-sharding-strategy bogus",
            "--data-parallel-sharding-strategy",
        ),
        (
            "--num-distributed-optimizer-instances 2",
            "--num-distributed-optimizer-instances",
        ),
        ("--hybrid-layer-pattern M*M*M", "--hybrid-layer-pattern"),
        ("--hybrid-layer-pattern M*X-", "--hybrid-layer-pattern"),
        ("--hybrid-attention-ratio 0.1", "--hybrid-attention-ratio"),
        // CPU optimizer offload is read (tests/engine/optimizer_offload.rs); overlapping its
        // copies with the CPU step is not modelled.
        (
            "--use-distributed-optimizer --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d",
            "--overlap-cpu-optimizer-d2h-h2d",
        ),
        // FP4 is read now (issue 30: e2m1 with the nvfp4 recipe); an unknown format is not.
        ("--fp4-format e3m0", "--fp4-format"),
    ] {
        let text = format!("{base} {extra}");
        let err = import(&text, "args").unwrap_err().to_string();
        assert!(err.contains(needle), "{extra}: {err}");
    }
}

#[test]
fn fsdp_flags_become_zero_stages() {
    // Megatron-FSDP's sharding strategies (megatron/training/arguments.py, default
    // optim_grads_params) as ZeRO stages; torch FSDP2 shards all three: ZeRO-3.
    let zero = |extra: &str| {
        let imp =
            import(&format!("--num-layers 4 --hidden-size 256 {extra}"), "args").expect("imports");
        imp.layer["parallel"]["zero"].clone()
    };
    assert_eq!(zero("--use-megatron-fsdp"), json!(3));
    assert_eq!(
        zero("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads"),
        json!(2)
    );
    assert_eq!(
        zero("--use-megatron-fsdp --data-parallel-sharding-strategy no_shard"),
        json!(0)
    );
    assert_eq!(zero("--use-torch-fsdp2"), json!(3));
    assert_eq!(zero("--use-distributed-optimizer"), json!(1));
}

#[test]
fn moe_layer_lists_become_the_pattern() {
    // Llama 4 Maverick's ([0,1]*24): MoE on odd layers; an integer N: every N-th from 0.
    let layer = |extra: &str| {
        import(
            &format!("--num-layers 6 --hidden-size 256 --num-experts 4 {extra}"),
            "args",
        )
        .expect("imports")
        .layer["model"]
            .clone()
    };
    assert_eq!(
        layer("--moe-layer-freq \"([0,1]*3)\"")["moe_layer_pattern"],
        json!([0, 1, 0, 1, 0, 1])
    );
    assert_eq!(
        layer("--moe-layer-freq 2")["moe_layer_pattern"],
        json!([1, 0, 1, 0, 1, 0])
    );
    // Dense layers first, then MoE: DeepSeek's first_k_dense.
    let m = layer("--moe-layer-freq [0]*2+[1]*4");
    assert_eq!(m["moe_first_k_dense"], json!(2));
    assert!(m.get("moe_layer_pattern").is_none());
}

#[test]
fn new_models_print_as_megatron_arguments_and_read_back() {
    // The reverse of the import: the new presets' models (a hybrid one too) written as
    // Megatron flags read back to the same model; Llama 4's chunks have no Megatron flag and
    // are named in the printed comment instead.
    let hybrid = json!({"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
        "hybrid_layer_pattern": "M*M-",
        "mamba": {"num_heads": 8, "head_dim": 64, "state_dim": 16, "num_groups": 2}});
    for model in [
        json!({"preset": "gpt-oss-20b"}),
        json!({"preset": "qwen3-30b-a3b"}),
        json!({"preset": "llama4-maverick"}),
        hybrid,
    ] {
        let cfg = Config::from_layers(&[Layer::overrides(json!({"model": model}))]).expect("loads");
        let text = to_megatron_args(&cfg);
        let imp = import(&text, "printed").expect("reads back");
        let back = Config::from_layers(&[Layer::overrides(imp.layer)]).expect("merges");
        let mut want = cfg.model.clone();
        want.name = "megatron".into();
        if want.attention_chunk_size.take().is_some() {
            assert!(text.contains("attention_chunk_size = 8192"), "{text}");
            want.window_attn_skip_freq = 0;
        }
        // Softmax gates renormalised over the top k (GPT-OSS, Qwen3) are Megatron's default
        // without --moe-router-pre-softmax, which neither the import nor the printer reads yet.
        want.moe_router_renormalize = back.model.moe_router_renormalize;
        assert_eq!(back.model, want, "{text}");
        assert!(imp.ignored.is_empty(), "{:?}", imp.ignored);
    }
}
