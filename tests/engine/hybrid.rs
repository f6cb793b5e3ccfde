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
