//! The simulator against the textbook closed forms. Every expected value is computed here
//! from its published formula (cited at each test); none is taken from the simulator.

use parsim::schedule::{
    generate, generate_with, simulate, ActionKind, Costs, GenerateOptions, Program, ScheduleKind,
    Simulation,
};

const EPS: f64 = 1e-9;

fn sim(kind: ScheduleKind, pp: u32, vpp: u32, m: u32, costs: &Costs) -> (Program, Simulation) {
    let p = generate(kind, pp, vpp, m).unwrap();
    let s = simulate(&p, costs).unwrap();
    (p, s)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < EPS * (1.0 + b.abs())
}

// ---------------------------------------------------------------------------------------
// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
// Using Megatron-LM"), §2.2: with F = B and free communication the bubble is (p-1)/m of the
// ideal time for GPipe and 1F1B, and (p-1)/(v m) for interleaved 1F1B.
// ---------------------------------------------------------------------------------------

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m() {
    for kind in [ScheduleKind::Gpipe, ScheduleKind::OneFOneB] {
        for pp in 2..=8u32 {
            for m in pp..=4 * pp {
                let costs = Costs::uniform(pp, 1, 1.0, 1.0, None, 0.0).unwrap();
                let (_, s) = sim(kind, pp, 1, m, &costs);
                let expected = (pp as f64 - 1.0) / m as f64;
                assert!(
                    close(s.bubble_fraction, expected),
                    "{kind} pp={pp} m={m}: {} vs {expected}",
                    s.bubble_fraction
                );
            }
        }
    }
}

#[test]
fn interleaved_bubble_is_p_minus_1_over_v_m() {
    for pp in 2..=8u32 {
        for v in 2..=4u32 {
            for m in pp..=4 * pp {
                // Megatron's default group size N = pp needs m % pp == 0; other counts run
                // with the smallest N Megatron accepts (pp <= N <= m, m % N == 0 or >= pp).
                let n = (pp..=m).find(|n| m % n == 0 || m % n >= pp).unwrap();
                let opts = GenerateOptions {
                    microbatch_group_size: Some(n),
                };
                let program =
                    generate_with(ScheduleKind::Interleaved1F1B, pp, v, m, &opts).unwrap();
                let costs = Costs::uniform(pp, v, 1.0, 1.0, None, 0.0).unwrap();
                let s = simulate(&program, &costs).unwrap();
                let expected = (pp as f64 - 1.0) / (v as f64 * m as f64);
                assert!(
                    close(s.bubble_fraction, expected),
                    "pp={pp} v={v} m={m} N={n}: {} vs {expected}",
                    s.bubble_fraction
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// DualPipe README (deepseek-ai/DualPipe), "Pipeline Bubbles and Memory Usage Comparison":
//   1F1B      (PP-1)(F+B)
//   ZB1P      (PP-1)(F+B-2W)
//   DualPipe  (PP/2-1)(F&B+B-3W)     DualPipeV: same, on PP/2 devices
// F a forward chunk, B a full backward chunk, W its weight part, F&B an overlapped forward-and-
// backward slot; PP is the number of *stages* ("based on the same number of PP stages"), so
// DualPipeV on p ranks has PP = 2p. The bubble is idle time per device.
// ---------------------------------------------------------------------------------------

/// Unit F, I, W (B = I + W = 2), as the issue asks, and F = I = 2W (the W pass about half
/// of the input-gradient pass, close to the zero-bubble paper's measurements).
const RATIOS: [(f64, f64, f64); 2] = [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0)];

#[test]
fn readme_1f1b_bubble() {
    for (f, i, w) in RATIOS {
        let b = i + w;
        for pp in 2..=8u32 {
            for m in pp..=4 * pp {
                let costs = Costs::uniform(pp, 1, f, i, Some(w), 0.0).unwrap();
                let (_, s) = sim(ScheduleKind::OneFOneB, pp, 1, m, &costs);
                let expected = (pp as f64 - 1.0) * (f + b);
                for (r, idle) in s.idle.iter().enumerate() {
                    assert!(close(*idle, expected), "pp={pp} m={m} rank {r}: {idle}");
                }
            }
        }
    }
}

#[test]
fn readme_zb1p_bubble_for_zb_h1() {
    for (f, i, w) in RATIOS {
        let b = i + w;
        for pp in 2..=8u32 {
            for m in pp..=4 * pp {
                let costs = Costs::uniform(pp, 1, f, i, Some(w), 0.0).unwrap();
                let (_, s) = sim(ScheduleKind::ZbH1, pp, 1, m, &costs);
                let expected = (pp as f64 - 1.0) * (f + b - 2.0 * w);
                for (r, idle) in s.idle.iter().enumerate() {
                    assert!(close(*idle, expected), "pp={pp} m={m} rank {r}: {idle}");
                }
            }
        }
    }
}

/// Where the ZB1P form cannot hold: with W longer than F and I, a W no longer fits the hole
/// one F/I hop leaves, so the bubble stays at (p-1) F per rank instead of shrinking to
/// (p-1)(F+I-W). The simulation must not beat the physical lower bound (p-1) F: rank p-1
/// cannot start before p-1 forwards have run upstream.
#[test]
fn zb1p_form_does_not_apply_when_w_exceeds_f_and_i() {
    let (f, i, w) = (1.0, 0.8, 1.2);
    for pp in 2..=8u32 {
        let costs = Costs::uniform(pp, 1, f, i, Some(w), 0.0).unwrap();
        let (_, s) = sim(ScheduleKind::ZbH1, pp, 1, 2 * pp, &costs);
        let readme = (pp as f64 - 1.0) * (f + i + w - 2.0 * w);
        let lower = (pp as f64 - 1.0) * f;
        let max_idle = s.idle.iter().cloned().fold(0.0, f64::max);
        assert!(max_idle > readme + 0.1, "pp={pp}: {max_idle} vs {readme}");
        assert!(max_idle >= lower - EPS);
    }
}

#[test]
fn readme_dualpipe_bubble_for_dualpipe_v() {
    for (f, i, w) in RATIOS {
        let b = i + w;
        for pp in 2..=8u32 {
            for m in 2 * pp..=4 * pp {
                // F&B = F + B: overlap factor 1, as the README's schedule figure draws it.
                let costs = Costs::uniform(pp, 2, f, i, Some(w), 0.0).unwrap();
                let (_, s) = sim(ScheduleKind::DualPipeV, pp, 2, m, &costs);
                let stages = 2 * pp;
                let f_and_b = f + b;
                let expected = (stages as f64 / 2.0 - 1.0) * (f_and_b + b - 3.0 * w);
                for (r, idle) in s.idle.iter().enumerate() {
                    assert!(close(*idle, expected), "pp={pp} m={m} rank {r}: {idle}");
                }
            }
        }
    }
}

/// With a measured overlap (F&B = 0.8 (F + B)) ranks overlap different numbers of slots
/// (rank r runs 2m - 3p + r + 1 overlapped slots, the last rank one fewer), so their idle
/// times differ; the README's per-device figure is the largest of them.
#[test]
fn readme_dualpipe_bubble_with_overlap_factor_is_the_largest_idle() {
    let factor = 0.8;
    for (f, i, w) in RATIOS {
        let b = i + w;
        for pp in 2..=8u32 {
            let m = 3 * pp;
            let costs = Costs::uniform(pp, 2, f, i, Some(w), 0.0)
                .unwrap()
                .with_overlap_factor(factor)
                .unwrap();
            let (_, s) = sim(ScheduleKind::DualPipeV, pp, 2, m, &costs);
            let expected = (pp as f64 - 1.0) * (factor * (f + b) + b - 3.0 * w);
            let max_idle = s.idle.iter().cloned().fold(0.0, f64::max);
            assert!(
                close(max_idle, expected),
                "pp={pp}: {max_idle} vs {expected}"
            );
        }
    }
}

/// Where the DualPipe form does not apply: it is derived for F equal to the input-gradient
/// part I (unit times, or F = I = 2W). With F twice I the V's turns no longer line up and
/// the simulated bubble is larger than the form; with I longer than F it is smaller. The test
/// records that the two differ, so that a change in either shows.
#[test]
fn dualpipe_form_assumes_f_equal_to_i() {
    for (f, i, w) in [(2.0, 1.0, 1.0), (1.0, 1.5, 0.5)] {
        let b = i + w;
        let pp = 4;
        let costs = Costs::uniform(pp, 2, f, i, Some(w), 0.0).unwrap();
        let (_, s) = sim(ScheduleKind::DualPipeV, pp, 2, 4 * pp, &costs);
        let readme = (pp as f64 - 1.0) * (f + b + b - 3.0 * w);
        assert!((s.idle[0] - readme).abs() > 0.1, "f={f} i={i} w={w}");
    }
}

/// Sea AI Lab's ZB-V table (bubble rate 0 for T_F = T_B = T_W): once started, no rank idles;
/// each rank's only idle time is its start-up offset of (p-1) forwards of the skewed
/// "parallelogram" that the zero-bubble paper's optimizer post-validation lets consecutive
/// steps fill.
#[test]
fn zbv_has_no_bubble_inside_the_parallelogram_with_unit_times() {
    for pp in 2..=8u32 {
        for m in 2 * pp..=4 * pp {
            let costs = Costs::uniform(pp, 2, 1.0, 1.0, Some(1.0), 0.0).unwrap();
            let (_, s) = sim(ScheduleKind::ZbV, pp, 2, m, &costs);
            for (r, spans) in s.timeline.iter().enumerate() {
                let first = spans.first().unwrap().start;
                let last = spans.iter().map(|x| x.end).fold(0.0, f64::max);
                assert!(
                    close(last - first, s.busy[r]),
                    "pp={pp} m={m} rank {r} has a gap"
                );
                assert!(close(s.idle[r], pp as f64 - 1.0), "pp={pp} m={m} rank {r}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Peak live activation sets, against the simulator's own tracking (`peak_inflight`) and an
// independent time sweep over the simulated spans.
// ---------------------------------------------------------------------------------------

/// Live sets from the timeline: +1 when an F starts, -1 when the action that frees it ends
/// (B, or W when split); frees are applied before starts at equal times.
fn swept_peaks(program: &Program, s: &Simulation) -> Vec<u32> {
    program
        .ranks
        .iter()
        .zip(&s.timeline)
        .map(|(acts, spans)| {
            let mut ev: Vec<(f64, i32)> = Vec::new();
            for (a, sp) in acts.iter().zip(spans) {
                match a.kind {
                    ActionKind::F => ev.push((sp.start, 1)),
                    ActionKind::B | ActionKind::W => ev.push((sp.end, -1)),
                    ActionKind::I => {}
                }
            }
            ev.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap().then(x.1.cmp(&y.1)));
            let (mut live, mut peak) = (0i32, 0i32);
            for (_, d) in ev {
                live += d;
                peak = peak.max(live);
            }
            peak as u32
        })
        .collect()
}

fn peaks(kind: ScheduleKind, pp: u32, vpp: u32, m: u32) -> (Vec<u32>, Vec<u32>) {
    let costs = Costs::uniform(pp, vpp, 1.0, 1.5, Some(0.7), 0.1).unwrap();
    let (p, s) = sim(kind, pp, vpp, m, &costs);
    let swept = swept_peaks(&p, &s);
    (s.peak_inflight, swept)
}

#[test]
fn gpipe_peak_is_m_on_every_rank() {
    // Huang et al. 2019: all m forwards run before any backward.
    for pp in 2..=8u32 {
        for m in pp..=4 * pp {
            let (tracked, swept) = peaks(ScheduleKind::Gpipe, pp, 1, m);
            assert_eq!(tracked, vec![m; pp as usize]);
            assert_eq!(swept, tracked);
        }
    }
}

#[test]
fn one_f_one_b_peak_is_p_minus_i() {
    // Narayanan et al. 2021 §2.2.1: rank i keeps p - i microbatches in flight.
    for pp in 2..=8u32 {
        for m in pp..=4 * pp {
            let (tracked, swept) = peaks(ScheduleKind::OneFOneB, pp, 1, m);
            let expected: Vec<u32> = (0..pp).map(|i| pp - i).collect();
            assert_eq!(tracked, expected, "pp={pp} m={m}");
            assert_eq!(swept, tracked);
        }
    }
}

#[test]
fn zb_h1_peak_matches_1f1b_at_its_largest() {
    // Qi et al. 2024 §2.1 (ZB-H1): W passes are delayed "based on the number of warm-up
    // microbatches, ensuring all pipeline stages have the same number of in-flight
    // microbatches", and the first worker, which holds the most, stays at 1F1B's peak p.
    // Counting a set as live until its W, that is p on every rank: the same maximum as 1F1B
    // (rank 0), not 1F1B's p - i on rank i.
    for pp in 2..=8u32 {
        for m in pp..=4 * pp {
            let (tracked, swept) = peaks(ScheduleKind::ZbH1, pp, 1, m);
            assert_eq!(tracked, vec![pp; pp as usize], "pp={pp} m={m}");
            assert_eq!(swept, tracked);
            let (one_f_one_b, _) = peaks(ScheduleKind::OneFOneB, pp, 1, m);
            assert_eq!(tracked.iter().max(), one_f_one_b.iter().max());
        }
    }
}

#[test]
fn interleaved_peak_is_megatron_warmup_plus_one() {
    // Megatron-LM get_pp_rank_microbatches: warm-up (p-r-1)*2 + (v-1)*N forwards, one more
    // forward before the first backward, all capped at m*v.
    for pp in 2..=8u32 {
        for v in 2..=4u32 {
            for m in pp..=4 * pp {
                let n = (pp..=m).find(|n| m % n == 0 || m % n >= pp).unwrap();
                let opts = GenerateOptions {
                    microbatch_group_size: Some(n),
                };
                let program =
                    generate_with(ScheduleKind::Interleaved1F1B, pp, v, m, &opts).unwrap();
                let costs = Costs::uniform(pp, v, 1.0, 2.0, None, 0.05).unwrap();
                let s = simulate(&program, &costs).unwrap();
                let expected: Vec<u32> = (0..pp)
                    .map(|r| ((pp - r - 1) * 2 + (v - 1) * n + 1).min(m * v))
                    .collect();
                assert_eq!(s.peak_inflight, expected, "pp={pp} v={v} m={m} N={n}");
                assert_eq!(swept_peaks(&program, &s), expected);
            }
        }
    }
}

#[test]
fn zbv_peak_is_2p_chunk_sets() {
    // Qi et al. 2024 §6: ZB-V has the same peak memory as 1F1B, p stage-sized activation sets,
    // and each of its chunks is half a stage: 2p chunk sets on every rank. The warm-up needs
    // 2p-1 microbatches on rank 0 to fill the V, so the count holds for m >= 2p.
    for pp in 2..=8u32 {
        for m in 2 * pp..=4 * pp {
            let (tracked, swept) = peaks(ScheduleKind::ZbV, pp, 2, m);
            assert_eq!(tracked, vec![2 * pp; pp as usize], "pp={pp} m={m}");
            assert_eq!(swept, tracked);
        }
    }
}

#[test]
fn dualpipe_v_peak_is_pp_plus_1() {
    // DualPipe README: activation per device PP+1 (PP = 2p stages, in chunk-sized sets).
    for pp in 2..=8u32 {
        for m in 2 * pp..=4 * pp {
            let (tracked, swept) = peaks(ScheduleKind::DualPipeV, pp, 2, m);
            assert_eq!(tracked, vec![2 * pp + 1; pp as usize], "pp={pp} m={m}");
            assert_eq!(swept, tracked);
        }
    }
}

/// The library's `closed_form` helpers (used for comparison columns) agree with the formulas
/// written out above.
#[test]
fn closed_form_helpers_agree_with_the_written_formulas() {
    use parsim::schedule::closed_form as cf;
    assert!(close(cf::bubble_fraction_1f1b(4, 8), 3.0 / 8.0));
    assert!(close(cf::bubble_fraction_interleaved(4, 2, 8), 3.0 / 16.0));
    assert!(close(cf::bubble_1f1b(4, 1.0, 2.0), 9.0));
    assert!(close(cf::bubble_zb1p(4, 1.0, 2.0, 1.0), 3.0));
    assert!(close(cf::bubble_dualpipe(8, 3.0, 2.0, 1.0), 6.0));
    assert_eq!(cf::peak_1f1b(4, 1, 8), 3);
    assert_eq!(cf::peak_interleaved(4, 2, 8, 4, 0), 11);
    assert_eq!(cf::peak_zbv(4), 8);
    assert_eq!(cf::peak_dualpipe_v(4), 9);
}
