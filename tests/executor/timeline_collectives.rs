//! `execute --trace` records every collective the model calls, not only the data-parallel
//! ones: for TP 2 + SP x PP 2, CP 2 (ring, all-gather, Ulysses) and an EP 2 MoE mix on the CPU
//! backend, with counts and bytes derived from the model shape.

use super::common::{config, plan, Mix};
use super::moe::{moe_config, BASE};
use parsim::config::{Config, Layer, Resolved};
use parsim::lower::{lower, LowerOptions};
use parsim::model::CommKind;
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_executor::trace::Clock;
use parsim_plan::plan::{Action, Plan};
use parsim_plan::trace::{EventKind, RankTrace, Stream};
use parsim_plan::GroupKind;
use std::collections::BTreeMap;

fn traced(plan: &Plan) -> Vec<RankTrace> {
    let r = run_cpu(
        plan,
        &RunOptions {
            steps: 2,
            warmup: 1,
            trace: Some(Clock::new()),
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"));
    r.traces.expect("traces")
}

fn kind(a: &Action) -> &'static str {
    match a {
        Action::Forward { .. } => "F",
        Action::Backward { .. } | Action::BackwardInput { .. } => "B",
        Action::BackwardWeight { .. } => "W",
        Action::OptimizerStep => "O",
        _ => "P",
    }
}

/// Per (action kind, op, group, bytes): collectives recorded in the timed step, each inside
/// the span of the action that called it.
fn census(t: &RankTrace) -> BTreeMap<(&'static str, String, Vec<u32>, u64), usize> {
    let mut out = BTreeMap::new();
    let actions: Vec<_> = t
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Action { action, .. } => Some((kind(action), e.start_s, e.end_s)),
            _ => None,
        })
        .collect();
    for e in &t.events {
        let EventKind::Collective { op, group, bytes } = &e.kind else {
            continue;
        };
        assert_eq!(e.stream, Stream::Collectives);
        // Nested in the span of the action that called it.
        let (k, ..) = actions
            .iter()
            .find(|(_, s, f)| e.start_s >= *s - 1e-9 && e.end_s <= *f + 1e-9)
            .copied()
            .unwrap_or_else(|| panic!("{e:?} is inside no action"));
        *out.entry((k, op.to_string(), group.clone(), *bytes))
            .or_insert(0) += 1;
    }
    out
}

type Census = BTreeMap<(&'static str, String, Vec<u32>, u64), usize>;

fn count(c: &Census, k: &'static str, op: &str, group: &[u32], bytes: u64) -> usize {
    c.get(&(k, op.to_string(), group.to_vec(), bytes))
        .copied()
        .unwrap_or(0)
}

/// One compute action at a time, and the actions plus receive waits make the step (within
/// 2%): the collectives (and the CP ring's attention blocks) nest inside actions and add no
/// time of their own.
fn check_timeline(t: &RankTrace, rank: usize) {
    let mut compute: Vec<(f64, f64)> = t
        .events
        .iter()
        .filter(|e| e.stream == Stream::Compute)
        .map(|e| (e.start_s, e.end_s))
        .collect();
    compute.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in compute.windows(2) {
        assert!(
            w[1].0 >= w[0].1 - 1e-9,
            "rank {rank}: compute overlap {w:?}"
        );
    }
    let (s0, s1) = t.steps[0];
    let sum_s: f64 = t
        .events
        .iter()
        .filter(|e| matches!(e.stream, Stream::Compute | Stream::Pipeline))
        .map(|e| e.duration_s())
        .sum();
    let step_s = s1 - s0;
    assert!(
        (sum_s - step_s).abs() <= 0.02 * step_s,
        "rank {rank}: actions + waits {sum_s} s vs step {step_s} s"
    );
}

/// TP 2 with SP over PP 2 (4 layers a stage, 2 microbatches): Megatron-LM's SP recipe
/// (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
/// sec. 4.2.2) per layer and microbatch: forward 2 all-gathers (before QKV and FC1) and 2
/// reduce-scatters (after the projection and FC2) of n x h activations; backward the mirror
/// (2 reduce-scatters, 2 all-gathers) plus 2 all-gathers of the inputs again for the weight
/// gradients. The embedding (first stage) reduce-scatters its output, the output layer (last
/// stage) all-gathers its input (and again in backward), and the vocab-parallel cross-entropy
/// all-reduces 3 n-vectors (max, sum of exponentials, target logit). The optimizer sums the
/// norm weights' gradients (2 a layer, 1 final norm) over TP.
#[test]
fn timeline_records_tp_sp_collectives_of_the_model() {
    let mix = Mix {
        tp: 2,
        sp: true,
        pp: 2,
        recompute: "none",
        ..Mix::single()
    };
    let p = plan(config(&mix, 2, true, "rmsnorm", "swiglu"));
    let traces = traced(&p);
    let (n, h, layers, mbs) = (32u64, 64u64, 4usize, 2usize);
    let act_bytes = n * h * 4;
    for (rp, t) in p.ranks.iter().zip(&traces) {
        check_timeline(t, rp.rank as usize);
        let c = census(t);
        let first = usize::from(rp.stages.contains(&0));
        let last = usize::from(rp.stages.contains(&1));
        let g = rp.groups.get(GroupKind::Tp);
        assert_eq!(g.len(), 2);
        let expect = [
            ("F", "all_gather", act_bytes, mbs * (2 * layers + last)),
            ("F", "reduce_scatter", act_bytes, mbs * (2 * layers + first)),
            ("F", "all_reduce", n * 4, mbs * 3 * last),
            ("B", "reduce_scatter", act_bytes, mbs * (2 * layers + last)),
            (
                "B",
                "all_gather",
                act_bytes,
                mbs * (4 * layers + first + last),
            ),
            ("O", "all_reduce", h * 4, 2 * layers + last),
        ];
        for (k, op, bytes, want) in expect {
            assert_eq!(
                count(&c, k, op, g, bytes),
                want,
                "rank {}: {k} {op} of {bytes} bytes in {c:?}",
                rp.rank
            );
        }
        let total: usize = expect.iter().map(|e| e.3).sum();
        assert_eq!(c.values().sum::<usize>(), total, "rank {}: {c:?}", rp.rank);
    }
}

/// CP 2 with the ring (p2p) exchange, 8 layers, 2 microbatches: per layer and microbatch the
/// forward sends this rank's K and V blocks to its ring neighbour and receives the other's
/// (cp - 1 = 1 step, Liu et al., "Ring Attention"), the backward sends and receives K, V
/// and their gradients dK, dV; a block is n/cp x kv_heads x d fp32.
#[test]
fn timeline_records_cp_ring_messages() {
    let mix = Mix {
        cp: 2,
        ..Mix::single()
    };
    let p = plan(config(&mix, 2, true, "rmsnorm", "swiglu"));
    let traces = traced(&p);
    let (layers, mbs) = (8usize, 2usize);
    let block_bytes = 32 / 2 * 4 * (64 / 8) * 4;
    for (rp, t) in p.ranks.iter().zip(&traces) {
        check_timeline(t, rp.rank as usize);
        let c = census(t);
        let me = rp.rank;
        let peer = *rp
            .groups
            .get(GroupKind::Cp)
            .iter()
            .find(|&&r| r != me)
            .unwrap();
        for (k, per_layer) in [("F", 2), ("B", 4)] {
            assert_eq!(
                count(&c, k, "p2p_send", &[me, peer], block_bytes),
                mbs * layers * per_layer
            );
            assert_eq!(
                count(&c, k, "p2p_recv", &[peer, me], block_bytes),
                mbs * layers * per_layer
            );
        }
        // The gradient all-reduce over DP x CP (where CP ranks hold replicas): one bucket (the
        // default 40M parameters), in the last backward as Megatron-Core's overlapped
        // reduction issues it; nothing left for the optimizer step.
        assert_eq!(c.iter().filter(|(k, _)| k.0 == "O").count(), 0, "{c:?}");
        let dp: Vec<_> = c
            .iter()
            .filter(|(k, _)| k.1 == "all_reduce" && k.2 == rp.groups.get(GroupKind::DpCp))
            .collect();
        assert_eq!(dp.len(), 1, "{c:?}");
        assert_eq!((dp[0].0 .0, *dp[0].1), ("B", 1), "{c:?}");
        assert_eq!(c.values().sum::<usize>(), 6 * mbs * layers * 2 + 1, "{c:?}");
    }
}

/// The CP ring overlaps each exchange with attention (TransformerEngine's
/// `AttnFuncWithCPAndKVP2P` order): a step posts the next block's K/V exchange before it
/// computes, and the dK/dV accumulator's exchange before the next block's computation. So in
/// the recorded spans every ring receive starts before the attention block computed last
/// before it ends, except the one exchange per layer and microbatch with nothing left to
/// compute under it (the rank's own dK/dV coming home after the last step). The messages are
/// those of the unoverlapped ring: per layer and microbatch cp - 1 steps of K and V forward,
/// and of K, V, dK, dV backward, each block n/cp x kv_heads x d fp32.
#[test]
fn timeline_cp_ring_posts_each_exchange_before_the_attention_it_overlaps() {
    let (layers, mbs) = (8usize, 2usize);
    for (cp, comm) in [(2u32, "p2p"), (4, "p2p"), (4, "zigzag")] {
        let mix = Mix {
            cp,
            cp_comm: comm,
            ..Mix::single()
        };
        let p = plan(config(&mix, 2, true, "rmsnorm", "swiglu"));
        let traces = traced(&p);
        let block_bytes = 32 / cp as u64 * 4 * (64 / 8) * 4;
        let steps = cp as usize - 1;
        for (rp, t) in p.ranks.iter().zip(&traces) {
            check_timeline(t, rp.rank as usize);
            let c = census(t);
            let me = rp.rank;
            let i = rp
                .groups
                .get(GroupKind::Cp)
                .iter()
                .position(|&r| r == me)
                .unwrap();
            let next = rp.groups.get(GroupKind::Cp)[(i + 1) % cp as usize];
            let prev = rp.groups.get(GroupKind::Cp)[(i + cp as usize - 1) % cp as usize];
            for (k, per_step) in [("F", 2), ("B", 4)] {
                let want = mbs * layers * steps * per_step;
                let sends = count(&c, k, "p2p_send", &[me, next], block_bytes);
                let recvs = count(&c, k, "p2p_recv", &[prev, me], block_bytes);
                assert_eq!((sends, recvs), (want, want), "cp {cp} {comm} {k}: {c:?}");
            }
            let blocks: Vec<(f64, f64)> = t
                .events
                .iter()
                .filter(|e| e.stream == Stream::Kernels)
                .map(|e| (e.start_s, e.end_s))
                .collect();
            // Forward blocks cp a layer and microbatch, backward cp (no recomputation).
            assert_eq!(
                blocks.len(),
                2 * mbs * layers * cp as usize,
                "cp {cp} {comm}"
            );
            let mut late = 0;
            for r in t.events.iter().filter(|e| match &e.kind {
                EventKind::Collective { op, .. } => op == "p2p_recv",
                _ => false,
            }) {
                let before = blocks
                    .iter()
                    .filter(|b| b.1 <= r.end_s + 1e-9)
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .expect("a block before each receive");
                if before.0 < r.start_s - 1e-9 {
                    late += 1;
                }
            }
            // The home dK and dV messages of each layer and microbatch.
            assert_eq!(late, 2 * mbs * layers, "cp {cp} {comm} rank {me}");
        }
    }
}

/// EP 2 x DP 2, 4 MoE layers of 8 experts, top-2, no capacity limit, 4 microbatches per
/// rank: per layer and microbatch the forward exchanges the split sizes (8 counts) and runs
/// two all-to-all-v (dispatch, combine), the backward their two mirrors. Dispatch sends every
/// assignment, n x top-k rows of h fp32; the combine returns what the rank's experts got, so
/// over the EP group the bytes sent by combines equal those sent by dispatches.
#[test]
fn timeline_records_moe_all_to_all() {
    let mut m = BASE;
    m.ep = 2;
    m.dp = 2;
    let p = plan(moe_config(&m));
    let traces = traced(&p);
    let (layers, mbs, dispatch_bytes) = (4usize, 4usize, 32 * 2 * 64 * 4);
    let mut group_bytes: BTreeMap<(Vec<u32>, &str), u64> = BTreeMap::new();
    for (rp, t) in p.ranks.iter().zip(&traces) {
        check_timeline(t, rp.rank as usize);
        let c = census(t);
        let g = rp.groups.get(GroupKind::Ep);
        assert_eq!(count(&c, "F", "all_to_all_counts", g, 8 * 8), layers * mbs);
        for k in ["F", "B"] {
            let a2a: Vec<(u64, usize)> = c
                .iter()
                .filter(|(key, _)| key.0 == k && key.1 == "all_to_all_v")
                .map(|(key, &v)| {
                    assert_eq!(&key.2, g);
                    (key.3, v)
                })
                .collect();
            assert_eq!(a2a.iter().map(|x| x.1).sum::<usize>(), 2 * layers * mbs);
            assert!(count(&c, k, "all_to_all_v", g, dispatch_bytes) >= layers * mbs);
            *group_bytes.entry((g.to_vec(), k)).or_insert(0) +=
                a2a.iter().map(|&(b, v)| b * v as u64).sum::<u64>();
        }
        // The dense gradients' all-reduce over DP, one bucket in the last backward (the
        // experts' group, DP / EP = 1 rank, has nothing to reduce); none at the step.
        assert_eq!(c.iter().filter(|(k, _)| k.0 == "O").count(), 0, "{c:?}");
        let dp: Vec<_> = c
            .iter()
            .filter(|(k, _)| k.1 == "all_reduce" && k.2 == rp.groups.get(GroupKind::DpCp))
            .collect();
        assert_eq!(dp.len(), 1, "{c:?}");
        assert_eq!((dp[0].0 .0, *dp[0].1), ("B", 1), "{c:?}");
    }
    for ((g, k), bytes) in group_bytes {
        let dispatched = (g.len() * layers * mbs * dispatch_bytes as usize) as u64;
        assert_eq!(bytes, 2 * dispatched, "{k} over {g:?}");
    }
}

/// The Chrome trace of `parsim execute --trace` for TP 2 + SP x PP 2 puts the model's
/// collectives on each rank's `collectives` thread (tid 1), with their group and bytes, as
/// many as the in-memory trace of the same Plan holds (a second run, through the library).
#[test]
fn timeline_chrome_trace_puts_model_collectives_on_the_collectives_thread() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tp_sp_pp.toml");
    std::fs::write(
        &cfg,
        r#"[model]
num_layers = 8
hidden_size = 64
num_attention_heads = 8
num_query_groups = 4
ffn_hidden_size = 128
vocab_size = 128
make_vocab_size_divisible_by = 1
tied_embeddings = false
hidden_dropout = 0.0
attention_dropout = 0.0
[cluster]
num_gpus = 4
gpu = "cpu"
[parallel]
tp = 2
sp = true
pp = 2
[training]
seq_length = 32
micro_batch_size = 1
global_batch_size = 2
precision = "fp32"
grad_dtype = "fp32"
recompute = "none"
"#,
    )
    .unwrap();
    let trace_path = dir.path().join("trace.json");
    let out = assert_cmd::Command::cargo_bin("parsim")
        .unwrap()
        .args(["execute", "--config", cfg.to_str().unwrap()])
        .args(["--steps", "2", "--warmup", "1", "--json", "--trace"])
        .arg(&trace_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace_path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let resolved =
        Resolved::new(Config::from_layers(&[Layer::from_file(&cfg).unwrap()]).unwrap()).unwrap();
    let p = lower(&resolved, &LowerOptions::default()).unwrap();
    let traces = traced(&p);
    for (rp, t) in p.ranks.iter().zip(&traces) {
        let on_thread: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == rp.rank as u64 && e["tid"] == 1)
            .collect();
        let in_memory = census(t).values().sum::<usize>();
        assert!(in_memory > 0);
        assert_eq!(on_thread.len(), in_memory, "rank {}", rp.rank);
        for e in on_thread {
            let group: Vec<u32> = serde_json::from_value(e["args"]["group"].clone()).unwrap();
            assert_eq!(group, rp.groups.get(GroupKind::Tp), "{e}");
            assert!(e["args"]["bytes"].as_u64().unwrap() > 0, "{e}");
            let op = e["cat"].as_str().unwrap();
            assert!(e["name"].as_str().unwrap().starts_with(op), "{e}");
        }
    }
}

/// Action kind, op, bytes, count per timed step.
type Expected = (&'static str, &'static str, u64, usize);

/// CP 2 by all-gather (Llama 3) and by all-to-all (DeepSpeed-Ulysses), 8 layers, 2
/// microbatches; n = 32 positions, 16 per rank, 8 query heads and 4 K/V heads of d = 8.
/// All-gather: per layer and microbatch the forward gathers K and V (each the whole sequence,
/// 32 x 4 x 8 fp32); the backward gathers them again and reduce-scatters dK and dV.
/// Ulysses: the forward sends the packed Q, K, V rows (16 x (64 + 32 + 32)) and returns the
/// output (16 x 64); the backward sends dO with FlashAttention-2's per-head row statistic
/// D = rowsum(dO * O) (16 x (64 + 8)) and returns dQ, dK, dV (16 x 128).
#[test]
fn timeline_records_cp_all_gather_and_ulysses_all_to_all() {
    let (layers, mbs) = (8usize, 2usize);
    let per = layers * mbs;
    let kv_seq = 32 * 4 * 8 * 4;
    let (qkv, out, do_delta) = (16 * 128 * 4, 16 * 64 * 4, 16 * (64 + 8) * 4);
    let cases: [(&str, Vec<Expected>); 2] = [
        (
            "allgather",
            vec![
                ("F", "all_gather", kv_seq, 2 * per),
                ("B", "all_gather", kv_seq, 2 * per),
                ("B", "reduce_scatter", kv_seq, 2 * per),
            ],
        ),
        (
            "a2a",
            vec![
                ("F", "all_to_all", qkv, per),
                ("F", "all_to_all", out, per),
                ("B", "all_to_all", do_delta, per),
                ("B", "all_to_all", qkv, per),
            ],
        ),
    ];
    for (cp_comm, expect) in cases {
        let mix = Mix {
            cp: 2,
            cp_comm,
            ..Mix::single()
        };
        let p = plan(config(&mix, 2, true, "rmsnorm", "swiglu"));
        for (rp, t) in p.ranks.iter().zip(&traced(&p)) {
            check_timeline(t, rp.rank as usize);
            let c = census(t);
            for &(k, op, bytes, want) in &expect {
                assert_eq!(
                    count(&c, k, op, rp.groups.get(GroupKind::Cp), bytes),
                    want,
                    "{cp_comm} rank {}: {k} {op} of {bytes} bytes in {c:?}",
                    rp.rank
                );
            }
            let model: usize = expect.iter().map(|e| e.3).sum();
            // Plus the optimizer's gradient all-reduce.
            assert_eq!(c.values().sum::<usize>(), model + 1, "{cp_comm}: {c:?}");
        }
    }
}

/// The engine's expert-TP bytes against what the executor sends. TP 1 with expert TP 2 over
/// DP 4 and EP 2 (MoE Parallel Folding: expert-TP groups {0, 1} and {2, 3}, which no other
/// collective of this mix uses) under forced load balancing (every expert takes n k / E rows,
/// the engine's balanced router exactly), fp32, 4 MoE layers, 2 microbatches a rank: each
/// rank's traced all-gathers and reduce-scatters over its expert-TP group (their whole buffer:
/// a gather's output, a reduce-scatter's input), times the ring's (n - 1)/n = 1/2, equal the
/// estimate's `communication.per_step_bytes_per_gpu[CommKind::ExpertTp]` for the same configuration.
#[test]
fn the_engines_expert_tp_bytes_are_what_the_executor_sends() {
    let m = super::moe::Moe {
        ep: 2,
        dp: 4,
        force_balance: true,
        ..BASE
    };
    let mut v = moe_config(&m);
    v["parallel"]["expert_tp"] = 2.into();
    let predicted = parsim::estimate::estimate(&super::common::resolve(v.clone()))
        .expect("estimates")
        .communication
        .per_step_bytes_per_gpu[CommKind::ExpertTp];
    // By hand: 32 tokens x top-2 = 64 rows received a rank, 128 gathered over 2 members of
    // h 64 fp32 = 32768 bytes, half on the wire, 4 calls x 4 layers x 2 microbatches.
    assert_eq!(predicted, 32768 / 2 * 4 * 4 * 2);
    let p = plan(v);
    let traces = traced(&p);
    for (rp, t) in p.ranks.iter().zip(&traces) {
        assert_eq!(rp.groups.get(GroupKind::ExpertTp).len(), 2);
        let c = census(t);
        let sent: u64 = c
            .iter()
            .filter(|(k, _)| {
                k.2 == rp.groups.get(GroupKind::ExpertTp)
                    && matches!(k.1.as_str(), "all_gather" | "reduce_scatter")
            })
            .map(|(k, &n)| k.3 * n as u64)
            .sum();
        assert_eq!(sent / 2, predicted, "rank {}: {c:?}", rp.rank);
    }
}
