//! `training.framework`: each framework's documented defaults (src/config/framework.rs cites
//! them), explicit settings winning over them, ZeRO-3 prefetch exposure by framework, and bad
//! names refused by field.

use super::common::{est, resolve};
use parsim::config::{Config, Layer};
use parsim::model::CommKind;
use serde_json::json;

/// Llama-3-70B, TP 8 over 64 H100s, ZeRO stage `zero` under `framework`.
fn cfg(framework: &str, zero: u8) -> serde_json::Value {
    json!({
        "model": {"preset": "llama3-70b"},
        "cluster": {"num_gpus": 64},
        "parallel": {"tp": 8, "zero": zero},
        "training": {"framework": framework, "global_batch_size": 64},
    })
}

/// Megatron-Core as NeMo's recipes run it overlaps gradient reduction and parameter gathers
/// (DistributedDataParallelConfig's overlap_grad_reduce / overlap_param_gather turned on);
/// DeepSpeed's `overlap_comm` is off below stage 3 and on at stage 3 (deepspeed.ai
/// config-json); FSDP reduce-scatters per unit on a side stream and prefetches the next
/// unit (PyTorch FSDP notes). No framework turns Megatron's --tp-comm-overlap on.
#[test]
fn each_framework_applies_its_documented_defaults() {
    let expect = [
        ("megatron-core", 1, true, true),
        ("nemo", 1, true, true),
        ("deepspeed", 1, false, false),
        ("deepspeed", 3, true, true),
        ("fsdp", 3, true, true),
    ];
    for (fw, zero, grad, param) in expect {
        let r = resolve(cfg(fw, zero));
        let p = &r.config.parallel;
        assert_eq!(p.overlap_grad_reduce, grad, "{fw} zero {zero}");
        assert_eq!(p.overlap_param_gather, param, "{fw} zero {zero}");
        assert!(!p.tp_comm_overlap, "{fw}");
        assert!(
            r.config
                .training
                .framework
                .overrides(&r.config.parallel)
                .is_empty(),
            "{fw}: defaults are not overrides"
        );
    }
}

/// A setting given explicitly wins over the framework's default, whichever layer the
/// framework is named in, and the estimate lists it as an override.
#[test]
fn explicit_settings_override_the_framework() {
    let mut v = cfg("deepspeed", 1);
    v["parallel"]["overlap_grad_reduce"] = json!(true);
    let r = resolve(v.clone());
    assert!(r.config.parallel.overlap_grad_reduce);
    assert!(!r.config.parallel.overlap_param_gather);
    // The framework named in a later layer than the flag: the flag still wins.
    let layers = [
        Layer::overrides(json!({"parallel": {"overlap_param_gather": true}})),
        Layer::overrides(json!({"training": {"framework": "deepspeed"}})),
    ];
    let c = Config::from_layers(&layers).unwrap();
    assert!(c.parallel.overlap_param_gather);
    let e = est(v);
    assert_eq!(
        e.framework_overrides.len(),
        1,
        "{:?}",
        e.framework_overrides
    );
    assert!(e.framework_overrides[0].starts_with("parallel.overlap_grad_reduce = true"));
    // An explicit bucket and prefetch are overrides too.
    let mut v = cfg("fsdp", 3);
    v["parallel"]["ddp_bucket_size"] = json!(1_000_000);
    v["parallel"]["zero3_prefetch_params"] = json!(0);
    assert_eq!(est(v).framework_overrides.len(), 2);
}

/// DeepSpeed's prefetch (partitioned_param_coordinator.py, `fetch_sub_module`): every
/// module's hook prefetches one more `stage3_prefetch_bucket_size` group, until
/// `stage3_max_live_parameters` elements are held. Llama-3-70B on a TP-8 rank has 107M
/// parameters a layer in four partitioned linear modules, so the 5e7 groups run ahead past a
/// whole layer under the default 1e9 cap: DeepSpeed hides its gathers as far as Megatron-Core's
/// one layer ahead. A cap of 5e7 (below a layer) leaves part of every gather waiting, and no
/// prefetch at all (bucket 0) exposes the most.
#[test]
fn deepspeed_zero3_prefetch_reaches_as_far_as_max_live_allows() {
    let dp = |v: serde_json::Value| est(v).time.exposed_comm_by_group_s[CommKind::Dp];
    let megatron = dp(cfg("megatron-core", 3));
    let deepspeed = dp(cfg("deepspeed", 3));
    let mut capped = cfg("deepspeed", 3);
    capped["parallel"]["zero3_max_live_parameters"] = json!(50_000_000u64);
    let capped = dp(capped);
    let mut none = cfg("deepspeed", 3);
    none["parallel"]["zero3_prefetch_bucket_size"] = json!(0);
    let none = dp(none);
    assert!(megatron > 0.0 && deepspeed > 0.0);
    assert!(capped > deepspeed, "{capped} vs {deepspeed}");
    assert!(none >= capped, "{none} vs {capped}");
    // The default depth reaches past one layer, as Megatron-Core's does: raising it changes
    // nothing.
    let mut deeper = cfg("deepspeed", 3);
    deeper["parallel"]["zero3_prefetch_params"] = json!(1_000_000_000u64);
    assert_eq!(dp(deeper), deepspeed);
}

/// An unknown framework is refused naming the field and the known names.
#[test]
fn unknown_framework_is_refused_by_field() {
    let err = Config::from_layers(&[Layer::overrides(cfg("jax", 1))]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("training.framework"), "{msg}");
    assert!(msg.contains("deepspeed"), "{msg}");
    let err = Config::from_layers(&[Layer::overrides(json!({"training": {"framework": 3}}))])
        .unwrap_err();
    assert!(err.to_string().contains("framework"), "{err}");
}
