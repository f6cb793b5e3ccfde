//! The run model against hand values, closed forms and a Monte-Carlo simulation.

use super::*;

fn settings() -> Settings {
    Settings::from_config(&RunConfig::default()).unwrap()
}

fn step() -> StepInputs {
    StepInputs {
        step_s: 1.0,
        compute_s: 0.8,
        tokens_per_step: 1000,
        gpus: 16,
        // Two DGX H100 nodes: 2 x (4,600 W host + 645 W of switch ports).
        hosts_w: 2.0 * (4600.0 + 645.0),
        gpu_idle_w: Some(70.0),
        gpu_tdp_w: Some(700.0),
        checkpoint_bytes: 2.0e12,
        checkpoint_bytes_per_rank: 1.0e9,
    }
}

#[test]
fn the_default_failure_rate_is_llama3s_419_in_54_days_on_16384_gpus() {
    // Llama 3 paper Table 5: 419 interruptions, 54 days, 16,384 GPUs.
    let figure = defaults::FAILURE_RATE_PER_GPU_HOUR * 16_384.0 * 54.0 * 24.0;
    assert!((figure - 419.0).abs() < 1e-9, "{figure}");
    assert!((defaults::FAILURE_RATE_PER_GPU_HOUR - 1.973_28e-5).abs() < 1e-9);
}

#[test]
fn expected_interruptions_are_the_rate_times_gpu_hours() {
    // A run on 16,384 GPUs whose wall time comes out at 54 days: failure-free work W and
    // checkpoints every step (1 s, free): T = W / (1 - rate/2), so W = 54 d x (1 - rate/2).
    let rate_s = defaults::FAILURE_RATE_PER_GPU_HOUR * 16_384.0 / 3600.0;
    let s = Settings {
        restart_s: 0.0,
        checkpoint_interval_s: Some(1.0),
        storage_bytes_per_s: 1.0,
        ..settings()
    };
    let work = 54.0 * 86_400.0 * (1.0 - rate_s * 0.5);
    let st = StepInputs {
        gpus: 16_384,
        tokens_per_step: 1,
        checkpoint_bytes: 0.0,
        checkpoint_bytes_per_rank: 0.0,
        step_s: work / 4_000_000.0,
        ..step()
    };
    let r = plan(
        4_000_000,
        &st,
        &Settings {
            checkpoint_interval_s: Some(st.step_s),
            ..s
        },
    )
    .unwrap();
    // The interval is one step here, so W = 54 d (1 - rate x step / 2) is not exact: solve
    // for the figure the rate gives at the run's own wall time instead, and check 54 days.
    let expected = rate_s * r.wall_days * 86_400.0;
    assert!((r.expected_interruptions - expected).abs() < 1e-9);
    assert!((r.wall_days - 54.0).abs() < 0.01, "{}", r.wall_days);
    assert!(
        (r.expected_interruptions - 419.0).abs() < 0.1,
        "{}",
        r.expected_interruptions
    );
}

#[test]
fn young_interval_matches_its_closed_form() {
    // 30 s stall, 3 h MTBF: sqrt(2 x 30 x 10,800) = sqrt(648,000) = 804.98 s.
    assert!((young_interval_s(30.0, 10_800.0) - 804.984_5).abs() < 1e-3);
    // plan() uses it: 2 TB at 2 TB/s is a 1 s stall; 16 GPUs at 0.18/GPU-hour is an MTBF of
    // 1250 s: sqrt(2 x 1 x 1250) = 50 s.
    let s = Settings {
        failure_rate_per_gpu_hour: 3600.0 / 1250.0 / 16.0,
        storage_bytes_per_s: 2.0e12,
        ..settings()
    };
    let r = plan(10_000_000, &step(), &s).unwrap();
    assert!(
        (r.checkpoint_interval_s - 50.0).abs() < 1e-9,
        "{}",
        r.checkpoint_interval_s
    );
}

#[test]
fn young_interval_nearly_minimises_the_expected_wall_time() {
    // A second method: search the interval that minimises T(t) on a fine grid.
    let (work, stall, restart, rate) = (1.0e6, 20.0, 300.0, 1.0 / 20_000.0);
    let young = young_interval_s(stall, 1.0 / rate);
    let best = (1..20_000)
        .map(|i| f64::from(i) * 0.1)
        .min_by(|a, b| {
            let ta = expected_wall_s(work, *a, stall, restart, rate).unwrap_or(f64::MAX);
            let tb = expected_wall_s(work, *b, stall, restart, rate).unwrap_or(f64::MAX);
            ta.total_cmp(&tb)
        })
        .unwrap();
    assert!(
        (best - young).abs() / young < 0.05,
        "best {best}, Young {young}"
    );
}

/// xorshift64*: a small deterministic generator for the simulation.
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

#[test]
fn goodput_matches_a_monte_carlo_simulation() {
    // One GPU failing at 0.18 per hour (MTBF 20,000 s), a 600 s interval, a 20 s synchronous
    // checkpoint, a 300 s restart plus a 20 s restore. The simulation runs segments of
    // interval + stall; a failure inside one loses the time spent in it and costs the restart.
    let s = Settings {
        failure_rate_per_gpu_hour: 0.18,
        storage_bytes_per_s: 1.0e9,
        restart_s: 300.0,
        checkpoint_interval_s: Some(600.0),
        ..settings()
    };
    let st = StepInputs {
        gpus: 1,
        tokens_per_step: 1,
        checkpoint_bytes: 20.0e9,
        ..step()
    };
    let r = plan(2_000_000, &st, &s).unwrap();
    let (seg, restart, mtbf) = (620.0, 320.0, 20_000.0);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut wall, mut work, mut failures) = (0.0, 0.0, 0u64);
    for _ in 0..40 {
        let mut done = 0.0;
        while done < 2_000_000.0 {
            loop {
                let t_fail = -mtbf * rng.uniform().ln();
                if t_fail >= seg {
                    wall += seg;
                    break;
                }
                wall += t_fail + restart;
                failures += 1;
            }
            done += 600.0;
        }
        work += done;
    }
    let goodput = work / wall;
    assert!(
        (goodput - r.goodput_fraction).abs() < 0.005,
        "simulated {goodput}, model {}",
        r.goodput_fraction
    );
    let sim_per_run = failures as f64 / 40.0;
    assert!((sim_per_run - r.expected_interruptions).abs() / sim_per_run < 0.05);
}

#[test]
fn gpu_hours_are_gpus_times_wall_hours_and_energy_lies_in_the_envelope() {
    let s = Settings {
        pue: 1.0,
        ..settings()
    };
    let no_hosts = StepInputs {
        hosts_w: 0.0,
        ..step()
    };
    let r = plan(1_000_000_000, &no_hosts, &s).unwrap();
    let wall_h = r.wall_days * 24.0;
    assert!((r.gpu_hours - 16.0 * wall_h).abs() < 1e-6 * r.gpu_hours);
    let e = r.energy_mwh.unwrap() * 1e6; // Wh
    assert!(
        e >= 70.0 * r.gpu_hours && e <= 700.0 * r.gpu_hours,
        "{e} Wh"
    );
    // Failure-free and with free checkpoints, at full utilisation: exactly TDP x GPU-hours.
    let ideal = Settings {
        failure_rate_per_gpu_hour: 0.0,
        ..s
    };
    let st = StepInputs {
        compute_s: 1.0,
        checkpoint_bytes: 0.0,
        ..no_hosts
    };
    let r = plan(1_000_000_000, &st, &ideal).unwrap();
    // 1e9 tokens / 1000 per step = 1e6 steps of 1 s on 16 GPUs at 700 W = 3.111 MWh.
    assert!((r.energy_mwh.unwrap() - 16.0 * 700.0 * 1.0e6 / 3.6e9).abs() < 1e-9);
    assert_eq!(r.goodput_fraction, 1.0);
    assert_eq!(r.expected_interruptions, 0.0);
    assert!(r.job_mtbf_hours.is_none());
}

#[test]
fn host_network_and_pue_add_up() {
    // 16 GPUs = 2 nodes; 1e6 s failure-free at 80% utilisation.
    let s = Settings {
        failure_rate_per_gpu_hour: 0.0,
        pue: 1.5,
        ..settings()
    };
    let st = StepInputs {
        checkpoint_bytes: 0.0,
        ..step()
    };
    let r = plan(1_000_000_000, &st, &s).unwrap();
    let gpu_w = 70.0 + 630.0 * 0.8;
    let it_w = 16.0 * gpu_w + 2.0 * (4600.0 + 645.0);
    assert!((r.energy_mwh.unwrap() - 1.5 * it_w * 1.0e6 / 3.6e9).abs() < 1e-9);
}

#[test]
fn cost_only_with_a_price() {
    let r = plan(1_000_000, &step(), &settings()).unwrap();
    assert!(r.cost_usd.is_none());
    assert!(r.notes.iter().any(|n| n.contains("price_per_gpu_hour_usd")));
    let s = Settings {
        price_per_gpu_hour_usd: Some(2.5),
        ..settings()
    };
    let r = plan(1_000_000, &step(), &s).unwrap();
    assert!((r.cost_usd.unwrap() - 2.5 * r.gpu_hours).abs() < 1e-9);
}

#[test]
fn bad_settings_are_refused_by_field() {
    let cases: [(RunConfig, &str); 6] = [
        (
            RunConfig {
                storage_bytes_per_s: Some(0.0),
                ..Default::default()
            },
            "run.storage_bytes_per_s",
        ),
        (
            RunConfig {
                price_per_gpu_hour_usd: Some(-1.0),
                ..Default::default()
            },
            "run.price_per_gpu_hour_usd",
        ),
        (
            RunConfig {
                price_per_gpu_hour_usd: Some(0.0),
                ..Default::default()
            },
            "run.price_per_gpu_hour_usd",
        ),
        (
            RunConfig {
                failure_rate_per_gpu_hour: Some(f64::NAN),
                ..Default::default()
            },
            "run.failure_rate_per_gpu_hour",
        ),
        (
            RunConfig {
                failure_rate_per_gpu_hour: Some(f64::INFINITY),
                ..Default::default()
            },
            "run.failure_rate_per_gpu_hour",
        ),
        (
            RunConfig {
                pue: Some(0.9),
                ..Default::default()
            },
            "run.pue",
        ),
    ];
    for (c, field) in cases {
        let e = Settings::from_config(&c).unwrap_err().to_string();
        assert!(e.starts_with(field), "{e}");
    }
    assert!(plan(0, &step(), &settings()).is_err());
}

#[test]
fn failures_faster_than_progress_are_an_error_not_nan() {
    let s = Settings {
        failure_rate_per_gpu_hour: 100.0,
        ..settings()
    };
    let e = plan(1_000_000_000, &step(), &s).unwrap_err();
    assert!(matches!(e, PlanningError::NoProgress { .. }), "{e}");
}

#[test]
fn zero_checkpoint_bytes_and_async_checkpoints_stay_finite() {
    let st = StepInputs {
        checkpoint_bytes: 0.0,
        checkpoint_bytes_per_rank: 0.0,
        ..step()
    };
    let r = plan(1_000_000_000, &st, &settings()).unwrap();
    assert!(r.goodput_fraction.is_finite() && r.goodput_fraction <= 1.0);
    assert_eq!(r.checkpoint_interval_s, 1.0); // one step: the shortest interval
    let s = Settings {
        checkpoint_async: true,
        ..settings()
    };
    let r = plan(1_000_000_000, &step(), &s).unwrap();
    // Async stalls for the host copy (1 GB at 64 GB/s), and writes no faster than storage.
    assert!((r.checkpoint_stall_s - 1.0e9 / 64.0e9).abs() < 1e-12);
    assert!(r.checkpoint_interval_s >= r.checkpoint_write_s);
    let sync = plan(1_000_000_000, &step(), &settings()).unwrap();
    assert!(r.goodput_fraction > sync.goodput_fraction);
}

#[test]
fn a_deadline_gives_its_margin_and_one_shorter_than_a_step_is_refused() {
    let plain = plan(1_000_000, &step(), &settings()).unwrap();
    assert_eq!(
        (plain.deadline_days, plain.deadline_margin_days),
        (None, None)
    );
    let wall = plain.wall_days;
    for deadline in [2.0 * wall, 0.5 * wall] {
        let s = Settings {
            deadline_s: Some(deadline * 86_400.0),
            ..settings()
        };
        let r = plan(1_000_000, &step(), &s).unwrap();
        assert_eq!(r.wall_days, wall, "a deadline changes nothing else");
        assert_eq!(r.deadline_days, Some(deadline));
        let m = r.deadline_margin_days.unwrap();
        assert!((m - (deadline - wall)).abs() < 1e-12 * wall, "{m}");
    }
    // Half a step (the step is 1 s): no run of this mix can finish by it.
    let s = Settings {
        deadline_s: Some(0.5),
        ..settings()
    };
    let e = plan(1_000_000, &step(), &s).unwrap_err().to_string();
    assert!(
        e.starts_with("run.deadline_days: is shorter than one training step"),
        "{e}"
    );
    // Zero, negative and non-finite deadlines are refused by the field when read.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let c = RunConfig {
            deadline_days: Some(bad),
            ..RunConfig::default()
        };
        let e = Settings::from_config(&c).unwrap_err().to_string();
        assert!(e.starts_with("run.deadline_days"), "{bad}: {e}");
    }
}
