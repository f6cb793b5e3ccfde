//! cuDNN's fused attention on Blackwell and under sliding windows, against NVIDIA's
//! cudnn-frontend benchmark results it was read from (calibration/data/attention-kernels.json,
//! sources cudnn-fe-9.19-gb200, cudnn-fe-9.19-gb300, cudnn-fe-9.22 and cudnn-fe-9.19's H200
//! GPT-OSS file), and the backend Transformer Engine runs for learned sinks (GPT-OSS).

use parsim::attention_rates::{attention_kernel, published_series, Pass};
use parsim::config::{Config, GpuProfile, Resolved};
use parsim::model::{Flops, Op, OpKind};
use parsim::time::Rates;

/// Query-key pairs per head the benchmark counts (benchmark_single_sdpa.py, `flops()`): all
/// s^2 unmasked, s (s + 1) / 2 causal, W (W + 1) / 2 + (S - W) W under a window of W keys.
fn benchmark_pairs(s: u64, causal: bool, window: Option<u64>) -> f64 {
    match (causal, window) {
        (false, _) => (s * s) as f64,
        (true, Some(w)) if s > w => (w * (w + 1) / 2 + (s - w) * w) as f64,
        (true, _) => (s * (s + 1) / 2) as f64,
    }
}

/// A fused core of one call, `window` keys per query where set, doing `fwd` forward FLOPs.
fn core(seq_len: u64, head_dim: u64, window: Option<u64>, fwd: f64) -> Op {
    let mut op = Op::new(
        "attn.core",
        OpKind::Attention {
            seq_len,
            causal: true,
            fused: true,
            head_dim,
            ring: None,
            window,
        },
    );
    op.rank_flops = Flops {
        fwd,
        dgrad: 2.0 * fwd,
        wgrad: 0.0,
    };
    op
}

/// One published point: (kernel, head dim, window, s, forward, backward TFLOP/s).
type Point = (&'static str, u64, Option<u64>, u64, f64, f64);

/// Published points read by hand from the CSVs (rows backend cudnn, bfloat16, not
/// deterministic).
const BY_HAND: [Point; 6] = [
    // results/gpt_oss/gb200/gpt_oss_20260424_100011.csv: 0.414 ms forward, 0.911 ms backward
    // for 2 x 128 heads x (128 x 129 / 2 + 8064 x 128) pairs x 128 FLOPs (forward).
    ("gb200/cudnn-9.22", 64, Some(128), 8192, 165.0, 187.0),
    ("gb300/cudnn-9.22", 64, Some(128), 4096, 167.0, 191.0),
    // results/h200_919_only_cudnn/gpt_oss_20260227_034819.csv (window 1024, 64/8 heads).
    ("h100-sxm/cudnn-9.19", 64, Some(1024), 8192, 349.0, 300.0),
    // results/gb200_919_only_cudnn/gpt_oss_20260226_175022.csv at 50c8aeb's parent.
    ("gb200/cudnn-9.19", 64, Some(1024), 4096, 574.0, 617.0),
    // results/llama3.1/gb200/llama3.1_20260424_100750.csv, top_left, head dim 128.
    ("gb200/cudnn-9.22", 128, None, 8192, 1574.0, 1332.0),
    ("gb300/cudnn-9.22", 128, None, 8192, 1856.0, 1435.0),
];

/// Each lookup the time model makes returns the published point within 5%, and the forward
/// FLOPs the benchmark counts check against its printed time: 128 x 129 / 2 + 8064 x 128 =
/// 1,040,448 pairs, 2 x 2 x 128 x 1,040,448 x 128 = 68.2 GFLOP in 0.414 ms is 164.7 TFLOP/s,
/// the GB200 row's 165.
#[test]
fn window_and_blackwell_lookups_match_the_published_points_by_hand() {
    let fwd_8k = 2.0 * 2.0 * 128.0 * benchmark_pairs(8192, true, Some(128)) * 128.0;
    assert_eq!(benchmark_pairs(8192, true, Some(128)), 1_040_448.0);
    assert!((fwd_8k / 0.414e-3 / 1e12 - 165.0).abs() < 0.5);
    for (name, hd, window, s, fwd, bwd) in BY_HAND {
        let k = attention_kernel(name).expect(name);
        for (backward, published) in [(false, fwd), (true, bwd)] {
            let rate = k.pass_flops_per_s(s, true, hd, window, backward) / 1e12;
            assert!(
                (rate / published - 1.0).abs() <= 0.05,
                "{name} hd{hd} {window:?} s={s} backward={backward}: {rate:.0} vs {published}"
            );
        }
    }
}

/// A window between published ones takes the nearest by ratio; a kernel without windowed
/// series has none (the call is then timed as full causal attention); a full causal call of
/// head dim 64, published only under windows, runs at the window nearest s / 2 when within a
/// factor of two (1024 for s = 4096 on cuDNN 9.19), else at head dim 128's full curves
/// (cuDNN 9.22 publishes only a window of 128 at head dim 64).
#[test]
fn windows_and_head_dims_between_published_ones() {
    let k = attention_kernel("gb200/cudnn-9.19").unwrap();
    assert_eq!(k.windows(), [(64, 1024)]);
    let at_1024 = k.window_flops_per_s(4096, 64, 1024, false).unwrap();
    assert_eq!(k.window_flops_per_s(4096, 64, 4000, false), Some(at_1024));
    assert_eq!(k.window_flops_per_s(4096, 128, 128, false), Some(at_1024));
    let fa3 = attention_kernel("h100-sxm/flash-attention-3").unwrap();
    assert_eq!(fa3.window_flops_per_s(4096, 128, 128, false), None);
    assert_eq!(
        fa3.pass_flops_per_s(4096, true, 128, Some(128), false),
        fa3.forward_flops_per_s(4096, true, 128)
    );
    assert_eq!(k.full_causal_stand_in(64, 4096), Some(1024));
    assert_eq!(k.full_causal_stand_in(64, 16384), None, "8192 is 8x 1024");
    assert_eq!(k.full_causal_stand_in(128, 4096), None, "published in full");
    assert_eq!(k.pass_flops_per_s(4096, true, 64, None, false), at_1024);
    let new = attention_kernel("gb200/cudnn-9.22").unwrap();
    assert_eq!(new.full_causal_stand_in(64, 4096), None);
    assert_eq!(
        new.pass_flops_per_s(4096, true, 64, None, true),
        new.backward_flops_per_s(4096, true, 128)
    );
}

/// Every point of the Blackwell and windowed cuDNN series is reproduced within 10% by the
/// kernel the time model uses and by the time model itself: a core of the benchmark's shape
/// and FLOPs on the GPU's profile takes the published time per pass, less the launch.
#[test]
fn blackwell_and_window_points_are_within_10_percent() {
    let (mut checked, mut worst) = (0, 0.0f64);
    for s in published_series()
        .iter()
        .filter(|s| s.kernel.starts_with("cudnn-") && (s.gpu != "h100-sxm" || s.window.is_some()))
    {
        let mut gpu = GpuProfile::load(if s.gpu == "h100-sxm" { "h200" } else { &s.gpu }).unwrap();
        let name = format!("{}/{}", s.gpu, s.kernel);
        let k = attention_kernel(&name).expect("kernel");
        gpu.attention_kernel = Some(name);
        let overhead = gpu.efficiency.kernel_overhead_s;
        let rates = Rates {
            gpu: &gpu,
            peak_flops: gpu.peak_flops.bf16,
            element_bytes: 2,
            matmul_efficiency: gpu.efficiency.matmul,
        };
        let backward = s.pass == Pass::Backward;
        for (&len, &published) in s.seq_len.iter().zip(&s.tflops) {
            let model = k.pass_flops_per_s(len, s.causal, s.head_dim, s.window, backward) / 1e12;
            let fwd = 2.0 * benchmark_pairs(len, s.causal, s.window) * 2.0 * s.head_dim as f64;
            let mut op = core(len, s.head_dim, s.window, fwd);
            if let OpKind::Attention { causal, .. } = &mut op.kind {
                *causal = s.causal;
            }
            let (f, b, _) = rates.op_s(&op);
            let timed = if backward {
                2.5 * fwd / (b - overhead)
            } else {
                fwd / (f - overhead)
            } / 1e12;
            for m in [model, timed] {
                let err = (m / published - 1.0).abs();
                worst = worst.max(err);
                assert!(
                    err <= 0.10,
                    "{} {} {:?} causal={} hd{} {:?} s={len}: {m:.0} vs published {published}",
                    s.gpu,
                    s.kernel,
                    s.pass,
                    s.causal,
                    s.head_dim,
                    s.window
                );
            }
            checked += 1;
        }
    }
    // 9.19 on GB200/GB300: 4 full + 2 windowed series x 5 lengths each; 9.22 the same at 4
    // lengths (its 32k points left out); H200's windowed 2 x 5.
    assert_eq!(checked, 2 * 30 + 2 * 24 + 10);
    println!("worst error {:.1}%", 100.0 * worst);
}

fn gpt_oss(gpu: &str, framework: &str, kernel: Option<&str>) -> Resolved {
    let mut c = Config {
        model: parsim::config::presets::preset("gpt-oss-120b").expect("preset"),
        ..Config::default()
    };
    c.cluster.gpu = gpu.into();
    c.cluster.num_gpus = 8;
    c.parallel.ep = 8;
    c.parallel.tp = 1;
    c.parallel.sp = false;
    c.training.seq_length = 4096;
    c.training.global_batch_size = 64;
    c.training.framework = parsim::config::Framework::parse(framework).unwrap();
    c.training.attention_kernel = kernel.map(Into::into);
    Resolved::new(c).expect("resolves")
}

/// Learned sinks under Megatron-Core switch an H100's FlashAttention-3 default to cuDNN's
/// fused kernel (Transformer Engine disables FlashAttention for `softmax_type` learnable),
/// the newest published cuDNN that has sinks (9.19.1 >= 9.13.1); under FSDP (no Transformer
/// Engine attention) the default stays, as does a kernel the user names, and a Blackwell
/// profile's cuDNN 9.22 already has them. The windowed layer's core carries its window and
/// runs slower per FLOP than the full layer's.
#[test]
fn sinks_run_cudnn_under_megatron_core() {
    let kernel = |r: &Resolved| r.gpu.attention_kernel.clone().unwrap();
    assert_eq!(
        kernel(&gpt_oss("h100-sxm", "megatron-core", None)),
        "h100-sxm/cudnn-9.19"
    );
    assert_eq!(
        kernel(&gpt_oss("h100-sxm", "fsdp", None)),
        "h100-sxm/flash-attention-3"
    );
    assert_eq!(
        kernel(&gpt_oss(
            "h100-sxm",
            "megatron-core",
            Some("flash-attention-3")
        )),
        "h100-sxm/flash-attention-3"
    );
    let r = gpt_oss("gb200", "megatron-core", None);
    assert_eq!(kernel(&r), "gb200/cudnn-9.22");
    let ledger = parsim::model::Ledger::build(&r);
    let windowed = ledger.variants[0]
        .ops
        .iter()
        .find(|o| o.name == "attn.core")
        .unwrap();
    assert!(matches!(
        windowed.kind,
        OpKind::Attention {
            window: Some(128),
            head_dim: 64,
            ..
        }
    ));
    let rates = Rates {
        gpu: &r.gpu,
        peak_flops: r.gpu.peak_flops.bf16,
        element_bytes: 2,
        matmul_efficiency: r.gpu.efficiency.matmul,
    };
    let full = ledger.moe.as_ref().unwrap();
    let full = full.ops.iter().find(|o| o.name == "attn.core").unwrap();
    let per_flop = |op: &Op| rates.op_s(op).0 / op.rank_flops.fwd;
    assert!(per_flop(windowed) > 5.0 * per_flop(full));
}
