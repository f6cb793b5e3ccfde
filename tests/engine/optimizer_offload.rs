//! CPU optimizer offload (`training.optimizer_offload_fraction`): the offloaded parameters'
//! optimizer state leaves the GPU for the host, byte for byte, and their step adds the
//! gradient copy down, the CPU Adam step and the weight copy up; the DeepSpeed and Megatron
//! imports read the offload settings and refuse, by name, what is not modelled.

use super::common::{est, resolve};
use parsim::config::{Config, Layer, Resolved};
use parsim::memory::optimizer_offload::{step_s, CPU_ADAM_PARAMS_PER_S};
use serde_json::{json, Value};

/// A 2-layer dense model (hidden 64, 8 heads of 8 in 4 groups, SwiGLU 128, vocabulary 128,
/// untied, no biases) on one H100, ZeRO-0, with `training` laid over its training section.
fn tiny(training: Value) -> Value {
    let mut c = json!({
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
                  "num_query_groups": 4, "ffn_hidden_size": 128, "vocab_size": 128,
                  "make_vocab_size_divisible_by": 1},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 1},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 0},
        "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 1}
    });
    for (k, v) in training.as_object().unwrap() {
        c["training"][k] = v.clone();
    }
    c
}

/// The model's parameters by hand: per layer QKV 64 x (64 + 2 x 32) = 8192, projection
/// 64 x 64 = 4096, SwiGLU fc1 64 x 256 = 16384, fc2 128 x 64 = 8192, two RMSNorms of 64;
/// the embedding and output layer 128 x 64 each and the final norm 64.
const PARAMS: u64 = 2 * (36864 + 128) + 2 * 8192 + 64;

#[test]
fn offload_moves_exactly_the_state_bytes_to_the_host() {
    let off = est(tiny(json!({})));
    assert_eq!(off.params.total, PARAMS);
    let a = &off.memory.stages[0];
    // Megatron-Core's default state: fp32 master and two fp32 moments, 12 bytes a parameter.
    assert_eq!(a.optimizer, 12 * PARAMS);
    assert_eq!(a.host_optimizer, 0);
    let all = est(tiny(json!({"optimizer_offload_fraction": 1.0})));
    let b = &all.memory.stages[0];
    assert_eq!(b.optimizer, 0);
    assert_eq!(b.host_optimizer, 12 * PARAMS);
    assert_eq!(a.total - b.total, 12 * PARAMS);
    assert_eq!((b.weights, b.gradients), (a.weights, a.gradients));
    // Half: HybridDeviceOptimizer offloads parameters until half the elements are (the
    // share rounded up to a whole element here), the rest stays on the GPU.
    let half = est(tiny(json!({"optimizer_offload_fraction": 0.5})));
    let h = &half.memory.stages[0];
    assert_eq!(h.host_optimizer, 12 * PARAMS.div_ceil(2));
    assert_eq!(h.optimizer + h.host_optimizer, 12 * PARAMS);
    // The JSON carries the host line only where there is one.
    let json = serde_json::to_value(b).unwrap();
    assert_eq!(json["host_optimizer"], 12 * PARAMS);
    assert!(serde_json::to_value(a)
        .unwrap()
        .get("host_optimizer")
        .is_none());
}

#[test]
fn the_offloaded_step_costs_its_copies_and_the_cpu_adam_step() {
    let r = resolve(tiny(json!({"optimizer_offload_fraction": 1.0})));
    let link = r
        .gpu
        .links
        .host
        .clone()
        .expect("the H100 profile has a host link");
    // By hand: fp32 gradients down (4 bytes) and bf16 weights up (2 bytes) over the link at
    // its achieved bandwidth, each after the link's latency; the CPU Adam step of the
    // parameters at 1e9 / 0.22 a second (Ren et al. 2021), the host shared by its 8 GPUs.
    let rate = link.bandwidth_bytes_per_s * link.efficiency;
    let expected = 2.0 * link.latency_s
        + (4 * PARAMS) as f64 / rate
        + (2 * PARAMS) as f64 / rate
        + (PARAMS * 8) as f64 * 0.22 / 1e9;
    let got = step_s(&r, PARAMS);
    assert!(
        (got - expected).abs() <= 1e-12 * expected,
        "{got} vs {expected}"
    );
    assert!((CPU_ADAM_PARAMS_PER_S - 1e9 / 0.22).abs() < 1e-3);
    assert_eq!(step_s(&r, 0), 0.0);
    // The estimate's optimizer step holds the offloaded part: slower than on the GPU.
    let on = est(tiny(json!({"optimizer_offload_fraction": 1.0})));
    let off = est(tiny(json!({})));
    assert!(on.time.optimizer_s >= expected, "{}", on.time.optimizer_s);
    assert!(on.time.optimizer_s > off.time.optimizer_s);
    assert!(on.time.step_s > off.time.step_s);
}

/// The error a configuration is refused with.
fn refused(overlay: Value) -> String {
    Config::from_layers(&[Layer::overrides(overlay)])
        .and_then(Resolved::new)
        .expect_err("refused")
        .to_string()
}

#[test]
fn offload_settings_out_of_range_are_refused_by_field() {
    for f in [1.5, -0.1] {
        let e = refused(tiny(json!({"optimizer_offload_fraction": f})));
        assert!(
            e.contains("training.optimizer_offload_fraction") && e.contains("between 0 and 1"),
            "{e}"
        );
    }
    let e = refused(tiny(
        json!({"optimizer_offload_fraction": 1.0, "optimizer": "muon"}),
    ));
    assert!(
        e.contains("training.optimizer_offload_fraction") && e.contains("Adam only"),
        "{e}"
    );
}

#[test]
fn deepspeed_offload_optimizer_to_the_cpu_is_read() {
    use parsim::config::deepspeed::import;
    let with = |section: &str, stage: u8| {
        format!(
            r#"{{"train_micro_batch_size_per_gpu": 1, "bf16": {{"enabled": true}},
            "zero_optimization": {{"stage": {stage}, "offload_optimizer": {section}}}}}"#
        )
    };
    let cpu = r#"{"device": "cpu", "pin_memory": true, "ratio": 1.0}"#;
    let imp = import(&with(cpu, 2), "x").expect("CPU offload imports");
    assert_eq!(imp.layer["training"]["optimizer_offload_fraction"], 1.0);
    let none = import(&with(r#"{"device": "none"}"#, 2), "x").unwrap();
    assert!(none.layer["training"]
        .get("optimizer_offload_fraction")
        .is_none());
    for (section, stage, needle) in [
        (
            r#"{"device": "nvme", "nvme_path": "/nvme"}"#,
            2,
            "zero_optimization.offload_optimizer: optimizer offload to NVMe is not modelled",
        ),
        (
            r#"{"device": "cpu", "ratio": 0.3}"#,
            3,
            "zero_optimization.offload_optimizer.ratio: a partial optimizer offload",
        ),
        (
            r#"{"device": "cpu", "pin_memroy": true}"#,
            2,
            "zero_optimization.offload_optimizer.pin_memroy: unknown key",
        ),
        (
            r#"{"device": "cpu"}"#,
            0,
            "zero_optimization.offload_optimizer: CPU optimizer offload needs ZeRO stage 1, 2 or 3",
        ),
    ] {
        let e = import(&with(section, stage), "x")
            .expect_err(section)
            .to_string();
        assert!(e.starts_with(needle), "{section}: {e}");
    }
}

#[test]
fn megatron_optimizer_cpu_offload_is_read() {
    use parsim::config::megatron::import;
    let base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512";
    let read = |extra: &str| import(&format!("{base} {extra}"), "args");
    let all = read("--optimizer-cpu-offload").expect("imports");
    assert_eq!(all.layer["training"]["optimizer_offload_fraction"], 1.0);
    let half = read("--optimizer-cpu-offload --optimizer-offload-fraction 0.5").unwrap();
    assert_eq!(half.layer["training"]["optimizer_offload_fraction"], 0.5);
    // The fraction alone offloads nothing (Megatron reads it only with the offload on).
    let alone = read("--optimizer-offload-fraction 0.5").unwrap();
    assert!(alone
        .layer
        .get("training")
        .is_none_or(|t| t.get("optimizer_offload_fraction").is_none()));
    for (extra, needle) in [
        (
            "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d",
            "--overlap-cpu-optimizer-d2h-h2d",
        ),
        (
            "--optimizer-cpu-offload --optimizer-offload-fraction 1.5",
            "--optimizer-offload-fraction",
        ),
    ] {
        let e = read(extra).expect_err(extra).to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

/// The executor steps the optimizer on the device: a plan with offload is refused by field
/// rather than run with the state where the estimate says it is not.
#[test]
fn the_executor_refuses_optimizer_offload_by_field() {
    let r = resolve(tiny(json!({"optimizer_offload_fraction": 0.5})));
    let e = parsim::lower::check_training(&r.config.training)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("training.optimizer_offload_fraction"), "{e}");
    assert!(parsim::lower::check_training(&resolve(tiny(json!({}))).config.training).is_ok());
}
