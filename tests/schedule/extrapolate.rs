//! The extrapolated long-pipeline summary equals the full simulation: a second method in the
//! code (a full event simulation of every action) checks the first.

use parsim::schedule::{generate, simulate, simulate_extrapolated, Costs, ScheduleKind};

fn costs(pp: u32, vpp: u32, seed: u64, skew: f64) -> Costs {
    // Uneven, deterministic per-stage durations: heavier first and last stages, as the
    // embedding and the output layer make them, plus a nonzero hop.
    let n = (pp * vpp) as usize;
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        0.8 + 0.4 * ((x >> 33) as f64 / (1u64 << 31) as f64)
    };
    let mut f: Vec<f64> = (0..n).map(|_| next()).collect();
    let i: Vec<f64> = (0..n).map(|_| next()).collect();
    let w: Vec<f64> = (0..n).map(|_| 0.5 * next()).collect();
    f[0] += 0.3 * skew;
    f[n - 1] += 0.6 * skew;
    Costs::from_split(f, i, w, 0.05, vec![0.02; n - 1]).unwrap()
}

#[test]
fn extrapolation_matches_full_simulation() {
    let cases = [
        (ScheduleKind::Gpipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::Interleaved1F1B, 4),
        (ScheduleKind::ZbV, 2),
        (ScheduleKind::DualPipeV, 2),
    ];
    let mut checked = 0;
    for (kind, vpp) in cases {
        for pp in [2u32, 3, 4, 8] {
            for (m, skew) in [
                (7 * pp, 1.0),
                (12 * pp, 3.0),
                (16 * pp + pp / 2, 0.0),
                (31 * pp, 1.0),
                (40 * pp + 1, 2.0),
                (64 * pp, 5.0),
            ] {
                let m = if kind == ScheduleKind::Interleaved1F1B {
                    m - m % pp
                } else {
                    m
                };
                let c = costs(pp, vpp, (pp * 1000 + m) as u64, skew);
                let full = simulate(&generate(kind, pp, vpp, m).unwrap(), &c).unwrap();
                let ext = simulate_extrapolated(kind, pp, vpp, m, &c).unwrap();
                let rel = |a: f64, b: f64| ((a - b) / b).abs();
                assert!(
                    rel(ext.makespan, full.makespan) < 1e-9,
                    "{kind} pp{pp} v{vpp} m{m}: {} vs {}",
                    ext.makespan,
                    full.makespan
                );
                for r in 0..pp as usize {
                    let end = full.timeline[r].last().unwrap().end;
                    assert!(
                        rel(ext.finish[r], end) < 1e-9,
                        "{kind} pp{pp} m{m} rank {r} finish"
                    );
                    assert!(rel(ext.busy[r], full.busy[r]) < 1e-9, "{kind} busy");
                }
                assert_eq!(
                    ext.peak_inflight, full.peak_inflight,
                    "{kind} pp{pp} v{vpp} m{m} peaks"
                );
                assert!((ext.bubble_fraction - full.bubble_fraction).abs() < 1e-9);
                checked += ext.extrapolated as u32;
            }
        }
    }
    assert!(
        checked > 50,
        "most cases are long enough to extrapolate ({checked})"
    );
}

/// GPipe whose slowest forward and slowest backward stages are different ranks (the first
/// stage holds more layers, the last the output layer's backward): the makespan grows by
/// max F + max B per microbatch while no rank is busy all the time, so the steady state shows
/// as a constant slope, not as a fully busy rank. The extrapolation must stop doubling there
/// (it once doubled to the cell limit, seconds per estimate) and still equal the full run.
#[test]
fn gpipe_with_the_slowest_forward_and_backward_on_different_ranks() {
    for pp in [2u32, 4] {
        let n = pp as usize;
        let mut f = vec![1.0; n];
        let mut i = vec![1.0; n];
        f[0] = 1.4; // the heavier first stage's forward
        i[n - 1] = 1.9; // the output layer's backward on the last
        let w = vec![0.5; n];
        let c = Costs::from_split(f, i, w, 0.05, vec![0.02; n - 1]).unwrap();
        for m in [64 * pp, 1000 * pp + 3] {
            let full = simulate(&generate(ScheduleKind::Gpipe, pp, 1, m).unwrap(), &c).unwrap();
            let t = std::time::Instant::now();
            let ext = simulate_extrapolated(ScheduleKind::Gpipe, pp, 1, m, &c).unwrap();
            let rel = ((ext.makespan - full.makespan) / full.makespan).abs();
            assert!(
                rel < 1e-9,
                "pp{pp} m{m}: {} vs {}",
                ext.makespan,
                full.makespan
            );
            eprintln!("pp{pp} m{m}: extrapolated in {:?}", t.elapsed());
        }
        // A run far past the cell limit still extrapolates (it would refuse to simulate).
        let big = simulate_extrapolated(ScheduleKind::Gpipe, pp, 1, 1 << 29, &c).unwrap();
        assert!(big.makespan.is_finite() && big.makespan > 0.0);
    }
}
