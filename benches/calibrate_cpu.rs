//! The calibration loop live on the CPU backend: measure the built-in sweep on the executor
//! now, fit the CPU profile, and print how well it predicts the held-out runs (step time and
//! peak memory). Timings depend on the machine's load: run it on a quiet machine.
//!
//! Run: `cargo bench --bench calibrate_cpu`. Under `cargo test` it only says so.

use parsim::calibrate::profile_fit::fit_profile;
use parsim::calibrate::sweep;
use parsim::config::GpuProfile;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("calibrate_cpu: a live timing benchmark; run it with `cargo bench --bench calibrate_cpu`");
        return;
    }
    let points = sweep::default_cpu_sweep();
    let ms = match sweep::measure_all(
        &points,
        7,
        2,
        2,
        &parsim_executor::runner::run_cpu_for,
        |_| {},
    ) {
        Ok(ms) => ms,
        Err(e) => {
            eprintln!("calibrate_cpu: the sweep failed: {e}");
            std::process::exit(1);
        }
    };
    let cpu = GpuProfile::load("cpu").expect("the cpu profile ships with parsim");
    let fit = match fit_profile(&cpu, &ms, "live CPU sweep") {
        Ok(fit) => fit,
        Err(e) => {
            eprintln!("calibrate_cpu: the fit failed: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "fit on {} runs: R^2 {:.4}, residual spread {:.1}%",
        ms.len(),
        fit.r2,
        100.0 * fit.residual_rms
    );
    for r in fit.rows.iter().filter(|r| r.role == "held out") {
        println!(
            "  held out {:28} step {:+6.1}% (before the fit {:+6.1}%)  memory {:+5.2}%",
            r.label,
            100.0 * r.step_error(true),
            100.0 * r.step_error(false),
            100.0 * r.peak_error(true).unwrap_or(f64::NAN)
        );
    }
}
