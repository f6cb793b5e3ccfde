//! `search --objective` and `--deadline` (issue 34 part 5): the run ranking and the deadline's
//! answer checked against figures the test derives itself from separate searches, and bad
//! input refused naming the flag.

use assert_cmd::cargo::cargo_bin_cmd;

const SMALL: &[&str] = &[
    "search",
    "--json",
    "--model",
    "llama3-8b",
    "--seq",
    "2048",
    "--gbs",
    "16",
    "--train-tokens",
    "10B",
];

/// Runs `parsim search SMALL.. ARGS`, expects `code`, and parses stdout as JSON.
fn json(args: &[&str], code: i32) -> serde_json::Value {
    let out = cargo_bin_cmd!("parsim")
        .args(SMALL)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn mixes(v: &serde_json::Value) -> Vec<String> {
    v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mix"].to_string())
        .collect()
}

#[test]
fn cost_ranks_by_gpus_times_wall_hours_times_price() {
    let price = 2.5;
    let v = json(
        &[
            "--gpus",
            "8",
            "--top",
            "6",
            "--objective",
            "cost",
            "--gpu-hour-price",
            "2.5",
        ],
        0,
    );
    let top = v["top"].as_array().unwrap();
    assert!(top.len() >= 2);
    let steps = 10_000_000_000_u64.div_ceil(16 * 2048);
    let mut last = 0.0;
    for r in top {
        let run = &r["run"];
        assert_eq!(run["steps"].as_u64(), Some(steps));
        // Training days from the row's own step time.
        let compute_days = steps as f64 * f(&r["time"]["step_s"]) / 86_400.0;
        assert!((f(&run["compute_days"]) / compute_days - 1.0).abs() < 1e-9);
        let cost = 8.0 * f(&run["wall_days"]) * 24.0 * price;
        assert!((f(&run["cost_usd"]) / cost - 1.0).abs() < 1e-9);
        assert!(cost >= last, "not ascending by cost: {cost} after {last}");
        last = cost;
    }
    // At one GPU count the cost is the wall time times a constant: the same order as time.
    let t = json(&["--gpus", "8", "--top", "6", "--objective", "time"], 0);
    assert_eq!(mixes(&t), mixes(&v));
    // Energy ranks by the run's energy.
    let e = json(&["--gpus", "8", "--top", "6", "--objective", "energy"], 0);
    let energies: Vec<f64> = e["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| f(&r["run"]["energy_mwh"]))
        .collect();
    assert!(energies.windows(2).all(|w| w[0] <= w[1]), "{energies:?}");
}

/// The best run (wall days, cost) of separate searches at each count.
fn separate(counts: &[u32]) -> Vec<(u32, f64, f64)> {
    counts
        .iter()
        .map(|&n| {
            let v = json(
                &[
                    "--gpus",
                    &n.to_string(),
                    "--top",
                    "1",
                    "--objective",
                    "cost",
                    "--gpu-hour-price",
                    "3",
                ],
                0,
            );
            let run = &v["top"][0]["run"];
            (n, f(&run["wall_days"]), f(&run["cost_usd"]))
        })
        .collect()
}

#[test]
fn deadline_answers_the_cheapest_of_separate_searches() {
    let sizes = separate(&[8, 16, 32]);
    // A deadline between the slowest and the fastest: some finish, some do not.
    let mut walls: Vec<f64> = sizes.iter().map(|s| s.1).collect();
    walls.sort_by(f64::total_cmp);
    let deadline_h = (walls[0] + walls[2]) / 2.0 * 24.0;
    let d = format!("{deadline_h:.6}h");
    let finishing: Vec<_> = sizes.iter().filter(|s| s.1 * 24.0 <= deadline_h).collect();
    assert!(!finishing.is_empty() && finishing.len() < sizes.len());

    let unpriced = json(&["--gpus", "8..32", "--deadline", &d], 0);
    let fewest = finishing.iter().map(|s| s.0).min().unwrap();
    assert_eq!(unpriced["cheapest_by"], "gpus");
    assert_eq!(unpriced["answer"]["gpus"].as_u64(), Some(u64::from(fewest)));

    let priced = json(
        &["--gpus", "8..32", "--deadline", &d, "--gpu-hour-price", "3"],
        0,
    );
    let cheapest = finishing.iter().min_by(|a, b| a.2.total_cmp(&b.2)).unwrap();
    assert_eq!(priced["cheapest_by"], "cost");
    assert_eq!(
        priced["answer"]["gpus"].as_u64(),
        Some(u64::from(cheapest.0))
    );
    let cost = f(&priced["answer"]["best"]["run"]["cost_usd"]);
    assert!((cost / cheapest.2 - 1.0).abs() < 1e-9);

    // Half the fastest run: none finishes; the closest is the fastest, late by the difference.
    let fastest = sizes.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let short = format!("{:.6}h", fastest.1 * 12.0);
    let none = json(&["--gpus", "8..32", "--deadline", &short], 3);
    assert!(none["answer"].is_null());
    assert_eq!(none["closest"]["gpus"].as_u64(), Some(u64::from(fastest.0)));
    let miss = f(&none["miss_days"]);
    assert!((miss - fastest.1 / 2.0).abs() < 1e-6, "{miss}");
}

#[test]
fn bad_input_is_refused_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--gpus", "32..8", "--deadline", "1d"], "--gpus 32..8"),
        (&["--gpus", "0..8", "--deadline", "1d"], "--gpus 0..8"),
        (&["--gpus", "8", "--deadline", "60"], "--deadline 60"),
        (&["--gpus", "8", "--deadline", "0d"], "--deadline 0d"),
        (&["--gpus", "8", "--deadline=-2h"], "--deadline -2h"),
        (&["--gpus", "8", "--objective", "cost"], "--gpu-hour-price"),
        (
            &["--gpus", "8", "--objective", "speed"],
            "--objective speed",
        ),
        (
            &["--gpus", "8", "--objective", "energy", "--deadline", "1d"],
            "--objective energy: with --deadline",
        ),
        // 0.36 s: shorter than one step of any mix of this model on 8 GPUs (its fastest run,
        // 10B tokens in about 1.6 days, is about 0.45 s a step).
        (
            &["--gpus", "8", "--deadline", "0.0001h"],
            "shorter than one training step",
        ),
    ];
    for (args, needle) in cases {
        let out = cargo_bin_cmd!("parsim")
            .args(SMALL)
            .args(*args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Without a token budget: a deadline and a run objective name --train-tokens.
    for args in [
        [
            "search",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--deadline",
            "1d",
        ],
        [
            "search",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--objective",
            "energy",
        ],
    ] {
        let out = cargo_bin_cmd!("parsim").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--train-tokens"));
    }
}
