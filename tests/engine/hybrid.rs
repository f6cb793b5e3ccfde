//! Hybrid Mamba-2 models (Megatron's `--hybrid-layer-pattern`): the Mamba-2 mixer as a ledger
//! op, its parameters and their TP split by hand from the mixer's shapes (Megatron-Core's
//! MambaMixer), the SSD scan's FLOPs linear in the sequence (Dao and Gu 2024, sec. 6), its
//! saved activations by hand, and the pattern's errors.

use super::common::{est, resolve};
use parsim::config::{Config, ConfigError, Layer, Resolved};
use parsim::model::{chunks_per_rank, Block, Ledger};
use serde_json::{json, Value};

/// A 4-layer hybrid (Mamba, attention, Mamba, MLP) of hidden 256, with `parallel` and
/// `seq` tokens.
fn hybrid(parallel: Value, seq: u64) -> Value {
    json!({
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
            "max_position_embeddings": 65536,
            "hybrid_layer_pattern": "M*M-",
            "mamba": {"num_heads": 8, "head_dim": 64, "state_dim": 16, "num_groups": 2}},
        "cluster": {"num_gpus": parallel["tp"].as_u64().unwrap_or(1), "gpus_per_node": 8},
        "parallel": parallel,
        "training": {"seq_length": seq, "global_batch_size": 1}
    })
}

fn mamba_block(l: &Ledger) -> &Block {
    l.variants
        .iter()
        .find(|b| b.ops.iter().any(|o| o.name == "mamba.ssd"))
        .expect("a Mamba-2 block")
}

#[test]
fn the_pattern_places_one_block_a_kind() {
    let r = resolve(hybrid(json!({"tp": 1, "sp": false}), 1024));
    let l = Ledger::build(&r);
    // M, *, -: three kinds; the full dense block is not used.
    assert_eq!(l.variants.len(), 3);
    let c = chunks_per_rank(&r)[0][0];
    assert_eq!(c.dense_layers + c.moe_layers, 0);
    assert_eq!(c.variant_layers[..3], [2, 1, 1]);
}

#[test]
fn mamba_parameters_and_their_tp_split_by_hand() {
    // Inner 8 x 64 = 512; convolution channels 512 + 2 x 2 x 16 = 576.
    // tp 1: norm 256; in_proj 256 x (2 x 512 + 2 x 2 x 16 + 8) = 256 x 1096; conv 576 x (4 + 1);
    // A, D, dt bias 3 x 8; gated norm 512; out_proj 512 x 256.
    let whole: u64 = 256 + 256 * 1096 + 576 * 5 + 3 * 8 + 512 + 512 * 256;
    let r = resolve(hybrid(json!({"tp": 1, "sp": false}), 1024));
    let p = mamba_block(&Ledger::build(&r)).params();
    assert_eq!((p.total, p.rank()), (whole, whole));
    // tp 2 splits the heads (4 a rank) and the groups (1 a rank): in_proj 256 x 548, conv
    // 288 x 5, 3 x 4, gated norm 256, out_proj 256 x 256; the pre-norm stays whole.
    let r = resolve(hybrid(json!({"tp": 2, "sp": true}), 1024));
    let p = mamba_block(&Ledger::build(&r)).params();
    assert_eq!(p.total, whole);
    assert_eq!(
        p.rank(),
        256 + 256 * 548 + 288 * 5 + 3 * 4 + 256 + 256 * 256
    );
}

#[test]
fn the_ssd_scan_grows_linearly_with_the_sequence() {
    // Attention's FLOPs grow with s^2, the SSD's with s: doubling the sequence doubles them.
    let ssd = |seq| {
        let r = resolve(hybrid(json!({"tp": 1, "sp": false}), seq));
        let l = Ledger::build(&r);
        let op = mamba_block(&l)
            .ops
            .iter()
            .find(|o| o.name == "mamba.ssd")
            .cloned()
            .expect("ssd");
        op.model_flops.fwd
    };
    assert_eq!(ssd(8192), 2.0 * ssd(4096));
    // By hand (Dao and Gu 2024, sec. 6): 2 x tokens x (groups q n + heads (q p + 2 n p)),
    // q = 128: 2 x 4096 x (2 x 128 x 16 + 8 x (128 x 64 + 2 x 16 x 64)).
    let by_hand = 2.0 * 4096.0 * (2.0 * 128.0 * 16.0 + 8.0 * (128.0 * 64.0 + 2.0 * 16.0 * 64.0));
    assert_eq!(ssd(4096), by_hand);
}

#[test]
fn mamba_saved_activations_by_hand() {
    // 1024 tokens in bf16 (2 bytes), tp 1: the norm's input 1024 x 256; in_proj's input the
    // same; the convolution's input 1024 x 576; the scan's x/B/C 1024 x 576, dt and its decay
    // 2 x 1024 x 8 x 4 (fp32) and its output y 1024 x 512; the gated norm's z 1024 x 512
    // (its y is the scan's output, the same tensor); out_proj's input 1024 x 512.
    let r = resolve(hybrid(json!({"tp": 1, "sp": false}), 1024));
    let b = mamba_block(&Ledger::build(&r)).saved_all_bytes();
    let by_hand = 2 * 1024 * 256 * 2
        + 2 * 1024 * 576 * 2
        + 2 * 1024 * 8 * 4
        + 1024 * 512 * 2
        + 1024 * 512 * 2
        + 1024 * 512 * 2;
    assert_eq!(b, by_hand);
}

#[test]
fn a_hybrid_model_estimates_and_lowers_with_its_layers() {
    let e = est(hybrid(json!({"tp": 2, "sp": true}), 4096));
    assert!(e.time.step_s > 0.0 && e.params.total > 0);
    let r = resolve(hybrid(json!({"tp": 1, "sp": false}), 1024));
    let plan = parsim::lower::lower(&r, &parsim::lower::LowerOptions::default()).expect("lowers");
    // "M*M-": Mamba, attention, Mamba, MLP; the mixer's shape as configured, with the
    // defaults conv_kernel 4 and chunk_size 128.
    use parsim_plan::plan::{HybridLayer as H, MambaShape};
    assert_eq!(
        plan.model.hybrid,
        [H::Mamba, H::Attention, H::Mamba, H::Mlp]
    );
    let want = MambaShape {
        heads: 8,
        head_dim: 64,
        state: 16,
        groups: 2,
        conv_kernel: 4,
        chunk: 128,
    };
    assert_eq!(plan.model.mamba, Some(want));
}

fn violations(v: Value) -> Vec<parsim::config::Violation> {
    let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
    match Resolved::new(cfg) {
        Err(ConfigError::Invalid(v)) => v,
        other => panic!("expected violations, got {other:?}"),
    }
}

#[test]
fn a_pattern_whose_length_is_not_num_layers_is_refused() {
    let mut v = hybrid(json!({"tp": 1, "sp": false}), 1024);
    v["model"]["hybrid_layer_pattern"] = json!("M*M-M");
    let errs = violations(v);
    assert_eq!(errs[0].field, "model.hybrid_layer_pattern");
    assert!(
        errs[0].rule.contains("5 layers") && errs[0].rule.contains('4'),
        "{}",
        errs[0].rule
    );
    // Groups that TP cannot split whole, and CP over Mamba layers.
    let errs = violations(hybrid(json!({"tp": 4, "sp": true}), 1024));
    assert!(
        errs.iter().any(|e| e.field == "model.mamba.num_groups"),
        "{errs:?}"
    );
    let mut v = hybrid(json!({"tp": 1, "cp": 2, "sp": false}), 1024);
    v["cluster"]["num_gpus"] = json!(2);
    let errs = violations(v);
    assert!(errs.iter().any(|e| e.field == "parallel.cp"), "{errs:?}");
}

/// A Nemotron-H model's parameters by hand from its shapes (Megatron-Core's MambaMixer, as
/// `mamba_parameters_and_their_tp_split_by_hand`): per Mamba-2 layer its norm h, in_proj
/// h x (2 inner + 2 x 8 groups x state + heads), the convolution over inner + 2 x 8 x state
/// channels (4 weights and a bias each), A, D and dt's bias 3 x heads, the gated norm inner
/// and out_proj inner x h, with inner = heads x 64; per attention layer its norm, q and o
/// h x heads x 128 each and k, v h x 8 x 128 each; per MLP its norm and two h x ffn
/// (squared ReLU, not gated); two 131,072 x h embeddings and the final norm.
fn nemotron_h_by_hand(pattern: &str, h: u64, heads: u64, ffn: u64, (mh, state): (u64, u64)) -> u64 {
    let inner = mh * 64;
    let conv = inner + 2 * 8 * state;
    let mamba = h + h * (2 * inner + 2 * 8 * state + mh) + conv * 5 + 3 * mh + inner + inner * h;
    let attention = h + 2 * h * heads * 128 + 2 * h * 8 * 128;
    let mlp = h + 2 * h * ffn;
    let count = |c| pattern.chars().filter(|x| *x == c).count() as u64;
    count('M') * mamba + count('*') * attention + count('-') * mlp + 2 * 131_072 * h + h
}

fn preset_total(name: &str) -> u64 {
    est(super::common::single(name)).params.total
}

#[test]
fn nemotron_h_presets_give_their_cards_totals() {
    // NVIDIA 2025, "Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer
    // Models" (arXiv:2504.03624), Table 1 and the model cards: 8B, 47B and 56B; the layer
    // patterns and widths of Megatron-Bridge's NemotronH providers and the config.json files.
    let p8 = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
    let p47 = "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-";
    let p56 = format!(
        "{}{}",
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-",
        "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    );
    assert_eq!((p8.len(), p47.len(), p56.len()), (52, 98, 118));
    let by_hand_8b = nemotron_h_by_hand(p8, 4096, 32, 21504, (128, 128));
    assert_eq!(by_hand_8b, 8_100_852_736);
    for (name, by_hand, card) in [
        ("nemotron-h-8b", by_hand_8b, 8.0),
        (
            "nemotron-h-47b",
            nemotron_h_by_hand(p47, 8192, 64, 30720, (256, 256)),
            47.0,
        ),
        (
            "nemotron-h-56b",
            nemotron_h_by_hand(&p56, 8192, 64, 32768, (256, 256)),
            56.0,
        ),
    ] {
        let total = preset_total(name);
        assert_eq!(total, by_hand, "{name}");
        assert_eq!((total as f64 / 1e9).round(), card, "{name}: {total}");
    }
}

#[test]
fn nemotron_3_nano_preset_gives_its_cards_total() {
    // NVIDIA Nemotron 3 Nano 30B-A3B model card: 31.6B total. By hand: 23 Mamba-2 layers
    // (hidden 2688, 64 heads of 64, state 128), 6 attention layers (32 heads and 2 KV
    // groups of 128), 23 MoE layers: the norm, the router 2688 x 128 and its 128 score-correction
    // biases (the checkpoint's e_score_correction_bias), 128 experts of two
    // 2688 x 1856 (squared ReLU) and the shared expert's two 2688 x 3712.
    let (h, inner, conv) = (2688u64, 4096u64, 4096u64 + 2 * 8 * 128);
    let mamba = h + h * (2 * inner + 2 * 8 * 128 + 64) + conv * 5 + 3 * 64 + inner + inner * h;
    let attention = h + 2 * h * 32 * 128 + 2 * h * 2 * 128;
    let moe = h + h * 128 + 128 + 128 * 2 * h * 1856 + 2 * h * 3712;
    let by_hand = 23 * mamba + 6 * attention + 23 * moe + 2 * 131_072 * h + h;
    let total = preset_total("nemotron-3-nano");
    assert_eq!(total, by_hand);
    assert_eq!((total as f64 / 1e8).round() / 10.0, 31.6, "{total}");
}

fn hf_fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/hf/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn nemotron_h_config_json_imports_as_the_preset() {
    let mut single = super::common::single("nemotron-h-8b");
    let preset = est(single.clone());
    single["model"] = json!({"hf_config": hf_fixture("nemotron-h-8b")});
    let hf = est(single);
    assert_eq!(hf.params.total, preset.params.total);
    assert_eq!(hf.params.total, 8_100_852_736);
    assert_eq!(hf.flops.per_step_model, preset.flops.per_step_model);
}

#[test]
fn nemotron_h_config_json_errors_name_the_field() {
    let base: Value =
        serde_json::from_str(&std::fs::read_to_string(hf_fixture("nemotron-h-8b")).unwrap())
            .unwrap();
    let import = |edit: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        edit(&mut v);
        parsim::config::hf::import(&v, "config.json").map(|_| ())
    };
    for (edit, needle) in [
        (
            &(|v: &mut Value| v["hybrid_override_pattern"] = json!("M-M*")) as &dyn Fn(&mut Value),
            "4 layers, `num_hidden_layers` is 52",
        ),
        (
            &|v: &mut Value| v["hybrid_override_pattern"] = json!("X".repeat(52)),
            "unknown layer 'X'",
        ),
        (
            &|v: &mut Value| v["moe_latent_size"] = json!(-1),
            "`moe_latent_size` must be a non-negative integer",
        ),
        (
            &|v: &mut Value| v["mlp_hidden_act"] = json!("silu"),
            "`mlp_hidden_act`",
        ),
        (
            &|v: &mut Value| {
                v.as_object_mut().unwrap().remove("hybrid_override_pattern");
            },
            "`hybrid_override_pattern`",
        ),
    ] {
        let err = import(edit).expect_err(needle).to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // The list spelling (`layers_block_type`) reads as the pattern.
    let list: Vec<&str> = "M-M*"
        .chars()
        .map(|c| match c {
            'M' => "mamba",
            '*' => "attention",
            _ => "mlp",
        })
        .collect();
    let mut v = base.clone();
    v.as_object_mut().unwrap().remove("hybrid_override_pattern");
    v["layers_block_type"] = json!(list);
    v["num_hidden_layers"] = json!(4);
    let m = parsim::config::hf::import(&v, "config.json").expect("imports");
    assert_eq!(m.hybrid_layer_pattern.as_deref(), Some("M-M*"));
}

#[test]
fn nvidia_recipes_for_nemotron_h_are_accepted() {
    // Megatron-Bridge's nemotronh_47b / nemotronh_56b pretrain recipes: TP 8, PP 1, sequence
    // parallelism, 8K sequences, FP8 with current scaling; here on 8 nodes of H100 (DP 8,
    // the distributed optimizer). The 47B fits; the 56B does not once Transformer Engine's
    // cached FP8 weight copies and their Hopper transposes (2 bytes a parameter, 14 GB a rank
    // here) are counted, as NVIDIA's published runs of other recipes also do not in parsim
    // (tests/engine/blackwell.rs): accepted means estimated, the fit is printed.
    for (name, fits) in [("nemotron-h-47b", true), ("nemotron-h-56b", false)] {
        let e = est(json!({
            "model": {"preset": name},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 64, "gpus_per_node": 8},
            "parallel": {"tp": 8, "sp": true, "pp": 1, "zero": 1},
            "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 256,
                "precision": "fp8", "fp8_recipe": "current"}
        }));
        println!("{name}: {} bytes a GPU", e.memory.per_gpu_max_bytes);
        // The predicted peak is what fits; the verdict at p90 needs measured Megatron-Core
        // peaks, which calibration/memory-residuals.json does not hold yet (no evidence: the
        // widest framework spread), so it is printed, not asserted.
        println!(
            "{name}: fits at p90 {} (margin {} bytes)",
            e.memory.fits_at_p90, e.memory.margin_bytes_p90
        );
        if fits {
            assert!(
                e.memory.fits,
                "{name}: {} bytes",
                e.memory.per_gpu_max_bytes
            );
        }
        assert!(e.time.step_s > 0.0 && e.throughput.mfu < 1.0, "{name}");
    }
}
