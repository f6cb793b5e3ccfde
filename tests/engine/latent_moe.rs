//! Latent MoE (Megatron's `--moe-latent-size`; Nemotron 3 Super and Ultra): the presets'
//! parameters by hand from the layer shapes and against the published checkpoint's element
//! count, the MoE layer's FLOPs against Megatron-LM's own formula, the dispatch at the latent
//! width, and the executor's refusal by field.

use super::common::{est, resolve, single};
use parsim::model::{Block, Ledger, OpKind};
use serde_json::json;

/// A Nemotron 3 model by hand from its shapes (Megatron-Core's MambaMixer, attention and
/// latent MoE layers; Megatron-LM's conf files for the widths): per Mamba-2 layer its norm,
/// in_proj h x (2 inner + 2 x 8 x 128 + heads), the convolution over inner + 2 x 8 x 128
/// channels (4 weights and a bias each), A, D and dt's bias, the gated norm and out_proj; per
/// attention layer its norm, q and o h x heads x 128, k and v h x 2 x 128; per latent MoE
/// layer its norm, the router h x 512 and its 512 expert biases, fc1_latent_proj h x latent
/// and fc2_latent_proj latent x h, 512 experts of two latent x f (squared ReLU, not gated)
/// and the shared expert's two h x shared; two 131,072 x h embeddings and the final norm.
/// Returns (the decoder's total, one MTP block of attention and latent MoE: its two norms,
/// eh_proj 2h x h, the layers and its final norm).
fn by_hand(
    pattern: &str,
    h: u64,
    (heads, mh): (u64, u64),
    (f, shared, latent): (u64, u64, u64),
) -> (u64, u64) {
    let inner = mh * 64;
    let conv = inner + 2 * 8 * 128;
    let mamba = h + h * (2 * inner + 2 * 8 * 128 + mh) + conv * 5 + 3 * mh + inner + inner * h;
    let attention = h + 2 * h * heads * 128 + 2 * h * 2 * 128;
    let moe = h + h * 512 + 512 + 2 * h * latent + 512 * 2 * latent * f + 2 * h * shared;
    let count = |c| pattern.chars().filter(|x| *x == c).count() as u64;
    let total =
        count('M') * mamba + count('*') * attention + count('E') * moe + 2 * 131_072 * h + h;
    (total, 2 * h + 2 * h * h + attention + moe + h)
}

fn pattern(preset: &str) -> String {
    parsim::config::presets::preset(preset)
        .and_then(|m| m.hybrid_layer_pattern)
        .expect("a hybrid preset")
}

#[test]
fn nemotron_3_super_and_ultra_presets_give_their_totals_by_hand() {
    // Super: 88 layers (40 Mamba-2, 8 attention, 40 latent MoE), hidden 4096, 32 heads, 128
    // Mamba heads, experts of 2688 on a latent of 1024, a shared expert of 5376
    // (NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh): the card's "120B".
    let p = pattern("nemotron-3-super");
    assert_eq!((p.len(), p.matches('E').count()), (88, 40));
    let (total, _) = by_hand(&p, 4096, (32, 128), (2688, 5376, 1024));
    let got = est(single("nemotron-3-super")).params.total;
    assert_eq!(got, total);
    assert_eq!((got as f64 / 1e9).round(), 121.0, "{got}");
    // Ultra: 108 layers (48, 12, 48), hidden 8192, 64 heads, 256 Mamba heads, experts of 5120
    // on a latent of 2048, a shared expert of 10240 (NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh):
    // the card's "550B".
    let p = pattern("nemotron-3-ultra");
    assert_eq!((p.len(), p.matches('E').count()), (108, 48));
    let (total, _) = by_hand(&p, 8192, (64, 256), (5120, 10240, 2048));
    let got = est(single("nemotron-3-ultra")).params.total;
    assert_eq!(got, total);
    assert_eq!((got as f64 / 1e10).round(), 55.0, "{got}");
}

#[test]
fn nemotron_3_super_with_its_mtp_block_holds_the_checkpoints_elements() {
    // Megatron-Bridge's verification card for nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16
    // (examples/model_verification_cards/nemotron-3-super-120b-a12b/card.yaml): the export
    // "reproduces all 42,683 source tensors and 123,611,033,088 elements", the decoder and
    // one shared MTP block (its 41st router bias is the MTP layer's).
    let mut v = single("nemotron-3-super");
    v["model"]["mtp_num_layers"] = json!(1);
    let got = est(v).params.total;
    assert_eq!(got, 123_611_033_088);
    let (decoder, mtp) = by_hand(
        &pattern("nemotron-3-super"),
        4096,
        (32, 128),
        (2688, 5376, 1024),
    );
    assert_eq!(got, decoder + mtp);
}

fn latent_block(l: &Ledger) -> &Block {
    l.variants
        .iter()
        .find(|b| b.ops.iter().any(|o| o.name == "moe.fc1_latent_proj"))
        .expect("a latent MoE block")
}

#[test]
fn the_latent_moe_layers_flops_are_megatrons() {
    // Megatron-LM's num_floating_point_operations (megatron/training/training.py,
    // moe_layer_flops with moe_latent_size): routed 4 T latent f k, "up proj and down proj"
    // 4 T h latent, shared 4 T h shared (forward, squared ReLU: no GLU factor). The router's
    // 2 T h E is counted by hand beside them. Super at 2048 tokens.
    let r = resolve(single("nemotron-3-super"));
    let l = Ledger::build(&r);
    let t = 2048.0;
    let (h, e, k, f, shared, latent) = (4096.0, 512.0, 22.0, 2688.0, 5376.0, 1024.0);
    let fwd = |pred: &dyn Fn(&str) -> bool| -> f64 {
        latent_block(&l)
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Matmul { .. }) && pred(o.name))
            .map(|o| o.model_flops.fwd)
            .sum()
    };
    let megatron = 4.0 * t * latent * f * k + 4.0 * t * h * latent + 4.0 * t * h * shared;
    let got = fwd(&|n| n.starts_with("moe.") && n != "moe.router");
    assert!((got / megatron - 1.0).abs() < 1e-12, "{got} vs {megatron}");
    assert_eq!(fwd(&|n| n == "moe.router"), 2.0 * t * h * e);
}

#[test]
fn tokens_travel_at_the_latent_width() {
    // The dispatch all-to-all carries the routed copies at the latent width (Megatron-Core's
    // token_dispatcher.py: hidden_dim = moe_latent_size or hidden_size): with the latent
    // removed, the same layer moves h / latent = 4 times the bytes. EP 8 over 8 GPUs.
    let dispatch_bytes = |latent: Option<u64>| -> u64 {
        let mut v = single("nemotron-3-super");
        v["model"]["moe_latent_size"] = json!(latent);
        v["cluster"]["num_gpus"] = json!(8);
        v["parallel"]["ep"] = json!(8);
        v["training"]["global_batch_size"] = json!(8);
        let r = resolve(v);
        let l = Ledger::build(&r);
        l.variants
            .iter()
            .flat_map(|b| b.ops.iter())
            .find(|o| o.name == "moe.dispatch")
            .map(|o| o.comms.iter().map(|c| c.payload_bytes).sum())
            .expect("a dispatch")
    };
    let latent = dispatch_bytes(Some(1024));
    // 2048 tokens x top-22 at 1024 bf16 elements, forward and backward.
    assert_eq!(latent, 2 * 2048 * 22 * 1024 * 2);
    assert_eq!(dispatch_bytes(None), 4 * latent);
}

#[test]
fn latent_moe_is_refused_where_it_cannot_apply() {
    // The executor's experts work at the hidden size: lowering names the field.
    let r = resolve(single("nemotron-3-super"));
    let err = parsim::lower::lower(&r, &parsim::lower::LowerOptions::default())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("model.moe_latent_size"), "{err}");
    // A dense model has no routed tokens to project; a zero width is no projection.
    for (model, rule) in [
        (
            json!({"preset": "llama3-8b", "moe_latent_size": 1024}),
            "needs num_experts > 0",
        ),
        (
            json!({"preset": "nemotron-3-super", "moe_latent_size": 0}),
            "must be at least 1",
        ),
    ] {
        let mut v = single("llama3-8b");
        v["model"] = model;
        let cfg = parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(v)])
            .expect("merges");
        let err = parsim::config::Resolved::new(cfg)
            .expect_err(rule)
            .to_string();
        assert!(
            err.contains("model.moe_latent_size") && err.contains(rule),
            "{err}"
        );
    }
}
