//! The GEMM model against the published rates it was built from (issue 17, part 1):
//! calibration/data/gemm-rates.json holds each accelerator's Maximum Achievable Matmul FLOPS
//! (Bekman, Machine Learning Engineering Open Book: the best of a scan of matmul shapes). Each
//! profile's `gemm.achievable_*_fraction` is that rate over the profile's own peak, and the
//! time model (the fraction times the wave quantisation of the profile's output tiles)
//! reproduces each rate within 10% at its best shape.

use parsim::config::{GpuProfile, Precision};
use parsim::time::Rates;

struct Point {
    accelerator: String,
    profiles: Vec<String>,
    fp8: bool,
    tflops: f64,
    shape: [u64; 3],
}

fn points() -> Vec<Point> {
    let text = std::fs::read_to_string("calibration/data/gemm-rates.json").unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["source"]["url"].as_str().unwrap().starts_with("https://"));
    v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let shape: Vec<u64> = p["shape_mnk"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            Point {
                accelerator: p["accelerator"].as_str().unwrap().into(),
                profiles: p["profiles"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().into())
                    .collect(),
                fp8: match p["dtype"].as_str().unwrap() {
                    "bf16" => false,
                    "fp8" => true,
                    d => panic!("unknown dtype {d}"),
                },
                tflops: p["tflops"].as_f64().unwrap(),
                shape: [shape[0], shape[1], shape[2]],
            }
        })
        .collect()
}

/// The profile's peak and shipped fraction for a point's dtype.
fn peak_and_fraction(gpu: &GpuProfile, fp8: bool) -> (f64, Option<f64>) {
    if fp8 {
        (
            gpu.peak_flops.fp8.expect("an FP8 peak"),
            gpu.gemm.achievable_fp8_fraction,
        )
    } else {
        (gpu.peak_flops.bf16, gpu.gemm.achievable_bf16_fraction)
    }
}

#[test]
fn every_profile_carries_its_measured_fraction() {
    let pts = points();
    assert_eq!(pts.len(), 8);
    for p in &pts {
        for name in &p.profiles {
            let gpu = GpuProfile::load(name).unwrap();
            let (peak, shipped) = peak_and_fraction(&gpu, p.fp8);
            let by_hand = (p.tflops * 1e12 / peak * 1000.0).round() / 1000.0;
            assert_eq!(
                shipped,
                Some(by_hand),
                "{name}: {} {} TF over the profile's peak",
                p.accelerator,
                p.tflops
            );
        }
    }
    // Every shipped GPU profile has a bf16 measurement.
    for name in ["a100-40g", "a100-80g", "h100-sxm", "h200", "b200", "mi300x"] {
        let gpu = GpuProfile::load(name).unwrap();
        assert!(gpu.gemm.achievable_bf16_fraction.is_some(), "{name}");
    }
}

#[test]
fn the_gemm_model_reproduces_each_measured_rate_within_10_percent() {
    for p in points() {
        for name in &p.profiles {
            let mut gpu = GpuProfile::load(name).unwrap();
            let (peak, fraction) = peak_and_fraction(&gpu, p.fp8);
            // The kernel alone: no launch overhead, the measured share as the efficiency.
            gpu.efficiency.kernel_overhead_s = 0.0;
            let rates = Rates {
                gpu: &gpu,
                peak_flops: peak,
                element_bytes: if p.fp8 { 1 } else { 2 },
                matmul_efficiency: fraction.unwrap(),
            };
            let [m, n, k] = p.shape;
            let flops = 2.0 * m as f64 * n as f64 * k as f64;
            let model_tflops = flops / rates.gemm_s(m, n, k) / 1e12;
            let err = model_tflops / p.tflops - 1.0;
            println!(
                "{name} {} {m}x{n}x{k}: model {model_tflops:.1} TF vs measured {} ({:+.1}%)",
                if p.fp8 { "fp8" } else { "bf16" },
                p.tflops,
                100.0 * err
            );
            assert!(err.abs() <= 0.10, "{name} {}: {err:+.3}", p.accelerator);
        }
    }
}

/// A large FP8 GEMM on H100 runs at 1978.9 TF x matmul x 0.709 / 0.803, and a GPU of the
/// H100 family without training rows takes H100's fitted share scaled by its own measured
/// GEMM rate (MI300X: 0.788 x 0.511 / 0.803 = 0.501).
#[test]
fn fp8_and_other_gpus_use_their_own_measured_shares() {
    let h100 = GpuProfile::load("h100-sxm").unwrap();
    let e = h100.efficiency.matmul;
    let fp8 = h100.matmul_efficiency_for(Precision::Fp8);
    assert!((fp8 - e * 0.709 / 0.803).abs() < 1e-12);
    assert_eq!(h100.matmul_efficiency_for(Precision::Bf16), e);
    let mi300x = GpuProfile::load("mi300x").unwrap();
    assert_eq!(
        parsim::calibrate::fit::transfer_matmul(e, &mi300x, &h100),
        mi300x.efficiency.matmul
    );
    assert!(
        (mi300x.efficiency.matmul - (e * 0.511 / 0.803 * 1000.0).round() / 1000.0).abs() < 1e-12
    );
}
