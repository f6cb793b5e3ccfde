//! The attention kernel model against the published figures it was built from (issue 17,
//! part 1): every point of every series in calibration/data/attention-kernels.json
//! (FlashAttention-3, Shah et al. 2024, Figures 5 and 6: FlashAttention-3, cuDNN and
//! FlashAttention-2 on H100 SXM5, head dim 128) is reproduced within 10% by the fitted curve
//! `max * s / (s + half_s)`, and the time model times an attention core at those rates. The
//! A100 series (FlashAttention-2, Dao 2023, Figure 4: FlashAttention-2 and FlashAttention
//! Triton, forward + backward, head dims 64 and 128, causal and not) are checked the same
//! way, through the kernel the time model uses. So are cuDNN's rates by release (NVIDIA's
//! cudnn-frontend benchmark results for cuDNN 9.1, 9.4.0 and 9.19.1 on H200, held in the
//! GH100 table), which the table's `releases` map from what a user runs.

use parsim::attention_rates::{
    attention_kernel, attention_kernels, derivations, derived_series, kernel_for_release,
    published_series, releases, Pass, RateCurve, Series,
};
use parsim::config::GpuProfile;
use parsim::model::{Flops, Op, OpKind};
use parsim::time::Rates;

/// A fused attention core of one kernel call (`seq_len` long, `causal` or not, head dimension
/// `head_dim`) doing `fwd` forward FLOPs and the ledger's 2 x `fwd` backward.
fn fused_core(seq_len: u64, causal: bool, head_dim: u64, fwd: f64) -> Op {
    let mut op = Op::new(
        "attn.core",
        OpKind::Attention {
            seq_len,
            causal,
            fused: true,
            head_dim,
            ring: None,
            window: None,
        },
    );
    op.rank_flops = Flops {
        fwd,
        dgrad: 2.0 * fwd,
        wgrad: 0.0,
    };
    op
}

#[test]
fn the_shipped_table_parses_and_defines_its_kernels() {
    let series = published_series();
    assert_eq!(
        series.len(),
        9 + 8 + 12 + 2 + 2 * (6 + 6),
        "nine H100 and eight A100 published series, twelve of cuDNN by release on H200 and \
         its window of 1024, six each of cuDNN 9.19 and 9.22 on GB200 and GB300"
    );
    let names: Vec<&str> = attention_kernels()
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "a100-80g/flash-attention-2",
            "a100-80g/flash-attention-triton",
            "gb200/cudnn-9.19",
            "gb200/cudnn-9.22",
            "gb300/cudnn-9.19",
            "gb300/cudnn-9.22",
            "h100-sxm/cudnn",
            "h100-sxm/cudnn-9.1",
            "h100-sxm/cudnn-9.19",
            "h100-sxm/cudnn-9.4",
            "h100-sxm/flash-attention-2",
            "h100-sxm/flash-attention-3",
            "h100-sxm/flash-attention-triton"
        ]
    );
}

#[test]
fn every_published_point_is_within_10_percent_of_its_fitted_curve() {
    let mut worst = 0.0f64;
    for s in published_series() {
        let curve = RateCurve::fit(&s.seq_len, &s.tflops).expect("fit");
        for (&len, &published) in s.seq_len.iter().zip(&s.tflops) {
            let model = curve.flops_per_s(len) / 1e12;
            let err = (model / published - 1.0).abs();
            println!(
                "{} {} {:?} causal={} s={len}: published {published} model {model:.0} ({:+.1}%)",
                s.gpu,
                s.kernel,
                s.pass,
                s.causal,
                100.0 * (model / published - 1.0)
            );
            worst = worst.max(err);
            assert!(
                err <= 0.10,
                "{} {} {:?} causal={} s={len}: model {model:.0} vs published {published}",
                s.gpu,
                s.kernel,
                s.pass,
                s.causal
            );
        }
    }
    println!("worst error {:.1}%", 100.0 * worst);
}

/// The kernel's rate never exceeds the GPU's dense bf16 peak and never falls with sequence
/// length (it rises for every series of the figures; cuDNN 9.1's and 9.4's non-causal
/// forward fall beyond 8k and are fitted flat).
#[test]
fn rates_rise_with_length_and_stay_under_the_bf16_peak() {
    for k in attention_kernels() {
        let gpu = GpuProfile::load(k.name.split('/').next().unwrap()).unwrap();
        for (causal, hd) in [false, true].into_iter().flat_map(|c| [(c, 64), (c, 128)]) {
            let mut last = (0.0, 0.0);
            for s in [256u64, 1024, 4096, 16384, 131_072] {
                let now = (
                    k.forward_flops_per_s(s, causal, hd),
                    k.backward_flops_per_s(s, causal, hd),
                );
                assert!(now.0 >= last.0 && now.1 >= last.1, "{} s={s}", k.name);
                assert!(now.0 < gpu.peak_flops.bf16 && now.1 < gpu.peak_flops.bf16);
                last = now;
            }
        }
    }
}

/// The time model's attention core on an H100 at a published shape takes the published
/// time: forward FLOPs over the forward rate, and 2.5 forward FLOPs over the backward rate
/// (the papers' FLOP count), each within 10% of the figure's number.
#[test]
fn the_time_model_times_attention_at_the_published_rates() {
    let gpu = GpuProfile::load("h100-sxm").unwrap();
    assert_eq!(
        gpu.attention_kernel.as_deref(),
        Some("h100-sxm/flash-attention-3")
    );
    let rates = Rates {
        gpu: &gpu,
        peak_flops: gpu.peak_flops.bf16,
        element_bytes: 2,
        matmul_efficiency: gpu.efficiency.matmul,
    };
    // Fig. 5/6: batch 1, 16 heads of 128, s = 16k; causal FLOPs halved.
    let (s, heads, hd) = (16384.0f64, 16.0, 128.0);
    let full_fwd = 4.0 * s * s * heads * hd;
    // Fig. 6 publishes no causal backward: only the forward is checked under the mask.
    for (causal, fwd_tflops, bwd_tflops) in [(false, 648.0, Some(561.0)), (true, 616.0, None)] {
        let fwd = if causal { full_fwd / 2.0 } else { full_fwd };
        let op = fused_core(16384, causal, 128, fwd);
        let (fwd_s, bwd_s, wgrad_s) = rates.op_s(&op);
        assert_eq!(wgrad_s, 0.0);
        let published_fwd_s = fwd / (fwd_tflops * 1e12);
        assert!(
            (fwd_s / published_fwd_s - 1.0).abs() < 0.10,
            "causal={causal}: {fwd_s} s vs published {published_fwd_s} s"
        );
        if let Some(bwd_tflops) = bwd_tflops {
            let published_bwd_s = 2.5 * fwd / (bwd_tflops * 1e12);
            assert!(
                (bwd_s / published_bwd_s - 1.0).abs() < 0.10,
                "{bwd_s} s vs published {published_bwd_s} s"
            );
        }
    }
    // An unfused core ignores the kernel table (separate matmuls and softmax).
    assert!(attention_kernel("h100-sxm/none").is_none());
    let series = published_series()
        .iter()
        .filter(|s| s.pass == Pass::Backward)
        .count();
    assert_eq!(
        series,
        3 + 6 + 1 + 4 * 3,
        "FA3 paper's three, two per cuDNN release on H200 and its window's, three per cuDNN \
         release on GB200 and GB300"
    );
}

/// Every A100 forward + backward point (FlashAttention-2 Figure 4) is reproduced within 10% by
/// the kernel the time model uses, at the published head dimension, and the time model times
/// an attention core of that shape (3.5 forward FLOPs in the paper's count) at the published
/// rate: a second path through `Rates::op_s` rather than the curve alone.
#[test]
fn a100_forward_backward_points_are_within_10_percent() {
    let gpu = GpuProfile::load("a100-80g").unwrap();
    let rates = Rates {
        gpu: &gpu,
        peak_flops: gpu.peak_flops.bf16,
        element_bytes: 2,
        matmul_efficiency: gpu.efficiency.matmul,
    };
    let mut checked = 0;
    for s in published_series()
        .iter()
        .filter(|s| s.pass == Pass::ForwardBackward)
    {
        let k = attention_kernel(&format!("{}/{}", s.gpu, s.kernel)).expect("kernel");
        assert_eq!(k.head_dims(), [64, 128]);
        for (&len, &published) in s.seq_len.iter().zip(&s.tflops) {
            let model = k.forward_backward_flops_per_s(len, s.causal, s.head_dim) / 1e12;
            // Figure 4: 16k tokens per batch, hidden 2048.
            let heads = 2048.0 / s.head_dim as f64;
            let batch = 16384.0 / len as f64;
            let full = 4.0 * batch * heads * (len * len * s.head_dim) as f64;
            let fwd = if s.causal { full / 2.0 } else { full };
            let op = fused_core(len, s.causal, s.head_dim, fwd);
            let timed = if s.kernel == "flash-attention-2" {
                let (f, b, _) = rates.op_s(&op);
                let overhead = 2.0 * gpu.efficiency.kernel_overhead_s;
                Some(3.5 * fwd / (f + b - overhead) / 1e12)
            } else {
                None
            };
            println!(
                "{} causal={} hd{} s={len}: published {published} kernel {model:.0} time model {:?}",
                s.kernel, s.causal, s.head_dim, timed
            );
            for m in [Some(model), timed].into_iter().flatten() {
                assert!(
                    (m / published - 1.0).abs() <= 0.10,
                    "{} causal={} hd{} s={len}: model {m:.0} vs published {published}",
                    s.kernel,
                    s.causal,
                    s.head_dim
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 48);
}

/// A profile naming a kernel the table lacks is refused, naming the field.
#[test]
fn an_unknown_kernel_is_a_clear_error() {
    let text = include_str!("../../calibration/h100-sxm.toml").replace(
        "attention_kernel = \"h100-sxm/flash-attention-3\"",
        "attention_kernel = \"h100-sxm/flash-attention-9\"",
    );
    let err = GpuProfile::parse(&text, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("attention_kernel"), "{err}");
    assert!(err.contains("flash-attention-9"), "{err}");
}

fn llama3_8b(gpu: &str, kernel: Option<&str>) -> parsim::config::Config {
    let mut c = parsim::config::Config::default();
    c.cluster.gpu = gpu.into();
    c.training.seq_length = 16384;
    c.training.attention_kernel = kernel.map(Into::into);
    c
}

/// `training.attention_kernel` picks another published kernel on the profile's GPU: the
/// older FlashAttention-2 (published slower than FlashAttention-3 at every length) gives a
/// longer step, "none" falls back to the fitted scalar, and unknown names are refused.
#[test]
fn the_training_setting_picks_the_kernel_and_refuses_unknown_ones() {
    use parsim::config::Resolved;
    use parsim::estimate::estimate;
    let step = |kernel| {
        estimate(&Resolved::new(llama3_8b("h100-sxm", kernel)).unwrap())
            .unwrap()
            .time
            .step_s
    };
    let (fa3, fa2) = (step(None), step(Some("flash-attention-2")));
    assert!(fa2 > fa3, "FA2 {fa2} s vs FA3 {fa3} s");
    assert_eq!(step(Some("flash-attention-3")), fa3);
    assert!(step(Some("none")).is_finite());
    let err = Resolved::new(llama3_8b("h100-sxm", Some("flash-attention-9")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("training.attention_kernel"), "{err}");
    assert!(
        err.contains("flash-attention-3"),
        "lists the known kernels: {err}"
    );
    let err = Resolved::new(llama3_8b("a100-80g", Some("cudnn")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("training.attention_kernel"), "{err}");
}

/// The published points of one series (gpu, kernel, pass, mask, head dimension).
fn points(gpu: &str, kernel: &str, pass: Pass, causal: bool, head_dim: u64) -> &'static Series {
    published_series()
        .iter()
        .find(|s| {
            s.gpu == gpu
                && s.kernel == kernel
                && s.pass == pass
                && s.causal == causal
                && s.head_dim == head_dim
        })
        .unwrap_or_else(|| panic!("{gpu}/{kernel} {pass:?} causal={causal} hd{head_dim}"))
}

/// FlashAttention's Triton kernel on H100 has no published rates; the table derives them
/// (its `derived` entry): each A100 point (FlashAttention-2 paper, Figure 4) times
/// FlashAttention-2's H100 / A100 forward + backward rate. Recomputed here from the raw
/// published numbers, not from the fitted curves: H100 forward F and backward B give the
/// forward + backward rate 3.5 / (1/F + 2.5/B) (the papers' FLOP count), and under the mask,
/// where Figure 6 has no backward, B times the forward's causal / non-causal ratio (the
/// stated assumption of `backward_flops_per_s`). The derived kernel the time model uses
/// reproduces every derived point within 10%.
#[test]
fn the_h100_triton_kernel_is_the_a100_one_scaled_by_flash_attention_2() {
    assert_eq!(derivations().len(), 1);
    assert!(derivations()[0].assumption.contains("wgmma"));
    let k = attention_kernel("h100-sxm/flash-attention-triton").expect("derived kernel");
    assert_eq!(k.head_dims(), [64, 128]);
    let fwd = points("h100-sxm", "flash-attention-2", Pass::Forward, false, 128);
    let fwd_causal = points("h100-sxm", "flash-attention-2", Pass::Forward, true, 128);
    let bwd = points("h100-sxm", "flash-attention-2", Pass::Backward, false, 128);
    let mut checked = 0;
    for causal in [false, true] {
        let a100_fa2 = points(
            "a100-80g",
            "flash-attention-2",
            Pass::ForwardBackward,
            causal,
            128,
        );
        for hd in [64, 128] {
            let triton = points(
                "a100-80g",
                "flash-attention-triton",
                Pass::ForwardBackward,
                causal,
                hd,
            );
            for (i, &len) in triton.seq_len.iter().enumerate() {
                assert_eq!(fwd.seq_len[i], len);
                let f = if causal {
                    fwd_causal.tflops[i]
                } else {
                    fwd.tflops[i]
                };
                let b = if causal {
                    bwd.tflops[i] * fwd_causal.tflops[i] / fwd.tflops[i]
                } else {
                    bwd.tflops[i]
                };
                let h100_fa2 = 3.5 / (1.0 / f + 2.5 / b);
                let expected = triton.tflops[i] * h100_fa2 / a100_fa2.tflops[i];
                let model = k.forward_backward_flops_per_s(len, causal, hd) / 1e12;
                println!("causal={causal} hd{hd} s={len}: derived {expected:.0} kernel {model:.0}");
                assert!(
                    (model / expected - 1.0).abs() <= 0.10,
                    "causal={causal} hd{hd} s={len}: kernel {model:.0} vs derived {expected:.0}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
    assert_eq!(derived_series().len(), 4);
    // The derivation lifts the kernel by FlashAttention-2's speed-up, never to FA3's rates.
    let fa3 = attention_kernel("h100-sxm/flash-attention-3").unwrap();
    for len in [1024, 16384] {
        assert!(
            k.forward_backward_flops_per_s(len, true, 128)
                < fa3.forward_backward_flops_per_s(len, true, 128)
        );
    }
}

/// Every point of cuDNN's rates by release (cudnn-frontend's benchmark CSVs: cuDNN 9.1 and
/// 9.4.0 at 16 heads of 128, 4k-64k; 9.19.1 at Llama 3.1's 64 query heads of 128, 2k-32k;
/// forward and backward, causal and not) is reproduced within 10% by the kernel the time
/// model uses, and by the time model itself: an attention core of the published shape on a
/// profile timing that kernel takes the published time for each pass (the backward's 2.5
/// forward FLOPs over the backward rate), less the per-kernel launch overhead it adds.
#[test]
fn cudnn_release_points_are_within_10_percent() {
    let mut gpu = GpuProfile::load("h200").unwrap();
    let overhead = gpu.efficiency.kernel_overhead_s;
    let (mut checked, mut worst) = (0, 0.0f64);
    for s in published_series()
        .iter()
        .filter(|s| s.kernel.starts_with("cudnn-") && s.gpu == "h100-sxm" && s.window.is_none())
    {
        assert_eq!(s.measured_on.as_deref(), Some("H200"));
        let name = format!("{}/{}", s.gpu, s.kernel);
        let k = attention_kernel(&name).expect("kernel");
        gpu.attention_kernel = Some(name);
        let rates = Rates {
            gpu: &gpu,
            peak_flops: gpu.peak_flops.bf16,
            element_bytes: 2,
            matmul_efficiency: gpu.efficiency.matmul,
        };
        let heads = if s.kernel == "cudnn-9.19" { 64.0 } else { 16.0 };
        for (&len, &published) in s.seq_len.iter().zip(&s.tflops) {
            let model = match s.pass {
                Pass::Forward => k.forward_flops_per_s(len, s.causal, 128),
                Pass::Backward => k.backward_flops_per_s(len, s.causal, 128),
                Pass::ForwardBackward => unreachable!("published per pass"),
            } / 1e12;
            let full = 4.0 * heads * (len * len * 128) as f64;
            let fwd = if s.causal { full / 2.0 } else { full };
            let op = fused_core(len, s.causal, 128, fwd);
            let (f, b, _) = rates.op_s(&op);
            let timed = match s.pass {
                Pass::Forward => fwd / (f - overhead),
                _ => 2.5 * fwd / (b - overhead),
            } / 1e12;
            println!(
                "{} {:?} causal={} s={len}: published {published} kernel {model:.0} time model {timed:.0}",
                s.kernel, s.pass, s.causal
            );
            for m in [model, timed] {
                let err = (m / published - 1.0).abs();
                worst = worst.max(err);
                assert!(
                    err <= 0.10,
                    "{} {:?} causal={} s={len}: model {m:.0} vs published {published}",
                    s.kernel,
                    s.pass,
                    s.causal
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 60);
    println!("worst error {:.1}%", 100.0 * worst);
}

/// A release names the kernel of its cuDNN, and `training.attention_kernel` takes it on the
/// H100 and H200 profiles: an NGC container or cuDNN release resolves to published rates,
/// and the release the FlashAttention-3 paper's cuDNN series ran (9.1.1.17) is its
/// "cudnn". A release with no published rates of its cuDNN names none and says why.
#[test]
fn releases_resolve_to_kernels_the_configuration_accepts() {
    use parsim::config::Resolved;
    assert_eq!(kernel_for_release("cudnn-9.1.1"), Some("cudnn"));
    assert_eq!(kernel_for_release("cudnn-9.4.0"), Some("cudnn-9.4"));
    assert_eq!(kernel_for_release("ngc-pytorch-25.11"), None);
    let with_kernel: Vec<&str> = releases()
        .iter()
        .filter_map(|r| r.kernel.as_deref())
        .collect();
    assert_eq!(
        with_kernel,
        [
            "cudnn",
            "cudnn-9.1",
            "cudnn-9.4",
            "cudnn-9.19",
            "cudnn-9.22"
        ]
    );
    for gpu in ["b200", "gb200", "b300", "gb300"] {
        for kernel in ["cudnn-9.19", "cudnn-9.22", "cudnn-9.22.0"] {
            let r = Resolved::new(llama3_8b(gpu, Some(kernel)));
            assert!(r.is_ok(), "{gpu} {kernel}: {:?}", r.err());
        }
    }
    for gpu in ["h100-sxm", "h200"] {
        for kernel in &with_kernel[..4] {
            let r = Resolved::new(llama3_8b(gpu, Some(kernel)));
            assert!(r.is_ok(), "{gpu} {kernel}: {:?}", r.err());
        }
    }
    for r in releases().iter().filter(|r| r.kernel.is_none()) {
        assert!(!r.why.as_deref().unwrap_or("").is_empty(), "{}", r.release);
    }
}
