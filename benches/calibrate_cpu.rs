//! The calibration loop live on the CPU backend: measure the built-in sweep on the executor
//! three times now (each point the fastest of three interleaved runs, with its op timings),
//! fit each sweep alone and the three together (rate tables from the fitting lines' op
//! timings, then the scalars), and print how well each fit predicts the held-out runs, how
//! closely the tables give back the op times, and whether the three sweeps' fitted values
//! agree within their intervals: the figures `tests/calibration/calibrate_cpu.rs` checks on the recorded
//! sweeps. Timings depend on the machine's load: run it on a quiet machine (about 5 minutes
//! on a 2-core host).
//!
//! Run: `cargo bench --bench calibrate_cpu`. Under `cargo test` it only says so.

use parsim::calibrate::loop_fit::{fit_with_tables, fitting_ops, LoopFit};
use parsim::calibrate::measurements::Measurement;
use parsim::calibrate::op_report::compare;
use parsim::calibrate::sweep;
use parsim::config::tables::TableProvenance;
use parsim::config::GpuProfile;

/// Sweeps measured, runs per point in each (the fastest kept), steps per run and warm-up.
const SWEEPS: usize = 3;
const REPEATS: u32 = 3;
const STEPS: u32 = 4;
const WARMUP: u32 = 1;

fn fit(cpu: &GpuProfile, ms: &[Measurement], origin: &str) -> LoopFit {
    let provenance = TableProvenance {
        date: parsim::host::utc_date(),
        device: "this host".into(),
        driver: "none: the CPU backend".into(),
        software: "benches/calibrate_cpu.rs".into(),
    };
    match fit_with_tables(cpu, ms, origin, &provenance) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("calibrate_cpu: the fit failed: {e}");
            std::process::exit(1);
        }
    }
}

/// Median and worst absolute held-out step-time error, and the number of held-out runs.
fn held_out(f: &LoopFit) -> (f64, f64, usize) {
    let mut e: Vec<f64> = f
        .fit
        .rows
        .iter()
        .filter(|r| r.role == "held out")
        .map(|r| r.step_error(true).abs())
        .collect();
    e.sort_by(f64::total_cmp);
    let n = e.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, 0);
    }
    ((e[(n - 1) / 2] + e[n / 2]) / 2.0, e[n - 1], n)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("calibrate_cpu: a live timing benchmark; run it with `cargo bench --bench calibrate_cpu`");
        return;
    }
    let cpu = GpuProfile::load("cpu").expect("the cpu profile ships with parsim");
    let points = sweep::default_cpu_sweep();
    let mut all: Vec<Measurement> = Vec::new();
    let mut fits = Vec::new();
    for s in 0..SWEEPS {
        let started = std::time::Instant::now();
        let ms = match sweep::measure_all(
            &points,
            STEPS,
            WARMUP,
            REPEATS,
            &parsim_executor::runner::run_cpu_for,
            |_| {},
        ) {
            Ok(ms) => ms,
            Err(e) => {
                eprintln!("calibrate_cpu: the sweep failed: {e}");
                std::process::exit(1);
            }
        };
        let f = fit(&cpu, &ms, &format!("live sweep {}", s + 1));
        let (median, worst, n) = held_out(&f);
        println!(
            "sweep {} ({} runs, {:.0} s): held out {n} runs, step time median {:.1}%, worst {:.1}%",
            s + 1,
            ms.len(),
            started.elapsed().as_secs_f64(),
            100.0 * median,
            100.0 * worst
        );
        all.extend(ms.into_iter().map(|mut m| {
            m.line += s * points.len();
            m
        }));
        fits.push(f);
    }
    let f = fit(&cpu, &all, "three live sweeps");
    let (median, worst, n) = held_out(&f);
    println!(
        "three sweeps together (the median of each configuration's runs): R^2 {:.4}, held out {n} runs, step time median {:.1}%, worst {:.1}% (goal 5% / 10%)",
        f.fit.r2,
        100.0 * median,
        100.0 * worst
    );
    for r in f.fit.rows.iter().filter(|r| r.role == "held out") {
        println!(
            "  held out {:34} measured {:8.2} ms predicted {:8.2} ms ({:+5.1}%)",
            r.label,
            1e3 * r.measured_s,
            1e3 * r.after_s,
            100.0 * r.step_error(true)
        );
    }
    let report = compare(&fitting_ops(&all), &cpu, &f.fit.profile);
    for row in report.rows.iter().filter(|r| r.timings > 0) {
        match row.after.error() {
            Some(e) => println!(
                "  tables: {:10} measured {:.3} s, tables {:.3} s ({:+.1}%; goal within 10%)",
                row.class,
                row.measured_s,
                row.after.predicted_s,
                100.0 * e
            ),
            None => println!(
                "  tables: {:10} measured {:.3} s (the schedule's to predict, no table)",
                row.class, row.measured_s
            ),
        }
    }
    println!("fitted values of the three sweeps alone (95% interval; '-' where not fitted):");
    for (i, p) in fits[0].fit.params.iter().enumerate() {
        let cells: Vec<String> = fits
            .iter()
            .map(|f| {
                let q = &f.fit.params[i];
                match q.ci95 {
                    Some((lo, hi)) => format!("{:.4} [{lo:.4}, {hi:.4}]", q.after),
                    None => format!("{:.4} -", q.after),
                }
            })
            .collect();
        let agree = fits.iter().all(|a| {
            fits.iter().all(|b| match b.fit.params[i].ci95 {
                Some((lo, hi)) => (lo..=hi).contains(&a.fit.params[i].after),
                None => true,
            })
        });
        println!(
            "  {:34} {}  {}",
            p.name,
            cells.join(" | "),
            if agree { "agree" } else { "DISAGREE" }
        );
    }
}
