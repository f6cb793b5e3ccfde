//! ZeRO-3 and FSDP data-parallel collectives call by call (src/dp_calls.rs): the calls of a
//! microbatch derived by hand from DeepSpeed's and FSDP's documented bucket semantics, the
//! estimate's DP time as the sum of NCCL's time for each call (summed here from the network
//! model's public API), and per-GPU throughput falling with the GPU count at thousands of ranks.

use super::common::{est, resolve};
use parsim::dp_calls::microbatch_calls;
use parsim::layout::Layout;
use parsim::model::{
    chunks_per_rank, Collective, CollectiveKind, CommKind, Ledger, LedgerSummary, Phase,
};
use parsim::network::Network;
use serde_json::{json, Value};

/// The 2-layer model of tests/engine/fsdp.rs (hidden 64, 4 heads, SwiGLU FFN 256, vocabulary
/// 64, untied) on 4 GPUs of one node, pure data parallelism, bf16 weights, fp32 gradients,
/// 2 microbatches, ZeRO-3, every overlap off so that each call is exposed whole.
fn small(framework: &str, parallel: Value) -> Value {
    let mut v = json!({
        "model": {"name": "small", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_query_groups": 4, "ffn_hidden_size": 256, "vocab_size": 64,
            "max_position_embeddings": 1024},
        "cluster": {"num_gpus": 4, "gpus_per_node": 4},
        "parallel": {"tp": 1, "sp": false, "zero": 3, "overlap_grad_reduce": false,
            "overlap_param_gather": false},
        "training": {"framework": framework, "seq_length": 128, "global_batch_size": 8,
            "micro_batch_size": 1}
    });
    for (k, x) in parallel.as_object().unwrap() {
        v["parallel"][k] = x.clone();
    }
    v
}

// By hand, the modules of the small model on a rank (TP 1), in forward order: the embedding
// 64 x 64 = 4,096; per layer the input norm 64, the fused QKV 64 x 192 = 12,288, the output
// projection 4,096, the pre-MLP norm 64, FC1 (gate and up) 64 x 512 = 32,768, FC2
// 256 x 64 = 16,384 (65,664 a layer); the final norm 64 and the output layer 4,096.
const EMB: u64 = 4_096;
const LAYER: u64 = 65_664;
const ROOT: u64 = EMB + 64 + 4_096;

/// One microbatch's calls through the one chunk: (kind, phase, elements) with bf16 weights
/// (2 bytes) and fp32 gradients (4 bytes) turned back into elements, and the calls.
fn calls(v: Value) -> (Vec<(CollectiveKind, Phase, u64)>, Vec<Collective>) {
    let r = resolve(v);
    let l = Ledger::build(&r);
    let s = LedgerSummary::of(&l, r.config.training.recompute);
    let ch = &chunks_per_rank(&r)[0];
    assert_eq!(ch.len(), 1);
    let m = microbatch_calls(&r, &l, &s, &ch[0]).expect("framework calls");
    let listed = m
        .calls
        .iter()
        .map(|c| {
            assert_eq!((c.group_size, c.count), (4, 1));
            let per = if c.kind == CollectiveKind::AllGather {
                2
            } else {
                4
            };
            (c.kind, c.phase, c.payload_bytes / per)
        })
        .collect();
    (listed, m.calls)
}

fn of(calls: &[(CollectiveKind, Phase, u64)], kind: CollectiveKind, phase: Phase) -> Vec<u64> {
    calls
        .iter()
        .filter(|c| c.0 == kind && c.1 == phase)
        .map(|c| c.2)
        .collect()
}

use CollectiveKind::{AllGather, ReduceScatter};
use Phase::{Backward, Forward};

/// DeepSpeed ZeRO-3, derived by hand from deepspeed/runtime/zero (microsoft/DeepSpeed,
/// read at 38327e0):
/// - partitioned_param_coordinator.py, `PartitionedParameterCoordinator.fetch_sub_module`:
///   at each module's hook, its parameters not yet available are gathered in one
///   `all_gather_coalesced` call; then the trace queue is popped while the prefetched elements
///   are below min(`stage3_prefetch_bucket_size`, max live - available), the popped parameters
///   still partitioned forming one more call.
/// - partition_parameters.py, `Init._convert_to_deepspeed_param`: `ds_persist` for parameters
///   of at most `stage3_param_persistence_threshold` elements (never partitioned, never
///   gathered).
/// - stage3.py, `reduce_independent_p_g_buckets_and_remove_grads`: the gradient bucket is
///   reduce-scattered before a gradient that would overflow `reduce_bucket_size`.
///
/// With the threshold at 100 (the five norms of 64 persist) and a prefetch bucket of 20,000,
/// forward: the embedding's hook gathers it (4,096) and prefetches QKV + proj + FC1 (12,288 +
/// 4,096 + 32,768 = 49,152, the first sum to reach 20,000); the first norm's hook prefetches
/// FC2 + the next QKV (16,384 + 12,288 = 28,672); the QKV's, proj + FC1 (36,864); the proj's,
/// FC2 + the output layer (20,480). Backward runs the same over the reversed modules: 4,096;
/// FC2 + FC1 = 49,152; proj + QKV + FC2 = 32,768; FC1 = 32,768; proj + QKV + embedding =
/// 20,480. Reduce buckets of 40,000 over the reversed gradients (norms included):
/// 4,096 + 64 + 16,384 = 20,544 (FC1 would overflow); 32,768 + 64 + 4,096 = 36,928; 12,288 +
/// 64 + 16,384 = 28,736; 36,928; 12,288 + 64 + 4,096 = 16,448.
#[test]
fn deepspeed_zero3_calls_follow_its_prefetch_and_reduce_buckets() {
    let v = small(
        "deepspeed",
        json!({"zero3_prefetch_bucket_size": 20_000, "zero3_param_persistence_threshold": 100,
            "ddp_bucket_size": 40_000}),
    );
    let (c, _) = calls(v);
    assert_eq!(
        of(&c, AllGather, Forward),
        [4_096, 49_152, 28_672, 36_864, 20_480]
    );
    assert_eq!(
        of(&c, AllGather, Backward),
        [4_096, 49_152, 32_768, 32_768, 20_480]
    );
    assert_eq!(
        of(&c, ReduceScatter, Backward),
        [20_544, 36_928, 28_736, 36_928, 16_448]
    );
    // Every gathered element once per pass: all but the five norms.
    let gathered: u64 = of(&c, AllGather, Forward).iter().sum();
    assert_eq!(gathered, 2 * LAYER + EMB + 4_096 + 64 - 5 * 64);
    // No prefetch (bucket 0): one call per partitioned module at its own hook (embedding,
    // 4 per layer, output).
    let (c, _) = calls(small(
        "deepspeed",
        json!({"zero3_prefetch_bucket_size": 0, "zero3_param_persistence_threshold": 100}),
    ));
    assert_eq!(
        of(&c, AllGather, Forward),
        [4_096, 12_288, 4_096, 32_768, 16_384, 12_288, 4_096, 32_768, 16_384, 4_096]
    );
    // DeepSpeed's defaults: every module of this model is at most 1e5 elements, so nothing
    // is gathered; the 5e8 reduce bucket takes the whole model in one call.
    let (c, _) = calls(small("deepspeed", json!({})));
    assert!(of(&c, AllGather, Forward).is_empty());
    assert_eq!(of(&c, ReduceScatter, Backward), [2 * LAYER + ROOT]);
}

/// PyTorch FSDP (docs.pytorch.org/docs/stable/notes/fsdp.html; FSDP2's `fully_shard`): one
/// all-gather per wrapped unit before its forward and again before its backward
/// (`reshard_after_forward`), one reduce-scatter per unit after its backward; the root module
/// (embedding, final norm, output layer) is not resharded after forward, so it is gathered
/// once and reduce-scattered last: units x 3 - 1 calls. Megatron-FSDP (src/config/fsdp.rs):
/// every block its own unit, each gathered in forward and backward: 4 x 3 = 12 calls.
#[test]
fn fsdp_calls_are_one_gather_per_pass_and_one_reduce_scatter_per_unit() {
    for v in [
        small("fsdp", json!({})),
        small("megatron-core", json!({"fsdp": "torch"})),
    ] {
        let (c, _) = calls(v);
        assert_eq!(of(&c, AllGather, Forward), [ROOT, LAYER, LAYER]);
        assert_eq!(of(&c, AllGather, Backward), [LAYER, LAYER]);
        assert_eq!(of(&c, ReduceScatter, Backward), [LAYER, LAYER, ROOT]);
        assert_eq!(c.len(), 3 * 3 - 1);
    }
    let (c, _) = calls(small("megatron-core", json!({"fsdp": "megatron"})));
    let output = ROOT - EMB;
    assert_eq!(of(&c, AllGather, Forward), [EMB, LAYER, LAYER, output]);
    assert_eq!(of(&c, AllGather, Backward), [output, LAYER, LAYER, EMB]);
    assert_eq!(of(&c, ReduceScatter, Backward), [output, LAYER, LAYER, EMB]);
    // ZeRO-2 (optim_grads): gradients per unit, no per-microbatch gathers.
    let mut v = small("megatron-core", json!({"fsdp": "megatron"}));
    v["parallel"]["zero"] = json!(2);
    let (c, _) = calls(v);
    assert_eq!(c.len(), 4);
    assert!(c.iter().all(|x| x.0 == ReduceScatter));
}

/// With every overlap off, each microbatch's DP time is its calls' NCCL times summed (the
/// network model's `collective_s` at each call's own size over the 4 ranks), each reduction
/// charged in the backward that issues it and nothing left after the last one: the
/// estimate's exposed DP seconds are 2 microbatches x (gathers + reductions).
#[test]
fn dp_time_is_the_sum_of_each_calls_nccl_time() {
    for v in [
        small(
            "deepspeed",
            json!({"zero3_prefetch_bucket_size": 20_000, "zero3_param_persistence_threshold": 100,
                "ddp_bucket_size": 40_000}),
        ),
        small("fsdp", json!({})),
        small("megatron-core", json!({"fsdp": "megatron"})),
    ] {
        let r = resolve(v.clone());
        let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, 1, 4, 1, 4).expect("layout");
        let net = Network::new(&layout, &r.gpu);
        let (_, list) = calls(v.clone());
        let t = |c: &Collective| net.collective_s(c.group, c.kind, c.payload_bytes, 4);
        let gathers: f64 = list.iter().filter(|c| c.kind == AllGather).map(t).sum();
        let reduce: f64 = list.iter().filter(|c| c.kind != AllGather).map(t).sum();
        assert!(gathers > 0.0 && reduce > 0.0);
        let e = est(v);
        let want = r.microbatches as f64 * (gathers + reduce);
        let got = e.time.exposed_comm_by_group_s[CommKind::Dp];
        assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
    }
}

/// Per-GPU throughput of DeepSpeed ZeRO-3 falls as the data-parallel group grows from 512 to
/// 8,192 GPUs at a fixed batch per GPU: each call moves the same bytes per GPU whatever the
/// count, but NCCL's latency of a call grows with the ranks and the nodes it spans.
#[test]
fn zero3_per_gpu_throughput_falls_with_the_gpu_count() {
    let mut last = f64::INFINITY;
    for gpus in [512u64, 1024, 2048, 4096, 8192] {
        let e = est(json!({
            "model": {"preset": "llama3-8b"},
            "cluster": {"num_gpus": gpus},
            "parallel": {"tp": 1, "sp": false, "zero": 3},
            "training": {"framework": "deepspeed", "seq_length": 2048, "micro_batch_size": 1,
                "global_batch_size": gpus},
        }));
        let per_gpu = e.throughput.tokens_per_s / gpus as f64;
        assert!(per_gpu < last, "{gpus} GPUs: {per_gpu} vs {last}");
        last = per_gpu;
    }
}
