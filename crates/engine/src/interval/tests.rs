use super::*;

fn regime(gpu: &str, seq: &str) -> Regime {
    let mut r = Regime([0; REGIME_DIMENSIONS]);
    for (d, v) in [
        (Dimension::GpuFamily, gpu),
        (Dimension::Framework, "fsdp"),
        (Dimension::Scale, "1-8"),
        (Dimension::Sequence, seq),
        (Dimension::CommShare, "<5%"),
        (Dimension::Calibrated, "no"),
    ] {
        let i = d.values().iter().position(|x| *x == v).unwrap();
        r = r.with(d, i as u8);
    }
    r
}

fn file(residuals: Vec<Residual>) -> ResidualFile {
    ResidualFile {
        about: "test".into(),
        command: "none".into(),
        lower_percentile: 0.1,
        upper_percentile: 0.9,
        backoff: BACKOFF.to_vec(),
        residuals,
    }
}

fn residual(r: Regime, log_ratio: f64) -> Residual {
    Residual {
        source: "s".into(),
        row: "r".into(),
        regime: r,
        log_ratio,
    }
}

/// Split-conformal ranks by hand (Lei et al. 2018): floor((n+1) 0.1) and ceil((n+1) 0.9).
/// n = 9: 1 and 9 (the extremes); n = 19: 2 and 18; n = 8: ceil(8.1) = 9 > 8, none.
#[test]
fn conformal_ranks_by_hand() {
    assert_eq!(conformal_ranks(9, 0.1, 0.9), Some((1, 9)));
    assert_eq!(conformal_ranks(19, 0.1, 0.9), Some((2, 18)));
    assert_eq!(conformal_ranks(20, 0.1, 0.9), Some((2, 19)));
    assert_eq!(conformal_ranks(8, 0.1, 0.9), None);
    assert_eq!(conformal_ranks(39, 0.05, 0.95), Some((2, 38)));
}

/// A regime with 19 residuals -0.09, -0.08, ..., +0.09 gets its 2nd and 18th (-0.08,
/// +0.08); one with 3 residuals is pooled over communication share, scale and sequence with
/// the first (22 residuals: ranks 2 and 21), and its note says so.
#[test]
fn lookup_uses_the_regime_or_pools_it() {
    let short = regime("hopper", "<=2048");
    let long = regime("hopper", "8193+");
    let mut rs: Vec<Residual> = (-9..=9)
        .map(|i| residual(short, f64::from(i) / 100.0))
        .collect();
    rs.extend([0.5, 0.6, 0.7].map(|x| residual(long, x)));
    let m = IntervalModel::new(&file(rs)).unwrap();
    assert_eq!(m.min_residuals, 9);
    let i = m.lookup(&short);
    assert_eq!(i.residuals, 19);
    assert!((i.lower_factor - (-0.08f64).exp()).abs() < 1e-12);
    assert!((i.upper_factor - 0.08f64.exp()).abs() < 1e-12);
    assert!(i.pooled_over.is_empty());
    let j = m.lookup(&long);
    assert_eq!(j.residuals, 22);
    assert_eq!(
        j.pooled_over,
        vec![Dimension::CommShare, Dimension::Scale, Dimension::Sequence]
    );
    // Ranks 2 and 21 of the 22 sorted: -0.08 and 0.6.
    assert!((j.lower_factor - (-0.08f64).exp()).abs() < 1e-12);
    assert!((j.upper_factor - 0.6f64.exp()).abs() < 1e-12);
    assert!(j.note.contains("pooled over"), "{}", j.note);
    // A GPU family no residual comes from has no evidence: the widest spread of any regime
    // (here the hopper one, ranks 2 and 21 of 22: -0.08 and 0.6), said so.
    let other = m.lookup(&regime("blackwell", "2049-8192"));
    assert!(
        other.no_evidence && other.note.starts_with("no evidence"),
        "{other:?}"
    );
    assert!((other.lower_factor - (-0.08f64).exp()).abs() < 1e-12);
    assert!((other.upper_factor - 0.6f64.exp()).abs() < 1e-12);
}

/// A file fewer residuals than the percentiles need is refused with the count it needs.
#[test]
fn too_few_residuals_are_refused() {
    let r = regime("hopper", "<=2048");
    let e = IntervalModel::new(&file((0..8).map(|_| residual(r, 0.0)).collect())).unwrap_err();
    assert!(e.to_string().contains("needs at least 9"), "{e}");
}

/// What `to_json` writes, `parse` reads back unchanged.
#[test]
fn file_round_trips() {
    let f = file(vec![residual(regime("ampere", "2049-8192"), -0.25)]);
    let text = serde_json::to_string_pretty(&f.to_json()).unwrap();
    assert_eq!(ResidualFile::parse(&text, "t").unwrap(), f);
}

/// Bad files are refused naming the field and the rule.
#[test]
fn bad_files_name_the_field() {
    let good =
        serde_json::to_value(file(vec![residual(regime("ampere", "<=2048"), 0.1)]).to_json())
            .unwrap();
    let refuse = |edit: &dyn Fn(&mut serde_json::Value), want: &[&str]| {
        let mut v = good.clone();
        edit(&mut v);
        let e = ResidualFile::parse(&v.to_string(), "f.json")
            .unwrap_err()
            .to_string();
        for w in want {
            assert!(e.contains(w), "{e} lacks {w}");
        }
    };
    refuse(
        &|v| v["lower_percentile"] = 0.0.into(),
        &["lower_percentile", "outside (0, 1)"],
    );
    refuse(
        &|v| v["upper_percentile"] = 1.0.into(),
        &["upper_percentile", "outside (0, 1)"],
    );
    refuse(
        &|v| v["upper_percentile"] = 1.5.into(),
        &["upper_percentile", "outside (0, 1)"],
    );
    refuse(
        &|v| v["lower_percentile"] = (-0.1).into(),
        &["lower_percentile"],
    );
    refuse(
        &|v| v["lower_percentile"] = 0.95.into(),
        &["upper_percentile", "must exceed"],
    );
    refuse(
        &|v| {
            let r = v["residuals"][0]["regime"].as_object_mut().unwrap();
            let x = r.remove("gpu_family").unwrap();
            r.insert("gpu_famly".into(), x);
        },
        &["residuals[0].regime.gpu_famly", "unknown regime key"],
    );
    refuse(
        &|v| v["residuals"][0]["regime"]["scale"] = "huge".into(),
        &["residuals[0].regime.scale", "unknown value \"huge\""],
    );
    refuse(
        &|v| v["residuals"][0]["log_ratio"] = "x".into(),
        &["residuals[0].log_ratio", "finite number"],
    );
    refuse(
        &|v| v["backoff"][0] = "gpu".into(),
        &["backoff[0]", "unknown regime key"],
    );
    refuse(
        &|v| v["backoff"][1] = v["backoff"][0].clone(),
        &["backoff[1]", "listed twice"],
    );
    refuse(&|v| v["extra"] = 1.into(), &["extra", "unknown key"]);
    let e = ResidualFile::parse("{ not json", "f.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("f.json") && e.contains("not valid JSON"), "{e}");
}

/// The one-pass typed reading and the field-by-field one give the same file: on the shipped
/// file, which the typed reading takes, and on valid files it leaves to the other: a repeated
/// key (JSON's last one holds) and a band written with an escape.
#[test]
fn typed_and_field_by_field_readings_agree() {
    let shipped = ResidualFile::parse_by_field(SHIPPED_JSON, "shipped").unwrap();
    assert!(shipped.residuals.len() > 100);
    let typed: file::TypedFile = serde_json::from_str(SHIPPED_JSON).unwrap();
    assert_eq!(typed.valid().as_ref(), Some(&shipped));
    assert_eq!(
        ResidualFile::parse(SHIPPED_JSON, "shipped").unwrap(),
        shipped
    );
    let f = file(vec![residual(regime("ampere", "<=2048"), 0.1)]);
    let text = serde_json::to_string(&f.to_json()).unwrap();
    let edits = [
        ("\"log_ratio\":0.1", "\"log_ratio\":7.0,\"log_ratio\":0.1"),
        (
            "\"calibrated\":\"no\"",
            "\"calibrated\":\"yes\",\"calibrated\":\"no\"",
        ),
        ("\"<=2048\"", "\"\\u003c=2048\""),
    ];
    for (from, to) in edits {
        assert!(text.contains(from), "{text} lacks {from}");
        let edited = text.replacen(from, to, 1);
        let typed = serde_json::from_str::<file::TypedFile>(&edited)
            .ok()
            .and_then(file::TypedFile::valid);
        assert!(typed.is_none(), "{edited}");
        assert_eq!(ResidualFile::parse(&edited, "t").unwrap(), f, "{edited}");
    }
}

/// A skewed residual distribution with known quantiles: Gumbel, location 0, scale 0.05 (a
/// long right tail: runs slower than predicted more often than faster). Its 10th and 90th
/// percentiles straddle 0, so widening an interval to hold the prediction changes nothing
/// but the rare draw.
const GUMBEL: (f64, f64) = (0.0, 0.05);

fn gumbel_quantile(p: f64) -> f64 {
    GUMBEL.0 - GUMBEL.1 * (-p.ln()).ln()
}

fn gumbel_cdf(x: f64) -> f64 {
    (-(-(x - GUMBEL.0) / GUMBEL.1).exp()).exp()
}

/// The share of the distribution an interval of one regime covers, from its factors.
fn covered(i: &StepInterval) -> f64 {
    gumbel_cdf(i.upper_factor.ln()) - gumbel_cdf(i.lower_factor.ln())
}

/// Split-conformal coverage by hand (Lei et al. 2018, Theorem 2.2): with n residuals at the
/// distribution's exact quantiles F^-1(i / (n + 1)), the interval's order statistics of ranks
/// lo and hi are F^-1(lo / (n + 1)) and F^-1(hi / (n + 1)), so it covers (hi - lo) / (n + 1)
/// of the distribution: at least the nominal 80% and at most 80% + 2 / (n + 1). Every n from
/// 9 to 200; at n = 19 and 99 the order statistics are the 10th and 90th percentiles exactly.
#[test]
fn intervals_cover_the_nominal_share_of_a_known_distribution() {
    let r = regime("hopper", "<=2048");
    for n in 9..=200usize {
        let rs = (1..=n)
            .map(|i| residual(r, gumbel_quantile(i as f64 / (n + 1) as f64)))
            .collect();
        let i = IntervalModel::new(&file(rs)).unwrap().lookup(&r);
        let c = covered(&i);
        let slack = 2.0 / (n + 1) as f64;
        assert!(
            (0.8 - 1e-9..=0.8 + slack + 1e-9).contains(&c),
            "n = {n}: covers {c:.4}, outside [0.8, {:.4}]",
            0.8 + slack
        );
        if n == 19 || n == 99 {
            assert!((i.lower_factor.ln() - gumbel_quantile(0.1)).abs() < 1e-12);
            assert!((i.upper_factor.ln() - gumbel_quantile(0.9)).abs() < 1e-12);
        }
    }
}

/// The same guarantee as a second method, by simulation: 4000 regimes of 19 residuals drawn
/// at random from the Gumbel above (seeded), each interval's coverage of the distribution;
/// the order statistics of ranks 2 and 18 of 19 cover Beta(16, 4) of it, mean 16 / 20 = 0.8
/// and standard deviation 0.087, so the mean of 4000 lies within 0.8 +- 0.0055 (4 standard
/// errors). A lookup that took the wrong ranks (1 and 19: 0.9; 3 and 17: 0.7) fails.
#[test]
fn random_residuals_cover_the_nominal_share_on_average() {
    use proptest::prelude::RngExt;
    use proptest::test_runner::{RngAlgorithm, TestRng};
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let r = regime("ampere", "2049-8192");
    let trials = 4000;
    let mean = (0..trials)
        .map(|_| {
            let rs = (0..19)
                .map(|_| residual(r, gumbel_quantile(rng.random_range(1e-12..1.0))))
                .collect();
            covered(&IntervalModel::new(&file(rs)).unwrap().lookup(&r))
        })
        .sum::<f64>()
        / f64::from(trials);
    let sd = (16.0 * 4.0 / (20.0 * 20.0 * 21.0) / f64::from(trials)).sqrt();
    assert!(
        (mean - 0.8).abs() <= 4.0 * sd,
        "mean coverage {mean:.4}, expected 0.8 +- {:.4}",
        4.0 * sd
    );
}

/// A pooled regime spans the regimes it pools: with a narrow regime (19 residuals within
/// +-0.09) and a wide one (9 residuals -0.5 .. +0.5 by 0.125) beside it, a third regime of 2
/// residuals pooled over the sequence takes the wide one's extremes (+-0.5), not the pooled
/// cell's own ranks 3 and 28 of 30 (-0.25, +0.25).
#[test]
fn a_pooled_regime_spans_the_regimes_it_pools() {
    let narrow = regime("hopper", "<=2048");
    let wide = regime("hopper", "2049-8192");
    let thin = regime("hopper", "8193+");
    let mut rs: Vec<Residual> = (-9..=9)
        .map(|i| residual(narrow, f64::from(i) / 100.0))
        .collect();
    rs.extend((-4..=4).map(|i| residual(wide, 0.125 * f64::from(i))));
    rs.extend([0.0, 0.01].map(|x| residual(thin, x)));
    let m = IntervalModel::new(&file(rs)).unwrap();
    let w = m.lookup(&wide);
    assert!(w.pooled_over.is_empty());
    assert!((w.lower_factor - (-0.5f64).exp()).abs() < 1e-12);
    let t = m.lookup(&thin);
    assert_eq!(t.residuals, 30);
    assert!((t.lower_factor - (-0.5f64).exp()).abs() < 1e-12, "{t:?}");
    assert!((t.upper_factor - 0.5f64.exp()).abs() < 1e-12, "{t:?}");
    // The narrow regime keeps its own interval.
    let n = m.lookup(&narrow);
    assert!((n.upper_factor - 0.08f64.exp()).abs() < 1e-12);
}

/// No evidence is never borrowed from a neighbour: with a narrow ampere regime (19 residuals
/// within +-0.09) and a wide hopper one (9 residuals -0.5 .. +0.5), a hopper MoE regime, a
/// host-bound hopper regime and a new GPU family each take the widest spread (+-0.5), not the
/// nearest regime's, and say so; a dense hopper regime keeps its own.
#[test]
fn a_regime_without_evidence_takes_the_widest_spread() {
    let narrow = regime("ampere", "<=2048");
    let wide = regime("hopper", "<=2048");
    let mut rs: Vec<Residual> = (-9..=9)
        .map(|i| residual(narrow, f64::from(i) / 100.0))
        .collect();
    rs.extend((-4..=4).map(|i| residual(wide, 0.125 * f64::from(i))));
    let m = IntervalModel::new(&file(rs)).unwrap();
    let own = m.lookup(&narrow);
    assert!(!own.no_evidence);
    assert!((own.upper_factor - 0.08f64.exp()).abs() < 1e-12);
    for (d, band) in [
        (Dimension::Moe, 1u8),
        (Dimension::HostBound, 1),
        (Dimension::Fabric, 1),
    ] {
        let r = m.lookup(&narrow.with(d, band));
        assert!(r.no_evidence, "{d:?}");
        assert!(
            r.note.contains(&format!("{}={}", d.key(), d.values()[1])),
            "{}",
            r.note
        );
        assert!((r.lower_factor - (-0.5f64).exp()).abs() < 1e-12, "{d:?}");
        assert!((r.upper_factor - 0.5f64.exp()).abs() < 1e-12, "{d:?}");
    }
    let new_family = m.lookup(&regime("blackwell", "<=2048"));
    assert!(new_family.no_evidence && new_family.residuals == 0);
}

/// Any residual set and any regime give a finite interval that holds the prediction:
/// p10 <= p50 (the predicted step) <= p90.
#[test]
fn every_interval_is_finite_and_holds_the_prediction() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::default();
    let families = Dimension::GpuFamily.values().len() as u8;
    let strategy = (
        proptest::collection::vec((0..families, 0u8..2, 0u8..3, 0u8..3, -2.0f64..2.0), 9..80),
        (0..families, 0u8..2, 0u8..2, 0u8..4, 0u8..3),
    );
    runner
        .run(&strategy, |(rows, (g, moe, host, scale, comm))| {
            let rs: Vec<Residual> = rows
                .into_iter()
                .map(|(g, moe, seq, comm, x)| {
                    let r = regime("hopper", "<=2048")
                        .with(Dimension::GpuFamily, g)
                        .with(Dimension::Moe, moe)
                        .with(Dimension::Sequence, seq)
                        .with(Dimension::CommShare, comm);
                    residual(r, x)
                })
                .collect();
            let Ok(m) = IntervalModel::new(&file(rs)) else {
                return Ok(());
            };
            let q = regime("hopper", "<=2048")
                .with(Dimension::GpuFamily, g)
                .with(Dimension::Moe, moe)
                .with(Dimension::HostBound, host)
                .with(Dimension::Scale, scale)
                .with(Dimension::CommShare, comm);
            let i = m.lookup(&q);
            prop_assert!(i.lower_factor.is_finite() && i.upper_factor.is_finite());
            prop_assert!(i.lower_factor > 0.0);
            prop_assert!(i.lower_factor <= 1.0 && 1.0 <= i.upper_factor, "{:?}", i);
            prop_assert!(m.min_upper_factor(&q).is_finite());
            Ok(())
        })
        .unwrap();
}

fn from(source: &str, r: Regime, log_ratio: f64) -> Residual {
    Residual {
        source: source.into(),
        ..residual(r, log_ratio)
    }
}

/// One source's offset is no evidence of another's. Source a shows a regime 19 times at
/// +0.21 .. +0.39 (its own offset +0.3), source b a neighbour (longer sequences) 19 times at
/// -0.09 .. +0.09. The first regime's own cell holds one source, so it is pooled over
/// communication share, scale and sequence to the 38 of both: ranks 3 and 36 (-0.07 and
/// +0.37), widened to the regimes it pools (a's ranks 2 and 18: +0.22, +0.38; b's: -0.08,
/// +0.08): -0.08 .. +0.38. With a alone in the file, its regime keeps its own +0.22 .. +0.38
/// (the lower end widened to hold the prediction), as it does for a row known to be a's own;
/// a regime calibrated on the machine keeps its own held-out runs though they are one source's.
#[test]
fn a_regime_one_source_shows_is_pooled_until_several_do() {
    let x = regime("hopper", "<=2048");
    let y = regime("hopper", "2049-8192");
    let a: Vec<Residual> = (-9..=9)
        .map(|i| from("a", x, 0.3 + f64::from(i) / 100.0))
        .collect();
    let b: Vec<Residual> = (-9..=9)
        .map(|i| from("b", y, f64::from(i) / 100.0))
        .collect();
    let both = IntervalModel::new(&file([a.clone(), b].concat())).unwrap();
    assert_eq!(both.min_sources, 2);
    let i = both.lookup(&x);
    assert_eq!(
        i.pooled_over,
        vec![Dimension::CommShare, Dimension::Scale, Dimension::Sequence]
    );
    assert_eq!(i.residuals, 38);
    assert!((i.lower_factor - (-0.08f64).exp()).abs() < 1e-12, "{i:?}");
    assert!((i.upper_factor - 0.38f64.exp()).abs() < 1e-12, "{i:?}");
    assert!(i.note.contains("of at least 2 sources"), "{}", i.note);
    // A row known to be a's own (a cross-fitted half) is answered by a's cell.
    let own = both.lookup_from(&x, Some("a"));
    assert!(own.pooled_over.is_empty(), "{own:?}");
    assert!((own.upper_factor - 0.38f64.exp()).abs() < 1e-12, "{own:?}");
    assert_eq!(both.lookup_from(&x, Some("b")).residuals, 38);
    let alone = IntervalModel::new(&file(a)).unwrap();
    assert_eq!(alone.min_sources, 1);
    let j = alone.lookup(&x);
    assert!(j.pooled_over.is_empty());
    assert_eq!(j.lower_factor, 1.0);
    assert!((j.upper_factor - 0.38f64.exp()).abs() < 1e-12, "{j:?}");
    let yes = Dimension::Calibrated
        .values()
        .iter()
        .position(|v| *v == "yes")
        .unwrap() as u8;
    let machine = x.with(Dimension::Calibrated, yes);
    let mut rs: Vec<Residual> = (-9..=9)
        .map(|i| from("m", machine, f64::from(i) / 100.0))
        .collect();
    rs.extend((-9..=9).map(|i| from("b", y, 0.5 + f64::from(i) / 100.0)));
    let k = IntervalModel::new(&file(rs)).unwrap().lookup(&machine);
    assert!(k.pooled_over.is_empty(), "{k:?}");
    assert!((k.upper_factor - 0.08f64.exp()).abs() < 1e-12, "{k:?}");
}
