use super::*;

fn regime(gpu: &str, seq: &str) -> Regime {
    let mut r = Regime([0; 6]);
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
    // A regime no residual shares anything with but the calibrated flag: the whole file.
    let other = regime("blackwell", "2049-8192");
    assert_eq!(m.lookup(&other).residuals, 22);
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
        &|v| {
            v["backoff"].as_array_mut().unwrap().pop();
        },
        &["backoff", "every regime key once"],
    );
    refuse(&|v| v["extra"] = 1.into(), &["extra", "unknown key"]);
    let e = ResidualFile::parse("{ not json", "f.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("f.json") && e.contains("not valid JSON"), "{e}");
}

/// The shipped file loads and every estimate's regime finds an interval in it.
#[test]
fn shipped_model_loads() {
    let m = shipped().unwrap();
    assert!(m.total >= m.min_residuals);
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
