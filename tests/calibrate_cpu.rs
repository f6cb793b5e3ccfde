//! The calibration loop end to end on the CPU backend (its own test binary, so no other test
//! runs beside it): measure the built-in sweep on the executor, fit the CPU profile, and
//! predict the held-out runs, whose model shapes and parallel mixes no fitting run has.
//! Goal (calibration issue): step time within 15%, peak memory within 3%; the test fails
//! beyond 25% / 5%. The errors are printed.

use parsim::calibrate::profile_fit::fit_profile;
use parsim::calibrate::sweep;
use parsim::config::GpuProfile;

#[test]
fn calibrate_then_predict_held_out_cpu_runs() {
    let points = sweep::default_cpu_sweep();
    let ms = sweep::measure_all_cpu(&points, 7, 2, 2, |_| {}).unwrap();
    let fit = fit_profile(&GpuProfile::load("cpu").unwrap(), &ms, "built-in CPU sweep").unwrap();
    println!(
        "fit: R^2 {:.4}, residual spread {:.1}%",
        fit.r2,
        100.0 * fit.residual_rms
    );
    for p in &fit.params {
        println!(
            "  {:34} {:.4e} -> {:.4e} identifiable {}",
            p.name, p.before, p.after, p.identifiable
        );
    }
    let held: Vec<_> = fit.rows.iter().filter(|r| r.role == "held out").collect();
    assert_eq!(held.len(), 3, "the sweep holds out three runs");
    for r in &held {
        let step = r.step_error(true);
        let mem = r.peak_error(true).expect("peak measured");
        println!(
            "  held out {:28} step {:+6.1}% (before the fit {:+6.1}%)  memory {:+5.2}%",
            r.label,
            100.0 * step,
            100.0 * r.step_error(false),
            100.0 * mem
        );
        assert!(
            step.abs() <= 0.25,
            "{}: step time {:+.1}% beyond 25%",
            r.label,
            100.0 * step
        );
        assert!(
            mem.abs() <= 0.05,
            "{}: peak memory {:+.2}% beyond 5%",
            r.label,
            100.0 * mem
        );
    }
    // Link efficiency across nodes cannot be seen on one machine: reported, not moved.
    let inter = fit
        .params
        .iter()
        .find(|p| p.name == "links.inter_node.efficiency")
        .unwrap();
    assert!(!inter.identifiable && inter.before == inter.after);
}
