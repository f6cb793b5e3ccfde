//! The closed loop live on the CPU backend, reduced to CI size: a few sweep points measured and
//! fitted (rate tables from their op timings, then the scalars), and parallel mixes the fit
//! never saw (ZeRO-1, TP without SP, full recompute) executed and predicted. The bound is the
//! closed loop's goal (10% worst, docs/calibration.md, "The closed loop") plus the noise this
//! run measures itself: every point runs three times, interleaved, and the largest run-to-run
//! spread of any point is what the machine's load alone moves a timing by. The full loop with
//! its eight unseen configurations is `parsim execute --calibrate --closed-loop`.

use parsim::calibrate::loop_fit::{fit_with_tables, measured_matmul_efficiency};
use parsim::calibrate::measurements::Measurement;
use parsim::calibrate::sweep::{self, SweepPoint};
use parsim::config::tables::TableProvenance;
use parsim::config::GpuProfile;
use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{OpKey, OpTiming};

/// Fitted points: DP 2 at two shapes and micro batch 2, TP 2 + SP at two shapes.
const FITTED: [&str; 5] = [
    "dp2 h256 s256",
    "dp2 h384 s512",
    "dp2 mbs2 h256",
    "tp2 sp h256",
    "tp2 sp h384 s512",
];
/// Unseen mixes at shapes the fitted points' tables span.
const UNSEEN: [&str; 3] = ["dp2 zero1 h256", "tp2 h256 s512", "dp2 recompute full h256"];
/// Runs of each point, interleaved: the fastest is kept (load only adds time), the spread of
/// all of them is the noise.
const REPEATS: usize = 3;
/// The closed loop's goal for its worst unseen configuration.
const WORST_GOAL: f64 = 0.10;

fn points() -> Vec<SweepPoint> {
    let all = sweep::default_cpu_sweep();
    let pick = |label: &str, holdout: bool| {
        let mut p = all
            .iter()
            .find(|p| p.label == label)
            .unwrap_or_else(|| panic!("the built-in sweep has '{label}'"))
            .clone();
        p.holdout = holdout;
        p
    };
    FITTED
        .iter()
        .map(|l| pick(l, false))
        .chain(UNSEEN.iter().map(|l| pick(l, true)))
        .collect()
}

#[test]
fn unseen_mixes_are_predicted_within_the_goal_plus_the_measured_noise() {
    let points = points();
    let mut runs: Vec<Vec<Measurement>> = vec![Vec::new(); points.len()];
    for _ in 0..REPEATS {
        for (i, p) in points.iter().enumerate() {
            let m = sweep::measure(p, i, 4, 1, &parsim_executor::runner::run_cpu_for)
                .unwrap_or_else(|e| panic!("{}: {e}", p.label));
            runs[i].push(m);
        }
    }
    // The noise: the largest spread (slowest over fastest run) of any point.
    let noise = runs
        .iter()
        .map(|r| {
            let s: Vec<f64> = r.iter().map(|m| m.step_s).collect();
            let (lo, hi) = s
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            hi / lo - 1.0
        })
        .fold(0.0, f64::max);
    let ms: Vec<Measurement> = runs
        .into_iter()
        .map(|r| {
            r.into_iter()
                .min_by(|a, b| a.step_s.total_cmp(&b.step_s))
                .expect("measured")
        })
        .collect();
    let cpu = GpuProfile::load("cpu").expect("the cpu profile ships");
    let provenance = TableProvenance {
        date: parsim::host::utc_date(),
        device: "this host".into(),
        driver: "none: the CPU backend".into(),
        software: "tests/calibration/closed_loop.rs".into(),
    };
    let fit = fit_with_tables(&cpu, &ms, "the reduced loop", &provenance)
        .expect("the reduced sweep fits")
        .fit;
    let bound = WORST_GOAL + noise;
    let mut report = Vec::new();
    let mut worst: f64 = 0.0;
    for r in fit.rows.iter().filter(|r| r.role == "held out") {
        let e = r.step_error(true);
        report.push(format!(
            "{}: measured {:.4} s, predicted {:.4} s ({:+.1}%)",
            r.label,
            r.measured_s,
            r.after_s,
            100.0 * e
        ));
        worst = worst.max(e.abs());
    }
    assert_eq!(report.len(), UNSEEN.len(), "{report:?}");
    eprintln!(
        "reduced closed loop: noise {:.1}%, bound {:.1}%\n{}",
        100.0 * noise,
        100.0 * bound,
        report.join("\n")
    );
    assert!(
        worst <= bound,
        "an unseen mix missed by {:.1}%, beyond the goal plus this run's noise ({:.1}%):\n{}",
        100.0 * worst,
        100.0 * bound,
        report.join("\n")
    );
}

/// The roofline's efficiency for GEMMs outside the table is the timings' FLOPs over their
/// seconds at the peak: 10 calls of 2 x 256^3 FLOPs at half the cpu profile's fp32 peak and
/// 10 of 2 x 512 x 256 x 128 FLOPs at a quarter give, time-weighted, the FLOPs of both over
/// the seconds of both. A timing with no GEMM leaves it unset.
#[test]
fn the_fallback_gemm_efficiency_is_the_timings_flops_over_their_seconds() {
    let cpu = GpuProfile::load("cpu").expect("the cpu profile ships");
    let peak = cpu.peak_flops.fp32;
    let gemm = |m: u64, n: u64, k: u64, efficiency: f64| {
        let flops = 2.0 * (m * n * k) as f64;
        OpTiming {
            key: OpKey::Gemm {
                m,
                n,
                k,
                dtype: DType::F32,
            },
            calls: 10,
            total_s: 10.0 * flops / (efficiency * peak),
        }
    };
    let (a, b) = (gemm(256, 256, 256, 0.5), gemm(512, 256, 128, 0.25));
    let flops = 20.0 * 2.0 * (256.0f64.powi(3));
    let expected = flops / peak / (a.total_s + b.total_s);
    let e = measured_matmul_efficiency(&[a.clone(), b], &cpu).expect("GEMMs timed");
    assert!(
        (e - expected).abs() < 1e-12 && (e - 1.0 / 3.0).abs() < 1e-12,
        "{e}"
    );
    let alone = measured_matmul_efficiency(&[a], &cpu).expect("a GEMM timed");
    assert!((alone - 0.5).abs() < 1e-12, "{alone}");
    let memory = OpTiming {
        key: OpKey::Memory { bytes: 1024 },
        calls: 1,
        total_s: 1e-6,
    };
    assert_eq!(measured_matmul_efficiency(&[memory], &cpu), None);
}
