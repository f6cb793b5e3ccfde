//! Issue 30, low-precision recipes: the memory each recipe adds (weight copies, transposes,
//! scale tensors; the fp8 parameter gather), its quantise kernels as memory-bound ops, the
//! settings it is refused on, and the Blackwell GEMM rates it runs at. Every figure is worked
//! by hand from Llama 3 8B's shapes (Meta's config: hidden 4096, 32 layers, 32 query heads
//! and 8 KV heads of 128, SwiGLU FFN 14336) and Transformer Engine's recipes.

use super::common::{est, resolve};
use parsim::comm::{dp_collectives, replica_sets};
use parsim::config::{Config, GpuProfile, Layer, Precision, Resolved};
use parsim::estimate::{time_ledger, Prepared};
use parsim::layout::Layout;
use parsim::model::{chunks_per_rank, Ledger, LedgerSummary, OpKind, TensorRole};
use parsim::network::ep_dispatch::EpDispatch;
use parsim::network::Network;
use parsim::op_cost::cast::CastPass;
use parsim::time::Rates;
use serde_json::{json, Value};

/// One layer's linear weights: qkv 4096 x (4096 + 2 x 8 x 128), proj 4096 x 4096, fc1
/// 4096 x 2 x 14336 (gate and up), fc2 14336 x 4096.
const LAYER_WEIGHTS: u64 = 4096 * (6144 + 4096 + 28672 + 14336);
/// Linear layers a layer: qkv, proj, fc1, fc2.
const LINEARS: u64 = 4;
const LAYERS: u64 = 32;

fn l8b(gpu: &str, precision: &str) -> Value {
    json!({"model": {"preset": "llama3-8b"},
           "cluster": {"gpu": gpu, "num_gpus": 1},
           "parallel": {"tp": 1, "sp": false},
           "training": {"precision": precision, "global_batch_size": 1, "seq_length": 2048}})
}

fn with(mut v: Value, field: &str, x: Value) -> Value {
    v["training"][field] = x;
    v
}

fn low_precision_bytes(v: Value) -> u64 {
    est(v).memory.stages[0].low_precision_weights
}

/// The cached weight copies of each recipe, whole model on one GPU (32 layers, 4 weights a
/// layer, E = 218,103,808 elements a layer):
/// - MXFP8: rowwise and columnwise E4M3 copies, each with an E8M0 byte per 32: 2 x 33/32 E;
/// - NVFP4: two E2M1 copies (E/2) with an E4M3 byte per 16 (E/16) and an FP32 per tensor;
/// - blockwise FP8 (H100): two copies, each with an FP32 per 128 x 128 block (E/4096 bytes);
/// - per-tensor FP8 on H100: the copy and its transpose, each with its FP32 scale;
/// - per-tensor FP8 on GB200: one copy serves both usages (Blackwell reads FP8 columnwise).
#[test]
fn each_recipe_caches_its_weight_copies_and_scales() {
    let e = LAYER_WEIGHTS;
    assert_eq!(e, 218_103_808);
    let cases = [
        (l8b("b200", "mxfp8"), LAYERS * 2 * (e + e / 32)),
        // NVFP4 keeps its first and last layers in bf16 by default: 30 layers cast.
        (
            l8b("b200", "nvfp4"),
            (LAYERS - 2) * 2 * (e / 2 + e / 16 + 4 * LINEARS),
        ),
        (
            with(l8b("h100-sxm", "fp8"), "fp8_recipe", json!("blockwise")),
            LAYERS * 2 * (e + 4 * e / (128 * 128)),
        ),
        (l8b("h100-sxm", "fp8"), LAYERS * 2 * (e + 4 * LINEARS)),
        (
            with(l8b("gb200", "fp8"), "fp8_recipe", json!("current")),
            LAYERS * (e + 4 * LINEARS),
        ),
        (l8b("b200", "bf16"), 0),
    ];
    for (v, by_hand) in cases {
        let label = v["training"].to_string();
        assert_eq!(low_precision_bytes(v), by_hand, "{label}");
    }
    assert_eq!(14_394_851_328, LAYERS * 2 * (e + e / 32));
}

/// NVFP4's bf16 layers (NVIDIA's recipe keeps its first and last layers in higher
/// precision; Megatron's --first-last-layers-bf16, 1 and 1 by default): those layers have no
/// quantise kernels or weight copies, save bf16 inputs and run their GEMMs at the bf16 rate,
/// so the step sits between all-NVFP4 and all-bf16; on a pipeline they sit on the first and
/// last stages.
#[test]
fn nvfp4_keeps_its_end_layers_in_bf16() {
    let v = |start: u32, end: u32, pp: u32| {
        let mut v = l8b("b200", "nvfp4");
        v["cluster"]["num_gpus"] = json!(pp);
        v["parallel"]["pp"] = json!(pp);
        v["training"]["global_batch_size"] = json!(8);
        v["training"]["bf16_layers_at_start"] = json!(start);
        v["training"]["bf16_layers_at_end"] = json!(end);
        v
    };
    let r = resolve(v(1, 1, 1));
    let l = Ledger::build(&r);
    let hp = l.dense_hp.as_ref().expect("a bf16 layer block");
    assert!(hp.high_precision);
    assert!(!hp
        .ops
        .iter()
        .any(|o| matches!(o.kind, OpKind::Quantize { .. })));
    let c = &chunks_per_rank(&r)[0][0];
    assert_eq!((c.dense_layers, c.hp_dense_layers), (30, 2));
    // Four stages of 8 layers: one bf16 layer on the first and one on the last.
    let r4 = resolve(v(1, 1, 4));
    let hp_by_stage: Vec<u32> = chunks_per_rank(&r4)
        .iter()
        .map(|ch| ch[0].hp_dense_layers)
        .collect();
    assert_eq!(hp_by_stage, [1, 0, 0, 1]);
    // None in bf16 is faster, all in bf16 slower.
    let compute = |v: Value| est(v).time.compute_s;
    let (none, ends) = (compute(v(0, 0, 1)), compute(v(1, 1, 1)));
    let mut all = l8b("b200", "bf16");
    all["training"]["global_batch_size"] = json!(8);
    let bf16 = compute(all);
    assert!(none < ends && ends < bf16, "{none} {ends} {bf16}");
    // Without a recipe no bf16 block exists.
    assert!(Ledger::build(&resolve(l8b("b200", "bf16")))
        .dense_hp
        .is_none());
}

/// `precision` on `gpu` over 2 GPUs at ZeRO-1, with or without the low-precision parameter
/// gather (no layer kept in bf16).
fn gather_config(gpu: &str, precision: &str, gather: bool) -> Value {
    let mut v = l8b(gpu, precision);
    v["cluster"]["num_gpus"] = json!(2);
    v["parallel"]["zero"] = json!(1);
    v["training"]["global_batch_size"] = json!(2);
    v["training"]["fp8_param_gather"] = json!(gather);
    if precision == "nvfp4" {
        v["training"]["bf16_layers_at_start"] = json!(0);
        v["training"]["bf16_layers_at_end"] = json!(0);
    }
    v
}

/// The dense replica set's trainable parameters and its parameter all-gather's payload.
fn parameter_all_gather(v: Value) -> (u64, u64) {
    let r = resolve(v);
    let l = Ledger::build(&r);
    let s = LedgerSummary::of(&l, r.config.training.recompute);
    let chunks = chunks_per_rank(&r);
    let set = replica_sets(&r, &s, &chunks[0])[0];
    let ag = dp_collectives(1, set, 1)
        .into_iter()
        .find(|c| c.kind == parsim::model::CollectiveKind::AllGather)
        .unwrap();
    (set.trainable, ag.payload_bytes)
}

/// The fp8 parameter gather: the weights are held in 8 bits, so the bf16 weights shrink by a
/// byte per quantised element (32 E) and the cache loses its rowwise copy (the weight itself);
/// the distributed optimizer's parameter all-gather moves those elements in 1 byte.
#[test]
fn fp8_param_gather_holds_and_gathers_weights_in_8_bits() {
    let base = |gather: bool| gather_config("h100-sxm", "fp8", gather);
    let (plain, gathered) = (est(base(false)), est(base(true)));
    let (p, g) = (&plain.memory.stages[0], &gathered.memory.stages[0]);
    let quantised = LAYERS * LAYER_WEIGHTS;
    assert_eq!(p.weights - g.weights, quantised);
    assert_eq!(p.low_precision_weights - g.low_precision_weights, quantised);
    assert_eq!(
        g.low_precision_weights,
        quantised + LAYERS * 2 * 4 * LINEARS
    );
    // The parameter all-gather of the dense replica set, by hand: trainable x 2 bytes less a
    // byte per quantised element.
    let (trainable, plain_ag) = parameter_all_gather(base(false));
    let (_, narrow_ag) = parameter_all_gather(base(true));
    assert_eq!(plain_ag, trainable * 2);
    assert_eq!(narrow_ag, trainable * 2 - quantised);
}

/// NVFP4's parameter gather (Megatron's `--fp4-param-gather`): the weights are held as their
/// packed E2M1 values, half a byte each, so the bf16 weights shrink by 1.5 bytes per quantised
/// element, the cache loses the rowwise values (half a byte each; their E4M3 scales stay), and
/// the parameter all-gather moves half a byte per quantised element in place of two.
#[test]
fn fp4_param_gather_holds_and_gathers_weights_in_half_a_byte() {
    let base = |gather: bool| gather_config("b200", "nvfp4", gather);
    let (plain, gathered) = (est(base(false)), est(base(true)));
    let (p, g) = (&plain.memory.stages[0], &gathered.memory.stages[0]);
    let quantised = LAYERS * LAYER_WEIGHTS;
    assert_eq!(p.weights - g.weights, quantised * 3 / 2);
    assert_eq!(
        p.low_precision_weights - g.low_precision_weights,
        quantised / 2
    );
    let (trainable, ag) = parameter_all_gather(base(true));
    assert_eq!(ag, trainable * 2 - quantised * 3 / 2);
}

/// The quantise kernels of one layer, by hand (m = 2048 tokens): forward each linear layer
/// reads its input X [m x k] in bf16 and writes its quantised copies; backward its output
/// gradient dY [m x n] likewise. MXFP8 writes two copies of 33/32 bytes a value: 2 + 2 x
/// 33/32 = 4.0625 bytes a value. Inputs k: 4096 (qkv), 4096 (proj), 4096 (fc1), 14336
/// (fc2); outputs n: 6144, 4096, 28672, 4096. Each runs at HBM bandwidth x the profile's
/// memory-bound efficiency plus a launch.
#[test]
fn quantise_kernels_of_one_layer_by_hand() {
    let m = 2048u64;
    let r = resolve(l8b("b200", "mxfp8"));
    let l = Ledger::build(&r);
    let (mut fwd, mut bwd, mut kernels) = (0u64, 0u64, 0u64);
    for op in &l.dense.ops {
        if let OpKind::Quantize { fwd: f, bwd: b, .. } = op.kind {
            assert_eq!((f.amax_bytes, b.amax_bytes), (0, 0));
            fwd += f.cast_bytes;
            bwd += b.cast_bytes;
            kernels += 1;
        }
    }
    assert_eq!(kernels, LINEARS);
    let per_value = |values: u64| values * 2 + 2 * (values + values / 32);
    assert_eq!(fwd, per_value(m * (4096 + 4096 + 4096 + 14336)));
    assert_eq!(bwd, per_value(m * (6144 + 4096 + 28672 + 4096)));
    // Timed as memory-bound ops.
    let gpu = &r.gpu;
    let rates = Rates {
        gpu,
        peak_flops: gpu.peak_flops.fp8.unwrap(),
        element_bytes: 2,
        matmul_efficiency: gpu.efficiency.matmul,
    };
    let q = l
        .dense
        .ops
        .iter()
        .find(|o| matches!(o.kind, OpKind::Quantize { .. }))
        .unwrap();
    let OpKind::Quantize { fwd, bwd, .. } = q.kind else {
        unreachable!()
    };
    let bw = gpu.hbm_bytes_per_s * gpu.efficiency.memory_bound;
    let o = gpu.efficiency.kernel_overhead_s;
    let (f, d, w) = rates.op_s(q);
    assert!((f - (fwd.cast_bytes as f64 / bw + o)).abs() < 1e-15);
    assert!((d - (bwd.cast_bytes as f64 / bw + o)).abs() < 1e-15);
    assert_eq!(w, 0.0);
    // bf16 runs no quantise kernel.
    let bf16 = Ledger::build(&resolve(l8b("b200", "bf16")));
    assert!(!bf16
        .dense
        .ops
        .iter()
        .any(|o| matches!(o.kind, OpKind::Quantize { .. })));
}

/// A quantise op's kernels and seconds, with the HBM rate and launch that time them.
struct CastOp {
    fwd: CastPass,
    bwd: CastPass,
    /// (forward, input gradient, weight gradient) seconds.
    seconds: (f64, f64, f64),
    bw: f64,
    launch_s: f64,
}

/// The quantise op after `name` in the dense layer of `v`, and its timed seconds.
fn cast_after(v: Value, name: &str) -> CastOp {
    let r = resolve(v);
    let l = Ledger::build(&r);
    let at = l.dense.ops.iter().position(|o| o.name == name).unwrap();
    let q = &l.dense.ops[at + 1];
    let OpKind::Quantize { fwd, bwd, .. } = q.kind else {
        panic!("no quantise op after {name}")
    };
    let gpu = &r.gpu;
    let rates = Rates {
        gpu,
        peak_flops: gpu.peak_flops.fp8.unwrap(),
        element_bytes: 2,
        matmul_efficiency: gpu.efficiency.matmul,
    };
    // A cast streams at the measured share of HBM a streaming kernel reaches on the die
    // (DeepGEMM's memory-bound GEMMs on H800, 0.796), else the elementwise share.
    let share = gpu.gemm.operand_stream_fraction;
    let bw = gpu.hbm_bytes_per_s * share.unwrap_or(gpu.efficiency.memory_bound);
    CastOp {
        fwd,
        bwd,
        seconds: rates.op_s(q),
        bw,
        launch_s: gpu.efficiency.kernel_overhead_s,
    }
}

/// Per-tensor FP8 on H100, by hand from Transformer Engine's code for the output projection
/// (m = 2048 tokens, k = n = 4096): current scaling (`Float8CurrentScalingQuantizer::
/// quantize_impl`, csrc/quantizer.cpp) reads X in bf16 for its amax (2mk = 16 MiB), runs the
/// scale kernel (8 bytes), then casts: 2mk read plus the FP8 copy and its transpose, each
/// with an FP32 scale (Hopper reads FP8 only rowwise): 2mk + 2(mk + 4). Three kernels, each
/// at 3.35 TB/s x the measured streaming share 0.796 with its launch. Backward the same over dY
/// [m x n]. Delayed scaling casts in one kernel (the amax recorded as it casts).
#[test]
fn per_tensor_fp8_casts_by_hand_from_transformer_engine() {
    let (m, k, n) = (2048u64, 4096u64, 4096u64);
    let current = with(l8b("h100-sxm", "fp8"), "fp8_recipe", json!("current"));
    let CastOp {
        fwd,
        bwd,
        seconds: (f, d, w),
        bw,
        launch_s: o,
    } = cast_after(current, "attn.proj");
    assert!((bw - 3.35e12 * 0.796).abs() < 1.0, "{bw}");
    assert_eq!(fwd.amax_bytes, 2 * m * k);
    assert_eq!(fwd.cast_bytes, 2 * m * k + 2 * (m * k + 4));
    assert_eq!(bwd.amax_bytes, 2 * m * n);
    assert_eq!(bwd.cast_bytes, 2 * m * n + 2 * (m * n + 4));
    let by_hand =
        |amax: u64, cast: u64| (amax as f64 / bw + o) + (8.0 / bw + o) + (cast as f64 / bw + o);
    assert!((f - by_hand(2 * m * k, 4 * m * k + 8)).abs() < 1e-12, "{f}");
    assert!((d - by_hand(2 * m * n, 4 * m * n + 8)).abs() < 1e-12, "{d}");
    assert_eq!(w, 0.0);
    // 48 MiB of HBM traffic and three launches: tens of microseconds, not noise.
    assert!(f > 1e-5, "{f}");
    let CastOp {
        fwd,
        seconds: (f, ..),
        bw,
        launch_s: o,
        ..
    } = cast_after(l8b("h100-sxm", "fp8"), "attn.proj");
    assert_eq!(
        (fwd.amax_bytes, fwd.cast_bytes),
        (0, 2 * m * k + 2 * (m * k + 4))
    );
    assert!((f - ((4 * m * k + 8) as f64 / bw + o)).abs() < 1e-12);
}

/// A cast fused into the norm before the layer is not paid again: under delayed scaling TE's
/// norm kernel writes FP8 itself (normalization.cpp, FULLY_FUSED), so the QKV projection's
/// forward cast is only the transpose on H100 (FP8 read and written, 2mk) and nothing on
/// GB200; under current scaling the norm computes the amax (FUSED_NORM_AMAX_FP8), so the
/// cast runs without its amax pass. The output projection, whose input no norm makes, pays
/// the whole cast; every backward (dY) cast is unfused.
#[test]
fn casts_fused_into_the_norm_are_not_paid_twice() {
    let (m, k) = (2048u64, 4096u64);
    let CastOp { fwd, bwd, .. } = cast_after(l8b("h100-sxm", "fp8"), "attn.qkv");
    assert_eq!((fwd.amax_bytes, fwd.cast_bytes), (0, 2 * m * k));
    assert_eq!(bwd.cast_bytes, 2 * m * 6144 + 2 * (m * 6144 + 4));
    let CastOp {
        fwd,
        seconds: (f, ..),
        ..
    } = cast_after(l8b("gb200", "fp8"), "mlp.fc1");
    assert_eq!((fwd.amax_bytes, fwd.cast_bytes), (0, 0));
    assert_eq!(f, 0.0);
    let current = with(l8b("h100-sxm", "fp8"), "fp8_recipe", json!("current"));
    let fwd = cast_after(current.clone(), "attn.qkv").fwd;
    assert_eq!(
        (fwd.amax_bytes, fwd.cast_bytes),
        (0, 2 * m * k + 2 * (m * k + 4))
    );
    let proj = cast_after(current, "attn.proj").fwd;
    assert!(proj.amax_bytes > 0);
}

/// Under sequence parallelism TE casts the local sequence shard before gathering it in FP8
/// (`_Linear.forward`, `grad_output_preprocess`): at TP 2 the QKV projection's input cast
/// and the output projection's dY cast cover m / 2 rows, while the output projection's
/// input (the attention output, whole on every rank) covers m rows of k / 2 features.
#[test]
fn sequence_parallel_casts_cover_the_local_shard() {
    let (m, h) = (2048u64, 4096u64);
    let mut v = with(l8b("h100-sxm", "fp8"), "fp8_recipe", json!("current"));
    v["cluster"]["num_gpus"] = json!(2);
    v["parallel"] = json!({"tp": 2, "sp": true});
    let qkv = cast_after(v.clone(), "attn.qkv").fwd;
    assert_eq!(qkv.cast_bytes, 2 * (m / 2) * h + 2 * ((m / 2) * h + 4));
    let proj = cast_after(v, "attn.proj");
    assert_eq!(proj.fwd.amax_bytes, 2 * m * (h / 2));
    assert_eq!(proj.bwd.amax_bytes, 2 * (m / 2) * h);
}

/// The step of `v` with its ledger's cast ops, and with them taken out (everything else the
/// same ledger, timed the same way).
fn step_with_and_without_casts(v: Value) -> (f64, f64) {
    let r = resolve(v);
    let with = Prepared::new(&r, None)
        .unwrap()
        .finish()
        .unwrap()
        .time
        .step_s;
    let network = Network::new(&Layout::of(&r), &r.gpu).with_ep_dispatch(EpDispatch::of(&r.config));
    let mut l = Ledger::build(&r);
    let strip =
        |b: &mut parsim::model::Block| b.ops.retain(|o| !matches!(o.kind, OpKind::Quantize { .. }));
    strip(&mut l.dense);
    l.moe.iter_mut().for_each(strip);
    l.variants.iter_mut().for_each(strip);
    let timed = time_ledger(&r, &network, l);
    let without = Prepared::with_ledger(&r, Some(network), Some(timed))
        .unwrap()
        .finish()
        .unwrap()
        .time
        .step_s;
    (with, without)
}

/// Adding the casts never speeds a step, and under per-tensor FP8 they now cost time: on
/// each GPU family, recipe and parallel mix, the step with the cast ops is at least the step
/// without them (a property of the time model: kernels added to a stream cannot shorten it).
#[test]
fn casts_never_speed_a_step() {
    for (gpu, precision, recipe, tp, mbs) in [
        ("h100-sxm", "fp8", "delayed", 1, 1),
        ("h100-sxm", "fp8", "current", 2, 2),
        ("gb200", "fp8", "current", 1, 1),
        ("gb200", "fp8", "delayed", 2, 1),
        ("b200", "mxfp8", "", 1, 2),
    ] {
        let mut v = l8b(gpu, precision);
        v["cluster"]["num_gpus"] = json!(tp);
        v["parallel"] = json!({"tp": tp, "sp": tp > 1});
        v["training"]["micro_batch_size"] = json!(mbs);
        v["training"]["global_batch_size"] = json!(2 * mbs);
        if !recipe.is_empty() {
            v["training"]["fp8_recipe"] = json!(recipe);
        }
        let (with, without) = step_with_and_without_casts(v);
        assert!(
            with > without,
            "{gpu} {precision} {recipe} tp {tp} mbs {mbs}: {with} <= {without}"
        );
    }
}

/// The recipes' extra kernels and copies cost time, at the same GEMM rate: MXFP8 (two
/// block-scaled copies of every operand, its norms unfused) takes longer than delayed-scaling
/// FP8 on GB200 (one copy, written by the norms where they fuse the cast); current scaling
/// takes longer than delayed (its amax pass reads every unfused input once more: 5 bytes a
/// value to MXFP8's 4.06, so it may even exceed MXFP8).
#[test]
fn block_scaled_copies_cost_more_than_one_per_tensor_copy() {
    let gb = |p: &str, recipe: &str| {
        let mut v = l8b("gb200", p);
        if !recipe.is_empty() {
            v["training"]["fp8_recipe"] = json!(recipe);
        }
        est(v).time.compute_s
    };
    let (delayed, current, mxfp8) = (gb("fp8", "delayed"), gb("fp8", "current"), gb("mxfp8", ""));
    assert!(mxfp8 > delayed, "{mxfp8} vs {delayed}");
    assert!(current > delayed, "{current} vs {delayed}");
    let gpu = GpuProfile::load("gb200").unwrap();
    assert_eq!(
        gpu.matmul_efficiency_for(Precision::Fp8),
        gpu.matmul_efficiency_for(Precision::Mxfp8)
    );
}

fn rejected(overlay: Value) -> String {
    let cfg = Config::from_layers(&[Layer::overrides(overlay)]).expect("parses");
    Resolved::new(cfg).expect_err("rejected").to_string()
}

/// Bad combinations are refused by field and rule: the fp8 gather without an 8-bit weight
/// format, bf16 layers under delayed scaling or without a recipe, more bf16 layers than the
/// model has, block-scaled recipes on a GPU without them.
#[test]
fn bad_recipe_settings_are_refused_by_field() {
    let e = rejected(with(l8b("b200", "bf16"), "fp8_param_gather", json!(true)));
    assert!(
        e.contains("training.fp8_param_gather") && e.contains("fp8, mxfp8 or nvfp4"),
        "{e}"
    );
    let e = rejected(with(l8b("h100-sxm", "fp8"), "bf16_layers_at_end", json!(2)));
    assert!(
        e.contains("training.bf16_layers_at_start") && e.contains("delayed"),
        "{e}"
    );
    let e = rejected(with(
        l8b("h100-sxm", "bf16"),
        "bf16_layers_at_start",
        json!(1),
    ));
    assert!(e.contains("low-precision recipe"), "{e}");
    let e = rejected(with(l8b("b200", "nvfp4"), "bf16_layers_at_end", json!(40)));
    assert!(e.contains("exceed model.num_layers (32)"), "{e}");
    for p in ["mxfp8", "nvfp4"] {
        let e = rejected(l8b("h100-sxm", p));
        assert!(
            e.contains("training.precision") && e.contains("h100-sxm lacks"),
            "{e}"
        );
    }
    // The defaults: NVFP4 keeps one layer at each end in bf16, the other recipes none.
    let t = resolve(l8b("b200", "nvfp4")).config.training;
    assert_eq!(t.bf16_layers(), (1, 1));
    let t = resolve(l8b("b200", "mxfp8")).config.training;
    assert_eq!(t.bf16_layers(), (0, 0));
}

/// calibration/data/gemm-rates-blackwell.json: each profile's achievable fraction is its best
/// measured rate over its own peak, and the GEMM model (that fraction, wave quantisation of
/// the profile's tiles, the memory roofline) reproduces every point within 10%.
#[test]
fn blackwell_gemm_rates_are_reproduced_within_10_percent() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/data/gemm-rates-blackwell.json"
    ))
    .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    for p in points {
        let source = &v["sources"][p["source"].as_str().unwrap()];
        assert!(source["url"].as_str().unwrap().starts_with("https://"));
        let tflops = p["tflops"].as_f64().unwrap();
        let shape: Vec<u64> = p["shape_mnk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        for name in p["profiles"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let mut gpu = GpuProfile::load(name).unwrap();
            let (peak, fraction, bytes) = match p["dtype"].as_str().unwrap() {
                "bf16" => (gpu.peak_flops.bf16, gpu.gemm.achievable_bf16_fraction, 2),
                "fp8" => (
                    gpu.peak_flops.fp8.unwrap(),
                    gpu.gemm.achievable_fp8_fraction,
                    1,
                ),
                "nvfp4" => (
                    gpu.peak_flops.fp4.unwrap(),
                    gpu.gemm.achievable_fp4_fraction,
                    1,
                ),
                d => panic!("unknown dtype {d}"),
            };
            // The published peak is the profile's.
            assert_eq!(peak, p["theory_tflops"].as_f64().unwrap() * 1e12, "{name}");
            let fraction = fraction.expect("a measured fraction");
            // The shipped fraction is the best point of its GPU and dtype over the peak.
            let best = points
                .iter()
                .filter(|q| q["dtype"] == p["dtype"] && q["profiles"] == p["profiles"])
                .map(|q| q["tflops"].as_f64().unwrap())
                .fold(0.0, f64::max);
            assert_eq!(
                fraction,
                (best * 1e12 / peak * 1000.0).round() / 1000.0,
                "{name}"
            );
            gpu.efficiency.kernel_overhead_s = 0.0;
            let rates = Rates {
                gpu: &gpu,
                peak_flops: peak,
                element_bytes: bytes,
                matmul_efficiency: fraction,
            };
            let (m, n, k) = (shape[0], shape[1], shape[2]);
            let model = 2.0 * (m * n * k) as f64 / rates.gemm_s(m, n, k) / 1e12;
            let err = model / tflops - 1.0;
            println!(
                "{name} {} {m}x{n}x{k}: model {model:.1} TF vs published {tflops} ({:+.1}%)",
                p["dtype"],
                100.0 * err
            );
            assert!(err.abs() <= 0.10, "{name} {}: {err:+.3}", p["dtype"]);
        }
    }
    // NVFP4 GEMMs use their own share where measured (B200), FP8's elsewhere (B300).
    let b200 = GpuProfile::load("b200").unwrap();
    let e = b200.efficiency.matmul;
    assert!((b200.matmul_efficiency_for(Precision::Nvfp4) - e * 0.611 / 0.776).abs() < 1e-12);
    let b300 = GpuProfile::load("b300").unwrap();
    assert_eq!(
        b300.matmul_efficiency_for(Precision::Nvfp4),
        b300.matmul_efficiency_for(Precision::Fp8)
    );
}

/// Bytes the ops of one Llama 3 8B layer keep as their input for backward, by op name.
fn saved_inputs(v: Value) -> std::collections::HashMap<&'static str, u64> {
    let l = Ledger::build(&resolve(v));
    l.dense
        .ops
        .iter()
        .map(|o| {
            let input = o.saved.iter().filter(|s| s.role == TensorRole::Input);
            (o.name, input.map(|s| s.bytes).sum())
        })
        .collect()
}

/// What Transformer Engine keeps of each linear layer's input for the weight gradient, one
/// layer at sequence 2048 on a B200 (TP 1), by hand from its code: `_Linear.forward` and
/// `_LayerNormLinear.forward` (transformer_engine/pytorch/module/linear.py,
/// layernorm_linear.py) drop the row-wise usage and keep the column-wise one, scaled along the
/// 2048 tokens. QKV and fc1 read [2048 x 4096] (E = 8388608), fc2 [2048 x 14336] (F =
/// 29360128):
/// - per-tensor FP8: one 1-byte copy and its FP32 scale, E + 4 and F + 4;
/// - MXFP8: an E8M0 byte per 32 tokens of each feature, E + 4096 x 64, F + 14336 x 64;
/// - NVFP4: half a byte, an E4M3 byte per 16 tokens and the FP32 tensor scale, E/2 + 4096 x
///   128 + 4, F/2 + 14336 x 128 + 4.
///
/// The output projection's input is the fused attention's output, which the attention kernel
/// saves in bf16 (2E): Megatron-Core has the projection save that original tensor under every
/// recipe but delayed scaling (megatron/core/transformer/attention.py), which keeps its FP8
/// copy, E + 4 (the attention's bf16 output beside it is not counted yet: docs/engine.md). The SwiGLU's input stays bf16 (Megatron's fused
/// `bias_swiglu_impl` saves it so): 2048 x 28672 x 2.
#[test]
fn each_recipe_saves_linear_inputs_as_transformer_engine_keeps_them() {
    let (e, f) = (2048 * 4096u64, 2048 * 14336u64);
    let act = 2048 * 28672 * 2;
    let cases: [(&str, Option<&str>, u64, u64, u64); 5] = [
        ("bf16", None, 2 * e, 2 * e, 2 * f),
        ("fp8", Some("delayed"), e + 4, e + 4, f + 4),
        ("fp8", Some("current"), e + 4, 2 * e, f + 4),
        ("mxfp8", None, e + 4096 * 64, 2 * e, f + 14336 * 64),
        (
            "nvfp4",
            None,
            e / 2 + 4096 * 128 + 4,
            2 * e,
            f / 2 + 14336 * 128 + 4,
        ),
    ];
    for (precision, recipe, norm_fused, proj, fc2) in cases {
        let mut v = l8b("b200", precision);
        if let Some(r) = recipe {
            v = with(v, "fp8_recipe", json!(r));
        }
        let s = saved_inputs(v);
        let what = format!("{precision} {recipe:?}");
        assert_eq!(s["attn.qkv"], norm_fused, "{what}: qkv");
        assert_eq!(s["mlp.fc1"], norm_fused, "{what}: fc1");
        assert_eq!(s["attn.proj"], proj, "{what}: proj");
        assert_eq!(s["mlp.fc2"], fc2, "{what}: fc2");
        assert_eq!(s["mlp.act"], act, "{what}: act");
    }
    // NVFP4 at TP 2 with SP: a layer-norm-fused layer whose backward re-gathers its input keeps
    // both usages of its sequence shard [1024 x 4096] (layernorm_linear.py discards the
    // row-wise one only for MXFP8 and blockwise FP8): column-wise 2097152 + 4096 x 64 + 4 and
    // row-wise 2097152 + 1024 x 256 + 4; fc2 (row-parallel, [2048 x 7168]) the column-wise one.
    let mut v = l8b("b200", "nvfp4");
    v["cluster"]["num_gpus"] = json!(2);
    v["parallel"] = json!({"tp": 2, "sp": true});
    let s = saved_inputs(v);
    assert_eq!(s["attn.qkv"], 2 * (2097152 + 262144 + 4));
    assert_eq!(s["mlp.fc2"], 2048 * 7168 / 2 + 7168 * 128 + 4);
}
