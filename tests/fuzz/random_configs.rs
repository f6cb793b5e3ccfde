//! No input reaches a panic: random configurations (valid or not, including huge sizes) either
//! estimate or fail validation with an error (overflow checks are on in test builds).

use parsim::config::{Config, GpuProfile, Layer, Resolved};
use proptest::prelude::*;
use serde_json::json;

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=8,
        Just(0u64),
        1u64..=100_000,
        Just(1u64 << 40),
        Just(u32::MAX as u64)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_configurations_never_panic(
        preset in prop::sample::select(vec!["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "nemotron-3-nano"]),
        fsdp in prop::sample::select(vec!["", "megatron", "torch", "jax"]),
        tp in 0u32..=16, pp in 0u32..=8, cp in 0u32..=8, ep in 0u32..=64, etp in 0u32..=16, vpp in 0u32..=4, zero in 0u8..=4,
        gpus in prop_oneof![1u32..=64, Just(16384u32), Just(u32::MAX)],
        seq in size(), mbs in size(), gbs in size(), layers in size(), hidden in size(),
        schedule in prop::sample::select(vec!["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]),
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
        flash in any::<bool>(),
    ) {
        let v = json!({
            "model": {"preset": preset, "num_layers": layers.min(u32::MAX as u64), "hidden_size": hidden},
            "cluster": {"num_gpus": gpus},
            "parallel": {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "expert_tp": etp, "vpp": vpp, "zero": zero, "schedule": schedule},
            "training": {"seq_length": seq, "micro_batch_size": mbs, "global_batch_size": gbs,
                         "recompute": recompute, "flash_attention": flash}
        });
        let mut v = v;
        if !fsdp.is_empty() {
            v["parallel"]["fsdp"] = json!(fsdp);
        }
        if let Ok(cfg) = Config::from_layers(&[Layer::overrides(v)]) {
            if let Ok(r) = Resolved::new(cfg) {
                let _ = parsim::estimate::estimate(&r);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn valid_mixes_estimate_to_finite_consistent_numbers(
        preset in prop::sample::select(vec!["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "llama3-70b"]),
        tl in 0u32..=3, pl in 0u32..=3, cl in 0u32..=2, dl in 0u32..=4, zero in 0u8..=3, mbs_l in 0u32..=2,
        schedule in prop::sample::select(vec!["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]),
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
        cp_comm in prop::sample::select(vec!["p2p", "zigzag", "allgather", "a2a"]),
        el in 0u32..=5, etl in 0u32..=2,
    ) {
        let (tp, pp, cp, dp) = (1u32 << tl, 1u32 << pl, 1u32 << cl, 1u32 << dl);
        let vpp = match schedule { "interleaved-1f1b" | "zb-v" | "dualpipe-v" => 2, _ => 1 };
        let schedule = if pp == 1 { "1f1b" } else { schedule };
        let vpp = if pp == 1 { 1 } else { vpp };
        let mbs = 1u64 << mbs_l;
        // Expert parallelism on Megatron-Core's expert grid, up to 32 (above dp where
        // expert_tp x ep fits tp x cp x dp); a dense model keeps ep 1.
        let moe = matches!(preset, "mixtral-8x7b" | "deepseek-v3");
        let (ep, etp) = if moe { (1u32 << el, 1u32 << etl) } else { (1, 1) };
        let v = json!({
            "model": {"preset": preset},
            "cluster": {"num_gpus": tp * pp * cp * dp},
            "parallel": {"tp": tp, "sp": tp > 1, "pp": pp, "cp": cp, "cp_comm": cp_comm, "vpp": vpp, "zero": zero, "schedule": schedule, "ep": ep, "expert_tp": etp},
            "training": {"seq_length": 4096, "micro_batch_size": mbs, "global_batch_size": mbs * dp as u64 * 4 * pp as u64, "recompute": recompute}
        });
        let cfg = Config::from_layers(&[Layer::overrides(v)]).unwrap();
        if let Ok(r) = Resolved::new(cfg) {
            let e = parsim::estimate::estimate(&r).unwrap();
            prop_assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0);
            prop_assert!(e.throughput.mfu > 0.0 && e.throughput.mfu < 1.0, "mfu {}", e.throughput.mfu);
            prop_assert!(e.memory.per_gpu_max_bytes > 0);
            prop_assert!(e.schedule.bubble_fraction >= 0.0);
            prop_assert_eq!(e.schedule.peak_inflight_microbatches.len(), pp as usize);
        }
    }
}

/// The violations of a configuration document, or the loader's error as one.
fn refusal(v: serde_json::Value) -> Vec<(String, String)> {
    match Config::from_layers(&[Layer::overrides(v)]) {
        Err(e) => vec![(String::new(), e.to_string())],
        Ok(cfg) => match Resolved::new(cfg) {
            Err(parsim::config::ConfigError::Invalid(v)) => {
                v.into_iter().map(|x| (x.field, x.rule)).collect()
            }
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        },
    }
}

/// Issue 31's new inputs, each refused with the field and the rule: a hybrid pattern of the
/// wrong length or with an unknown layer, a Mamba-2 chunk beyond any kernel's (which
/// overflowed the SSD's byte counts, found by the fuzz test), a window larger than the
/// sequence, an FSDP
/// implementation that does not exist or cannot hold the ZeRO stage, an architecture the
/// config.json import does not know, and a Megatron flag it cannot read.
#[test]
fn issue_31_bad_inputs_name_the_field_and_the_rule() {
    let hybrid = |pattern: &str| {
        json!({"model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
            "hybrid_layer_pattern": pattern,
            "mamba": {"num_heads": 8, "head_dim": 64, "state_dim": 16, "num_groups": 2}},
            "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "sp": false},
            "training": {"seq_length": 1024, "global_batch_size": 1}})
    };
    let window = json!({"model": {"preset": "gpt-oss-20b", "window_size": 4096},
        "cluster": {"num_gpus": 8}, "training": {"seq_length": 2048, "global_batch_size": 8}});
    let fsdp = |fsdp: &str, zero: u8| {
        json!({"cluster": {"num_gpus": 8}, "parallel": {"fsdp": fsdp, "zero": zero},
            "training": {"global_batch_size": 8}})
    };
    let mut huge_chunk = hybrid("M*M-");
    huge_chunk["model"]["mamba"]["chunk_size"] = json!(1u64 << 53);
    for (doc, field, rule) in [
        (
            huge_chunk,
            "model.mamba.chunk_size",
            "must be at most 65536",
        ),
        (
            hybrid("M*M-M*"),
            "model.hybrid_layer_pattern",
            "has 6 layers, num_layers is 4",
        ),
        (
            hybrid("M*Q-"),
            "model.hybrid_layer_pattern",
            "unknown layer 'Q'",
        ),
        (window, "model.window_size", "larger than the sequence"),
        (fsdp("torch", 2), "parallel.zero", "zero must be 3"),
        (fsdp("jax", 3), "", "parallel.fsdp"),
    ] {
        let got = refusal(doc);
        assert!(
            got.iter().any(|(f, r)| f == field && r.contains(rule)),
            "{field} {rule}: {got:?}"
        );
    }
    let arch = json!({"architectures": ["MambaForCausalLM"], "hidden_size": 64});
    let err = parsim::config::hf::import(&arch, "config.json")
        .expect_err("unknown architecture")
        .to_string();
    assert!(
        err.contains("unsupported architecture `MambaForCausalLM`")
            && err.contains("NemotronHForCausalLM"),
        "{err}"
    );
    let err = parsim::config::megatron::import(
        "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --use-megatron-fsdp --data-parallel-sharding-strategy zero3",
        "args",
    )
    .expect_err("unknown strategy")
    .to_string();
    assert!(
        err.contains("--data-parallel-sharding-strategy: unknown 'zero3'"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Issue 30's inputs never panic, and the bad ones are refused by field: a zero NVLink
    /// domain (`cluster.nvlink_domain_size`), NVFP4 on a GPU without FP4 tensor cores
    /// (`training.precision`), an unknown FP8 recipe (`fp8_recipe`). Domains that are not
    /// whole nodes or do not divide the GPUs either resolve or name the domain field.
    #[test]
    fn blackwell_inputs_never_panic_and_are_refused_by_field(
        gpu in prop::sample::select(GpuProfile::shipped_names()),
        gpus in prop::sample::select(vec![4u32, 8, 64, 72, 144, 2048]),
        per_node in prop::sample::select(vec![1u32, 4, 8]),
        domain in prop::option::of(prop::sample::select(vec![0u32, 1, 4, 6, 8, 64, 72, 100, u32::MAX])),
        precision in prop::sample::select(vec!["bf16", "fp8", "mxfp8", "nvfp4"]),
        recipe in prop::option::of(prop::sample::select(vec!["delayed", "current", "blockwise", "hourly"])),
        tp in prop::sample::select(vec![1u32, 2, 4, 8]),
    ) {
        let mut v = json!({
            "model": {"preset": "llama3-8b"},
            "cluster": {"gpu": gpu, "num_gpus": gpus, "gpus_per_node": per_node},
            "parallel": {"tp": tp},
            "training": {"precision": precision, "seq_length": 4096, "global_batch_size": 4096}
        });
        if let Some(d) = domain {
            v["cluster"]["nvlink_domain_size"] = json!(d);
        }
        if let Some(rc) = recipe {
            v["training"]["fp8_recipe"] = json!(rc);
        }
        let outcome = Config::from_layers(&[Layer::overrides(v.clone())])
            .map_err(|e| e.to_string())
            .and_then(|cfg| Resolved::new(cfg).map_err(|e| e.to_string()));
        match outcome {
            Ok(r) => {
                let e = parsim::estimate::estimate(&r);
                prop_assert!(e.is_ok(), "{v}: {:?}", e.err());
                let e = e.unwrap();
                prop_assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0);
                prop_assert!(domain != Some(0), "{v}: a zero domain resolved");
                prop_assert!(recipe != Some("hourly"), "{v}: an unknown recipe resolved");
            }
            Err(msg) => {
                if domain == Some(0) {
                    // Another field may be refused first; a zero domain never passes silently.
                    prop_assert!(!msg.is_empty());
                }
                if recipe == Some("hourly") {
                    prop_assert!(msg.contains("fp8_recipe"), "{v}: {msg}");
                }
                if domain.is_some_and(|d| d != 0 && (gpus % d != 0 || d % per_node != 0))
                    && msg.contains("nvlink")
                {
                    prop_assert!(msg.contains("cluster.nvlink_domain_size"), "{v}: {msg}");
                }
            }
        }
    }
}

/// A zero NVLink domain and NVFP4 without FP4 tensor cores are each refused by their field
/// when they are the only fault.
#[test]
fn zero_domain_and_nvfp4_without_fp4_name_their_fields() {
    let refuse = |v: serde_json::Value| {
        let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("parses");
        Resolved::new(cfg).expect_err("refused").to_string()
    };
    let e = refuse(json!({"cluster": {"num_gpus": 8, "nvlink_domain_size": 0}}));
    assert!(e.contains("cluster.nvlink_domain_size"), "{e}");
    for gpu in ["h100-sxm", "a100-80g", "h200"] {
        let e = refuse(json!({"cluster": {"gpu": gpu, "num_gpus": 8},
                              "training": {"precision": "nvfp4"}}));
        assert!(e.contains("training.precision"), "{gpu}: {e}");
    }
}
