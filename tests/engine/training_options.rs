//! The training settings of NVIDIA's newer recipes (issue 31): the Muon optimizer, activation
//! offloading to the host, and Megatron-Core's selective `recompute_modules`. Values are
//! worked out by hand from the model's shapes; sources in each test.

use super::common::{est, resolve};
use parsim::config::{Config, Layer, Recompute, Resolved};
use parsim::model::muon::{MuonSums, NS_STEPS};
use parsim::model::{CommKind, Ledger, LedgerSummary};
use serde_json::{json, Value};

/// A 2-layer dense model (hidden 64, 8 heads of 8 in 4 groups, SwiGLU 128, vocabulary 128,
/// untied, no biases) on one H100, ZeRO-0.
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

/// The error a configuration is refused with.
fn refused(overlay: Value) -> String {
    Config::from_layers(&[Layer::overrides(overlay)])
        .and_then(Resolved::new)
        .expect_err("refused")
        .to_string()
}

#[test]
fn muon_holds_one_momentum_on_the_matrices_and_adam_on_the_rest() {
    // Per layer: QKV 64 x (64 + 2 x 32) = 8192, projection 64 x 64 = 4096, SwiGLU fc1
    // 64 x 256 = 16384, fc2 128 x 64 = 8192 (36864 matrix elements) and two RMSNorms of 64.
    // Outside the layers: embedding and output layer 128 x 64 each, the final norm 64.
    let matrices = 2 * 36864u64;
    let total = 2 * (36864 + 128) + 2 * 8192 + 64;
    let adam = est(tiny(json!({})));
    assert_eq!(adam.params.total, total);
    assert_eq!(adam.memory.stages[0].optimizer, total * 12);
    // Muon (megatron/core/optimizer/muon.py): the matrices keep an fp32 master copy and one
    // fp32 momentum buffer (8 bytes), the embeddings, output layer and norms Adam's 12.
    let muon = est(tiny(json!({"optimizer": "muon"})));
    assert_eq!(
        muon.memory.stages[0].optimizer,
        matrices * 8 + (total - matrices) * 12
    );
    // Weights and gradients are unchanged.
    assert_eq!(muon.memory.stages[0].weights, adam.memory.stages[0].weights);
    assert_eq!(
        muon.memory.stages[0].gradients,
        adam.memory.stages[0].gradients
    );
    // The step: the matrices stream 22 bytes instead of Adam's 30 (one moment read and
    // written less, 8 bytes, at the profile's memory-bound rate), and the Newton-Schulz
    // iterations (111411200 FLOPs, below) run at the bf16 GEMM rate.
    let gpu = parsim::config::GpuProfile::load("h100-sxm").unwrap();
    let gemm = gpu.peak_flops.bf16 * gpu.matmul_efficiency_for(parsim::config::Precision::Bf16);
    let hbm = gpu.hbm_bytes_per_s * gpu.efficiency.memory_bound;
    let expected = 111411200.0 / gemm - (matrices * 8) as f64 / hbm;
    let got = muon.time.optimizer_s - adam.time.optimizer_s;
    assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
}

#[test]
fn newton_schulz_flops_are_three_matmuls_an_iteration_on_each_matrix() {
    // One iteration on an m x n matrix (m <= n): X X^T 2m^2 n, A A 2m^3, B X 2m^2 n. Split
    // QKV (muon_split_qkv): Q 64 x 64 (6 x 64^3 = 1572864), K and V 32 x 64 each
    // (4 x 32^2 x 64 + 2 x 32^3 = 327680); projection 64 x 64 (1572864); fc1 64 x 256
    // (4 x 64^2 x 256 + 2 x 64^3 = 4718592); fc2 64 x 128 (2097152 + 524288 = 2621440).
    let per_iteration = 1572864.0 + 2.0 * 327680.0 + 1572864.0 + 4718592.0 + 2621440.0;
    let r = resolve(tiny(json!({"optimizer": "muon"})));
    let l = Ledger::build(&r);
    let m = MuonSums::of(&l.dense, l.dims.a, l.dims.g);
    assert_eq!(m.ns_flops, per_iteration * NS_STEPS as f64);
    assert_eq!((m.dense, m.expert), (36864, 0));
    // The output layer is Adam's: no matrix of it goes to Muon.
    assert_eq!(MuonSums::of(&l.output, l.dims.a, l.dims.g).dense, 0);
}

/// Muon under Megatron-Core's layer-wise distributed optimizer (`dist_muon`: ZeRO-1) on 2
/// data-parallel ranks. The rank's 15 parameter tensors sorted by size (ties in model order):
/// five norms of 64 (Adam), the two projections 4096 (Muon), the embedding 8192 (Adam), QKV
/// and fc2 of each layer 8192 (Muon), the output layer 8192 (Adam), the two fc1 16384 (Muon).
/// `_shard_params_ping_pong` deals them to ranks 0, 1, 1, 0, 0, 1, 1, 0, ...: rank 1 gets two
/// norms, both projections, layer 1's fc2 and layer 2's QKV and both fc1, 128 x 12 + (8192 +
/// 16384 + 32768) x 8 = 460288 bytes, rank 0 the rest, 16576 x 12 + 16384 x 8 = 329984. The
/// weights and gradients stay whole.
#[test]
fn dist_muon_shards_whole_parameters_ping_pong_over_data_parallelism() {
    let mut c = tiny(json!({"optimizer": "muon", "global_batch_size": 2}));
    c["cluster"]["num_gpus"] = json!(2);
    let whole = est(c.clone());
    c["parallel"]["zero"] = json!(1);
    let dist = est(c);
    assert_eq!(dist.memory.stages[0].optimizer, 460288);
    let matrices = 2 * 36864u64;
    let total = whole.params.total;
    assert_eq!(
        whole.memory.stages[0].optimizer,
        matrices * 8 + (total - matrices) * 12
    );
    assert_eq!(
        dist.memory.stages[0].weights,
        whole.memory.stages[0].weights
    );
    assert_eq!(
        dist.memory.stages[0].gradients,
        whole.memory.stages[0].gradients
    );
}

#[test]
fn muon_refuses_what_megatron_refuses() {
    let mut c = tiny(json!({"optimizer": "muon"}));
    c["parallel"]["zero"] = json!(2);
    let e = refused(c);
    assert!(
        e.contains("training.optimizer") && e.contains("layer-wise distributed optimizer"),
        "{e}"
    );
    let e = refused(tiny(json!({"optimizer": "sgd"})));
    assert!(e.contains("training.optimizer") && e.contains("sgd"), "{e}");
}

/// A 2-layer MoE model (8 experts, top-2, expert FFN 64) over EP 2 on 2 H100s.
fn tiny_moe(training: Value) -> Resolved {
    let mut c = tiny(training);
    c["model"]["num_experts"] = json!(8);
    c["model"]["moe_router_topk"] = json!(2);
    c["model"]["moe_ffn_hidden_size"] = json!(64);
    c["cluster"]["num_gpus"] = json!(2);
    c["parallel"]["ep"] = json!(2);
    c["training"]["global_batch_size"] = json!(2);
    resolve(c)
}

fn moe_summary(training: Value) -> (Ledger, LedgerSummary) {
    let r = tiny_moe(training);
    let l = Ledger::build(&r);
    let s = LedgerSummary::of(&l, r.config.training.recompute);
    (l, s)
}

#[test]
fn recompute_modules_drop_the_tensors_megatron_discards() {
    let (l0, s0) = moe_summary(json!({}));
    let base = s0.moe.unwrap();
    // moe_act: the experts' activation output (fc2's saved input, rows x 64 in bf16) is
    // discarded and rebuilt (Megatron-Core's output-discarding checkpoint of the activation).
    let rows = l0
        .moe
        .as_ref()
        .unwrap()
        .ops
        .iter()
        .find_map(|o| match (o.name, o.kind) {
            ("moe.experts.fc2", parsim::model::OpKind::Matmul { m, .. }) => Some(m),
            _ => None,
        })
        .unwrap();
    let (_, s) = moe_summary(json!({"recompute_modules": ["core_attn", "moe_act"]}));
    assert_eq!(base.saved - s.moe.unwrap().saved, rows * 64 * 2);
    // layernorm: the MoE layer's pre-MLP norm output (the router's input, 32 tokens x 64 in
    // bf16) is rebuilt; the dense layer's norms are fused into the next linear layer by
    // Transformer Engine, so its saved set is unchanged.
    let (_, s) = moe_summary(json!({"recompute_modules": ["core_attn", "layernorm"]}));
    assert_eq!(base.saved - s.moe.unwrap().saved, 32 * 64 * 2);
    assert_eq!(s.dense.saved, s0.dense.saved);
    // An empty list recomputes nothing: the attention core's log-sum-exp stays.
    let (_, s) = moe_summary(json!({"recompute_modules": []}));
    let none = LedgerSummary::of(&l0, Recompute::None);
    assert_eq!(s.dense.saved, none.dense.saved);
    assert_eq!(s.dense.recompute_rank, 0.0);
}

#[test]
fn the_mlp_module_reruns_the_dense_mlp_forward() {
    // 32 tokens: fc1 2 x 32 x 64 x 256 = 1048576 FLOPs, fc2 2 x 32 x 128 x 64 = 524288; the
    // norm and SwiGLU are memory-bound (no FLOPs). Without core_attn the core is not rerun.
    let r = resolve(tiny(json!({"recompute_modules": ["mlp"]})));
    let s = LedgerSummary::of(&Ledger::build(&r), Recompute::Selective);
    assert_eq!(s.dense.recompute_rank, 1048576.0 + 524288.0);
    // Its saved tensors are dropped: only the residual (the norm's input, the checkpoint's
    // input) of the MLP half stays, 32 x 64 x 2 bytes.
    let all = resolve(tiny(json!({"recompute": "none"})));
    let l = Ledger::build(&all);
    let mlp_saved: u64 = l
        .dense
        .ops
        .iter()
        .filter(|o| o.name.starts_with("mlp.") && o.name != "mlp.dropout")
        .flat_map(|o| &o.saved)
        .map(|t| t.bytes)
        .sum();
    let none = LedgerSummary::of(&l, Recompute::None);
    assert_eq!(none.dense.saved - s.dense.saved, mlp_saved - 32 * 64 * 2);
}

#[test]
fn recompute_modules_are_refused_without_selective_or_unknown() {
    let e = refused(tiny(
        json!({"recompute": "full", "recompute_modules": ["mlp"]}),
    ));
    assert!(
        e.contains("training.recompute_modules") && e.contains("selective"),
        "{e}"
    );
    let e = refused(tiny(json!({"recompute_modules": ["attention"]})));
    assert!(
        e.contains("recompute_modules") && e.contains("attention"),
        "{e}"
    );
    let e = refused(tiny(json!({"recompute_modules": ["moe_act"]})));
    assert!(e.contains("MoE layers"), "{e}");
}

#[test]
fn offloaded_layers_leave_the_gpu_for_the_host() {
    // 8 layers, 3 offloaded (5 follow, so none is in flight at the peak): the activation peak
    // drops by 3 layers' saved sets, which the host holds. A long sequence (8192) makes each
    // layer's saved set (megabytes) outlast its small GEMMs over PCIe; CUDA graphs keep the
    // small model from waiting on the host, which would hide the copies behind the wait.
    let cfg = |n: u32| {
        let mut c = tiny(json!({"recompute": "none", "offload_activation_layers": n,
                                "seq_length": 8192, "cuda_graphs": true}));
        c["model"]["num_layers"] = json!(8);
        c
    };
    let r = resolve(cfg(0));
    let layer = LedgerSummary::of(&Ledger::build(&r), Recompute::None)
        .dense
        .saved;
    let on = est(cfg(3));
    let off = est(cfg(0));
    let (a, b) = (&off.memory.stages[0], &on.memory.stages[0]);
    assert_eq!(a.activations - b.activations, 3 * layer);
    assert_eq!(b.host_offload, 3 * layer);
    assert_eq!(a.host_offload, 0);
    // The copies over PCIe outlast the layers they overlap: exposed, so the step is slower.
    assert!(on.time.exposed_comm_by_group_s[CommKind::Host] > 0.0);
    assert!(on.time.step_s > off.time.step_s);
}

#[test]
fn offloading_is_refused_by_field() {
    let e = refused(tiny(
        json!({"recompute": "none", "offload_activation_layers": 2}),
    ));
    assert!(
        e.contains("training.offload_activation_layers")
            && e.contains("below model.num_layers (2)"),
        "{e}"
    );
    let e = refused(tiny(json!({"offload_activation_layers": 1})));
    assert!(e.contains("recompute"), "{e}");
}

#[test]
fn megatron_flags_carry_the_settings_and_refuse_the_rest() {
    use parsim::config::megatron::import;
    let args = "pretrain_gpt.py --optimizer muon --recompute-granularity selective \
                --recompute-modules layernorm moe_act --cpu-offloading-num-layers 3";
    let imp = import(args, "test").expect("imports");
    let t = &imp.layer["training"];
    assert_eq!(t["optimizer"], json!("muon"));
    assert_eq!(t["recompute_modules"], json!(["layernorm", "moe_act"]));
    // Without --cpu-offloading the layer count offloads nothing (a note says so).
    assert!(t.get("offload_activation_layers").is_none());
    assert!(
        imp.notes.iter().any(|n| n.contains("--cpu-offloading")),
        "{:?}",
        imp.notes
    );
    let imp = import(
        "pretrain_gpt.py --cpu-offloading --cpu-offloading-num-layers 3",
        "test",
    )
    .expect("imports");
    assert_eq!(imp.layer["training"]["offload_activation_layers"], json!(3));
    // dist_muon: Muon under the layer-wise distributed optimizer, ZeRO-1.
    let imp = import("pretrain_gpt.py --optimizer dist_muon", "test").expect("imports");
    assert_eq!(imp.layer["training"]["optimizer"], json!("muon"));
    assert_eq!(imp.layer["parallel"]["zero"], json!(1));
    for (args, flag) in [
        ("pretrain_gpt.py --optimizer sgd", "--optimizer"),
        (
            "pretrain_gpt.py --optimizer muon --muon-tp-mode duplicated",
            "--muon-tp-mode",
        ),
        (
            "pretrain_gpt.py --recompute-granularity selective --recompute-modules foo",
            "--recompute-modules",
        ),
        (
            "pretrain_gpt.py --cpu-offloading --cpu-offloading-weights",
            "--cpu-offloading-weights",
        ),
    ] {
        let e = import(args, "test").unwrap_err().to_string();
        assert!(e.contains(flag), "{args}: {e}");
    }
}

#[test]
fn the_executor_refuses_what_it_does_not_run() {
    use parsim::lower::{lower, LowerError, LowerOptions};
    for (training, field) in [
        (json!({"optimizer": "muon"}), "training.optimizer"),
        (
            json!({"recompute_modules": ["mlp"]}),
            "training.recompute_modules",
        ),
        (
            json!({"recompute": "none", "offload_activation_layers": 1}),
            "training.offload_activation_layers",
        ),
    ] {
        let mut c = tiny(training);
        c["cluster"]["gpu"] = json!(if field.contains("offload") {
            "h100-sxm"
        } else {
            "cpu"
        });
        let r = resolve(c);
        match lower(&r, &LowerOptions::default()) {
            Err(LowerError::Unsupported { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {:?}", other.map(|_| ())),
        }
    }
}
