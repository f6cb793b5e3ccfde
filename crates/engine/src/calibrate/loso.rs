//! Leave-one-source-out validation: for each end-to-end source table, each GPU family's
//! efficiencies are fitted on the other tables' rows alone, from fixed placeholder values (so
//! nothing fitted to the left-out table leaks in), and the left-out table's rows are predicted
//! with that fit. The errors say how well the model transfers to a software stack and a set of
//! shapes it was not fitted on, which the alternate-row split of [`super::cases_with_roles`]
//! (rows of every table on both sides) cannot.

use super::fit::{self, Family, FitResult, Params};
use super::published::Source;
use super::{cases_with_roles, shipped_params, CalibrateError, Evaluation, Role, Row, Summary};

/// Where every fit starts: the old placeholder efficiencies, not the shipped (fitted) values,
/// and the measured overlap interference, which no fit moves.
pub fn placeholder_params(intra_link: f64) -> Params {
    Params {
        matmul: 0.7,
        attention: 0.5,
        memory_bound: 0.7,
        overlap_interference: super::interference::measured_overlap_interference(),
        intra_link,
    }
}

/// One fit of the validation: `family` fitted without `left_out`.
#[derive(Debug, Clone)]
pub struct SourceFit {
    pub left_out: Source,
    pub fit: FitResult,
}

/// Every in-scope row predicted by the fit that excluded its source.
#[derive(Debug, Clone)]
pub struct LeaveOneSourceOut {
    /// Rows predicted without their source carry [`Role::HeldOut`]; out-of-scope and
    /// inconsistent rows keep their role (predicted with the same fit, not counted).
    pub evaluation: Evaluation,
    pub fits: Vec<SourceFit>,
    /// The same rows, each family fitted on every source at once: what the model reaches when
    /// nothing is held out, a floor no held-out validation can beat on its worst row.
    pub in_sample: InSample,
}

/// Every in-scope row predicted by a fit that saw all of them.
#[derive(Debug, Clone)]
pub struct InSample {
    /// In-scope rows carry [`Role::HeldOut`] so that [`Evaluation::held_out`] summarises them.
    pub evaluation: Evaluation,
}

/// The error beyond which a row misses issue 17's leave-one-source-out goal for the worst row.
pub const WORST_GOAL: f64 = 0.12;

/// [`leave_one_source_out`] computed once per process and shared: it is deterministic (fixed
/// data, fixed starts), and `parsim validate` and several accuracy tests each need it.
pub fn shared() -> Result<&'static LeaveOneSourceOut, CalibrateError> {
    static SHARED: std::sync::OnceLock<Option<LeaveOneSourceOut>> = std::sync::OnceLock::new();
    match SHARED.get_or_init(|| leave_one_source_out().ok()) {
        Some(l) => Ok(l),
        // It failed once and fails the same way again: return that error.
        None => leave_one_source_out().map(|l| &*Box::leak(Box::new(l))),
    }
}

/// Runs the validation over the shipped data set. Rows of a family that no other source
/// covers stay unpredicted (an error message in place of the prediction).
pub fn leave_one_source_out() -> Result<LeaveOneSourceOut, CalibrateError> {
    let (cases, unreadable) = cases_with_roles()?;
    let usable = |r: &Role| matches!(r, Role::Fit | Role::HeldOut);
    let mut fits = Vec::new();
    let mut rows = Vec::with_capacity(cases.len());
    for family in Family::all() {
        let start = placeholder_params(shipped_params(family)?.intra_link);
        for left_out in Source::ALL {
            let mine = |c: &super::published::Case| Family::of(c.gpu) == Some(family);
            if !cases.iter().any(|(c, _)| mine(c) && c.source == left_out) {
                continue;
            }
            let train: Vec<_> = cases
                .iter()
                .filter(|(c, r)| mine(c) && c.source != left_out && usable(r))
                .map(|(c, _)| c)
                .collect();
            let params = if train.is_empty() {
                None
            } else {
                let f = fit::fit(family, &train, start)?;
                let p = f.params;
                fits.push(SourceFit { left_out, fit: f });
                Some(p)
            };
            for (case, role) in cases
                .iter()
                .filter(|(c, _)| mine(c) && c.source == left_out)
            {
                let prediction = match params {
                    Some(p) => fit::predict_with(case, p),
                    None => Err(format!(
                        "no other source covers {}: nothing to fit on",
                        family.name()
                    )),
                };
                let role = if usable(role) {
                    Role::HeldOut
                } else {
                    role.clone()
                };
                rows.push(Row {
                    case: case.clone(),
                    role,
                    prediction,
                    known_miss: None,
                });
            }
        }
    }
    rows.sort_by_key(|r| (r.case.source, r.case.index));
    let in_sample = in_sample(&cases)?;
    Ok(LeaveOneSourceOut {
        evaluation: Evaluation {
            rows,
            unreadable,
            params: Vec::new(),
        },
        fits,
        in_sample,
    })
}

/// Fits each family on all its in-scope rows of every source (from the same placeholders) and
/// predicts those rows with it.
fn in_sample(cases: &[(super::published::Case, Role)]) -> Result<InSample, CalibrateError> {
    let usable = |r: &Role| matches!(r, Role::Fit | Role::HeldOut);
    let mut rows = Vec::new();
    for family in Family::all() {
        let mine: Vec<_> = cases
            .iter()
            .filter(|(c, r)| Family::of(c.gpu) == Some(family) && usable(r))
            .map(|(c, _)| c)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let start = placeholder_params(shipped_params(family)?.intra_link);
        let params = fit::fit(family, &mine, start)?.params;
        for case in mine {
            rows.push(Row {
                case: case.clone(),
                role: Role::HeldOut,
                prediction: fit::predict_with(case, params),
                known_miss: None,
            });
        }
    }
    rows.sort_by_key(|r| (r.case.source, r.case.index));
    Ok(InSample {
        evaluation: Evaluation {
            rows,
            unreadable: Vec::new(),
            params: Vec::new(),
        },
    })
}

impl InSample {
    /// Errors of every in-scope row.
    pub fn summary(&self) -> Summary {
        self.evaluation.held_out(None, false)
    }

    /// Rows whose error exceeds [`WORST_GOAL`].
    pub fn beyond_worst_goal(&self) -> usize {
        self.evaluation
            .rows
            .iter()
            .filter_map(Row::error)
            .filter(|e| e.abs() > WORST_GOAL)
            .count()
    }

    /// One line: the in-sample figures, the rows beyond the worst-row goal.
    pub fn line(&self) -> String {
        let a = self.summary();
        format!(
            "every source fitted together (in-sample) {:3}: median {:5.1}% worst {:5.1}%; {} rows beyond {:.0}%",
            a.n,
            100.0 * a.median,
            100.0 * a.worst,
            self.beyond_worst_goal(),
            100.0 * WORST_GOAL
        )
    }
}

impl LeaveOneSourceOut {
    /// Errors of the predicted in-scope rows of `source` (every source when `None`).
    pub fn summary(&self, source: Option<Source>) -> Summary {
        self.evaluation.held_out(source, false)
    }

    /// The per-source and overall figures as text lines.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for f in &self.fits {
            let [mm, at, mb, oi] = fitted_values(&f.fit.params);
            s.push_str(&format!(
                "without {:19} {}: matmul {mm} attention {at} memory_bound {mb} overlap_interference {oi} ({} rows)\n",
                f.left_out.short(),
                f.fit.family.name(),
                f.fit.rows
            ));
        }
        for src in Source::ALL.map(Some).into_iter().chain([None]) {
            let a = self.summary(src);
            s.push_str(&format!(
                "{:19} predicted {:3}: median {:5.1}% worst {:5.1}%\n",
                src.map_or("all", Source::short),
                a.n,
                100.0 * a.median,
                100.0 * a.worst
            ));
        }
        s.push_str(&self.in_sample.line());
        s.push('\n');
        s
    }
}

/// The leave-one-source-out section of docs/accuracy.md: how the fits are made, the fitted
/// values per left-out source, per-source and overall error, and every predicted row.
pub fn markdown(l: &LeaveOneSourceOut, png: &str) -> String {
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let mut s = String::from("# Leave-one-source-out validation\n\n");
    s.push_str(
        "Generated by `cargo run --release --example fit_published -- --fit --write`; \
         `cargo run --release --example fit_published -- --leave-one-source-out` prints the \
         same figures and every row, and `tests/accuracy/published_throughput.rs` \
         (`leave_one_source_out_errors`) recomputes them. For each source table and GPU \
         family, the family's efficiencies (matmul, memory_bound) are fitted from the \
         placeholder values (0.7, 0.7) on every in-scope row of the other tables, and the \
         left-out table is predicted; a value no remaining row depends on keeps its \
         placeholder (`attention` always: attention cores run published or derived kernel \
         rates, or as GEMMs). `overlap_interference` is measured, not fitted (0.609, from Lee \
         et al. 2025's characterization of compute slowed by overlapped collectives, \
         calibration/data/overlap-interference.json); fitted on the remaining tables it ranged \
         from 0 to 0.90 and did not carry to the table left out (7.1% median and 40.0% worst \
         error before). Kernel rates (calibration/data/attention-kernels.json) and the \
         interference are data and are never fitted. Issue 17's acceptance is a median within 5% and a \
         worst within 12%; the residual notes above say what misses and why.\n\n",
    );
    s.push_str("| left out | family | matmul | attention | memory_bound | overlap_interference | fitting rows |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for f in &l.fits {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            f.left_out.short(),
            f.fit.family.name(),
            fitted_values(&f.fit.params).join(" | "),
            f.fit.rows
        ));
    }
    s.push_str("\n| source | predicted rows | median | worst |\n| --- | --- | --- | --- |\n");
    for src in Source::ALL.map(Some).into_iter().chain([None]) {
        let a = l.summary(src);
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            src.map_or("**all**", Source::short),
            a.n,
            pct(a.median),
            pct(a.worst)
        ));
    }
    let floor = l.in_sample.summary();
    s.push_str(&format!(
        "\nFor comparison, each family fitted on every source's rows at once and those same rows \
         predicted (in-sample, nothing held out): median {}, worst {}, {} of {} rows beyond {:.0}%. \
         A held-out prediction cannot be expected to do better than the model does on the rows \
         it was fitted to, so the worst-row goal is out of reach of this model and data: the \
         rows beyond it are the long-sequence MPT rows (MPT's Triton attention kernel, whose \
         rates no microbenchmark publishes) and rows their own table's peers contradict (see \
         the residual notes above).\n",
        pct(floor.median),
        pct(floor.worst),
        l.in_sample.beyond_worst_goal(),
        floor.n,
        100.0 * WORST_GOAL
    ));
    s.push_str(&format!(
        "\n![leave-one-source-out: predicted vs published TFLOP/s per GPU]({png})\n\n"
    ));
    s.push_str(
        "| source | row | published | predicted | error |\n| --- | --- | --- | --- | --- |\n",
    );
    for r in l.evaluation.rows.iter().filter(|r| r.role == Role::HeldOut) {
        let (pred, err) = match &r.prediction {
            Ok(p) => (
                format!("{:.1}", p.tflops),
                format!("{:+.1}%", 100.0 * p.error),
            ),
            Err(m) => ("-".into(), m.clone()),
        };
        s.push_str(&format!(
            "| {} | {} | {:.1} | {} | {} |\n",
            r.case.source.short(),
            r.case.label,
            r.case.published_tflops,
            pred,
            err
        ));
    }
    s
}

/// One fold's fitted values as its report prints them: matmul, attention, memory_bound and
/// overlap_interference, to three places.
fn fitted_values(p: &Params) -> [String; 4] {
    [
        p.matmul,
        p.attention,
        p.memory_bound,
        p.overlap_interference,
    ]
    .map(|v| format!("{v:.3}"))
}
