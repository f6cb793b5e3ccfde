//! The accuracy guards and goals (`calibration/accuracy-guards.toml`). A guard bounds what the
//! model reaches today on a group of rows (median and worst error, optionally the signed mean
//! and the interval coverage), so that a change that makes it worse fails `tests/accuracy/published_throughput.rs`;
//! a known miss bounds one row the source's guard leaves out, with why. A goal is where the
//! figures should be (the project's accuracy goals); goals are printed beside the guards, never
//! asserted. A bound may only tighten: a commit that raises a bound, drops a guard or adds a
//! known miss must say why in docs/accuracy.md ([`loosened`] lists what a change loosens).

use super::stats::Stats;
use super::{Report, Row, Source};
use serde::{Deserialize, Serialize};

/// The shipped guard file.
pub const SHIPPED: &str = include_str!("../../../../calibration/accuracy-guards.toml");

/// Where it lives, relative to the repository root.
pub const PATH: &str = "calibration/accuracy-guards.toml";

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuardFile {
    #[serde(default)]
    pub goal: Vec<Goal>,
    #[serde(default)]
    pub guard: Vec<Guard>,
    #[serde(default)]
    pub miss: Vec<Miss>,
    /// The bounds of the calibration's held-out split (`parsim::calibrate::evaluate`), which
    /// `calibrate::MEDIAN_BOUND` and `calibrate::BOUND` must equal (tests/accuracy/published_throughput.rs).
    pub held_out: Option<HeldOut>,
    /// Every loosening, with why: docs/accuracy.md lists them.
    #[serde(default)]
    pub loosened: Vec<Loosening>,
}

/// Where a group of sources should be.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    pub name: String,
    pub sources: Vec<String>,
    pub median: f64,
    pub worst: f64,
    /// Bound on |mean signed error|.
    pub signed: Option<f64>,
    /// Least interval coverage.
    pub coverage: Option<f64>,
    pub why: String,
}

/// A bound on what the model reaches on a group of rows.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Guard {
    pub id: String,
    pub sources: Vec<String>,
    /// Only rows whose system starts with this.
    #[serde(default)]
    pub system: String,
    /// Only rows of this model.
    #[serde(default)]
    pub model: String,
    pub median: f64,
    pub worst: f64,
    pub signed: Option<f64>,
    pub coverage: Option<f64>,
    /// What the guard holds and where its bounds come from.
    pub guards: String,
}

/// The held-out split's guards: the median and the worst error of the fitted tables' rows kept
/// out of the fit.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeldOut {
    pub median: f64,
    pub worst: f64,
    /// What the bounds guard and why they are where they are.
    pub guards: String,
}

/// One row a guard leaves out, with its own bound and why it misses.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Miss {
    pub source: String,
    /// The row's position in its table, and its label (checked, so a reordered table shows).
    pub row: usize,
    pub label: String,
    pub bound: f64,
    pub reason: String,
}

/// A bound that was loosened, and why.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Loosening {
    pub guard: String,
    pub change: String,
    pub why: String,
}

fn bad(message: String) -> super::ValidateError {
    super::ValidateError::Guards {
        path: PATH.into(),
        message,
    }
}

/// A bound must be a finite fraction >= 0 (never infinity: a bound that holds anything guards
/// nothing).
fn check_bound(what: &str, field: &str, v: f64) -> Result<(), super::ValidateError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(bad(format!(
            "{what}: {field} = {v} must be a finite fraction >= 0"
        )))
    }
}

/// [`check_bound`] on (median, worst) and, where set, (signed, coverage).
fn check_bounds(
    what: &str,
    [median, worst]: [f64; 2],
    [signed, coverage]: [Option<f64>; 2],
) -> Result<(), super::ValidateError> {
    check_bound(what, "median", median)?;
    check_bound(what, "worst", worst)?;
    for (field, v) in [("signed", signed), ("coverage", coverage)] {
        if let Some(v) = v {
            check_bound(what, field, v)?;
        }
    }
    Ok(())
}

fn check_sources(what: &str, sources: &[String]) -> Result<(), super::ValidateError> {
    if sources.is_empty() {
        return Err(bad(format!("{what}: sources is empty")));
    }
    for s in sources {
        if Source::parse(s).is_none() {
            return Err(bad(format!(
                "{what}: unknown source '{s}' (known: {})",
                Source::ALL.map(Source::key).join(", ")
            )));
        }
    }
    Ok(())
}

impl GuardFile {
    /// Parses and checks a guard file: known sources, unique ids, finite bounds.
    pub fn parse(text: &str) -> Result<GuardFile, super::ValidateError> {
        let f: GuardFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        for g in &f.goal {
            let what = format!("goal '{}'", g.name);
            check_sources(&what, &g.sources)?;
            check_bounds(&what, [g.median, g.worst], [g.signed, g.coverage])?;
        }
        for (i, g) in f.guard.iter().enumerate() {
            let what = format!("guard '{}'", g.id);
            if f.guard[..i].iter().any(|o| o.id == g.id) {
                return Err(bad(format!("{what} is listed twice")));
            }
            check_sources(&what, &g.sources)?;
            check_bounds(&what, [g.median, g.worst], [g.signed, g.coverage])?;
        }
        for m in &f.miss {
            let what = format!("miss '{}' #{}", m.source, m.row);
            check_sources(&what, std::slice::from_ref(&m.source))?;
            check_bound(&what, "bound", m.bound)?;
        }
        if let Some(h) = &f.held_out {
            check_bounds("held_out", [h.median, h.worst], [None, None])?;
        }
        Ok(f)
    }

    /// The shipped file.
    pub fn shipped() -> Result<GuardFile, super::ValidateError> {
        GuardFile::parse(SHIPPED)
    }

    /// The known miss that is `row`, if any.
    pub fn miss_of(&self, row: &Row) -> Option<&Miss> {
        self.miss
            .iter()
            .find(|m| m.source == row.source.key() && m.row == row.index)
    }
}

impl Guard {
    /// The guard covers `row` (its sources, system and model; known misses aside).
    pub fn covers(&self, row: &Row) -> bool {
        self.sources.iter().any(|s| s == row.source.key())
            && row.system.starts_with(&self.system)
            && (self.model.is_empty() || row.model == self.model)
    }

    /// Every source of the guard is in `report`.
    fn runs_in(&self, report: &Report) -> bool {
        self.sources
            .iter()
            .all(|s| report.sources.iter().any(|r| r.key() == s))
    }
}

/// One guard against today's figures.
#[derive(Debug, Clone, Serialize)]
pub struct GuardCheck {
    pub guard: Guard,
    pub stats: Stats,
    /// Why it fails (empty: it holds).
    pub failures: Vec<String>,
}

/// One known miss against today's figures.
#[derive(Debug, Clone, Serialize)]
pub struct MissCheck {
    pub miss: Miss,
    pub error: Option<f64>,
    pub failures: Vec<String>,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Checks every guard whose sources `report` ran (on every row: a sampled run checks none).
pub fn check(file: &GuardFile, report: &Report) -> (Vec<GuardCheck>, Vec<MissCheck>) {
    if report.every != 1 {
        return (Vec::new(), Vec::new());
    }
    let mut guards = Vec::new();
    for g in file.guard.iter().filter(|g| g.runs_in(report)) {
        let rows = report
            .rows
            .iter()
            .filter(|r| g.covers(r) && file.miss_of(r).is_none());
        let s = Stats::of(rows);
        let mut failures = Vec::new();
        match (s.median, s.worst) {
            (Some(m), Some(w)) => {
                if m > g.median {
                    failures.push(format!("median {} above {}", pct(m), pct(g.median)));
                }
                if w > g.worst {
                    failures.push(format!(
                        "worst {} above {} ({})",
                        pct(w),
                        pct(g.worst),
                        s.worst_row.clone().unwrap_or_default()
                    ));
                }
            }
            _ => failures.push("no row is predicted".into()),
        }
        if let (Some(b), Some(x)) = (g.signed, s.mean_signed) {
            if x.abs() > b {
                failures.push(format!("signed mean {} beyond +-{}", pct(x), pct(b)));
            }
        }
        if let Some(b) = g.coverage {
            match s.coverage() {
                Some(c) if c >= b => {}
                c => failures.push(format!(
                    "coverage {} below {}",
                    c.map_or("-".into(), pct),
                    pct(b)
                )),
            }
        }
        guards.push(GuardCheck {
            guard: g.clone(),
            stats: s,
            failures,
        });
    }
    let misses = file
        .miss
        .iter()
        .filter(|m| report.sources.iter().any(|s| s.key() == m.source))
        .map(|m| check_miss(file, m, report))
        .collect();
    (guards, misses)
}

/// A known miss: its row is still the one named, within its own bound, and still beyond the
/// worst bound of some guard over it (else it is no longer a miss and must leave the file).
fn check_miss(file: &GuardFile, m: &Miss, report: &Report) -> MissCheck {
    let row = report
        .rows
        .iter()
        .find(|r| r.source.key() == m.source && r.index == m.row);
    let mut failures = Vec::new();
    let error = row.and_then(Row::error);
    match row {
        None => failures.push("no such row".into()),
        Some(r) if r.label != m.label => {
            failures.push(format!("row #{} is now '{}'", m.row, r.label))
        }
        Some(r) => match error {
            None => failures.push("not predicted".into()),
            Some(e) => {
                if e.abs() > m.bound {
                    failures.push(format!(
                        "error {} beyond its bound {}",
                        pct(e),
                        pct(m.bound)
                    ));
                }
                let needed = file
                    .guard
                    .iter()
                    .filter(|g| g.covers(r))
                    .any(|g| e.abs() > g.worst);
                if !needed {
                    failures.push(format!(
                        "error {} is within its guards' worst bounds: drop it from the misses",
                        pct(e)
                    ));
                }
            }
        },
    }
    MissCheck {
        miss: m.clone(),
        error,
        failures,
    }
}

/// Every guard and known miss that does not hold, one line each (empty: all hold).
pub fn failures(checks: &[GuardCheck], misses: &[MissCheck]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.failures.is_empty())
        .map(|c| format!("{}: {}", c.guard.id, c.failures.join("; ")))
        .chain(misses.iter().filter(|m| !m.failures.is_empty()).map(|m| {
            format!(
                "miss {} #{}: {}",
                m.miss.source,
                m.miss.row,
                m.failures.join("; ")
            )
        }))
        .collect()
}

/// A goal against today's figures: per source, and over its sources together.
#[derive(Debug, Clone, Serialize)]
pub struct GoalCheck {
    pub goal: Goal,
    /// (source key, or "all" for the sources together; figures).
    pub figures: Vec<(String, Stats)>,
}

impl Goal {
    /// The figures of `s` that miss the goal, by name (empty: met).
    pub fn misses(&self, s: &Stats) -> Vec<&'static str> {
        let mut out = Vec::new();
        if s.median.is_none_or(|m| m > self.median) {
            out.push("median");
        }
        if s.worst.is_none_or(|w| w > self.worst) {
            out.push("worst");
        }
        if self
            .signed
            .is_some_and(|b| s.mean_signed.is_none_or(|x| x.abs() > b))
        {
            out.push("signed");
        }
        if self
            .coverage
            .is_some_and(|b| s.coverage().is_none_or(|c| c < b))
        {
            out.push("coverage");
        }
        out
    }
}

/// Every goal with the figures of its sources that `report` ran (all of them together too,
/// when it names several and every one ran); none for a sampled run.
pub fn goals(file: &GuardFile, report: &Report) -> Vec<GoalCheck> {
    let mut out = Vec::new();
    if report.every != 1 {
        return out;
    }
    for g in &file.goal {
        let ran: Vec<Source> = g
            .sources
            .iter()
            .filter_map(|s| Source::parse(s))
            .filter(|s| report.sources.contains(s))
            .collect();
        if ran.is_empty() {
            continue;
        }
        let mut figures: Vec<(String, Stats)> = ran
            .iter()
            .map(|&s| (s.key().to_string(), Stats::of(report.of(s))))
            .collect();
        if ran.len() > 1 && ran.len() == g.sources.len() {
            let all = report.rows.iter().filter(|r| ran.contains(&r.source));
            figures.push(("all".into(), Stats::of(all)));
        }
        out.push(GoalCheck {
            goal: g.clone(),
            figures,
        });
    }
    out
}

/// What `new` loosens against `old`: a guard dropped or its scope changed, a median, worst or
/// signed bound raised, a coverage bound lowered, a known miss added or its bound raised. Each
/// item names the guard (or the miss, as `miss <source> #<row>`).
pub fn loosened(old: &GuardFile, new: &GuardFile) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for o in &old.guard {
        let Some(n) = new.guard.iter().find(|n| n.id == o.id) else {
            out.push((o.id.clone(), "removed".into()));
            continue;
        };
        if (&o.sources, &o.system, &o.model) != (&n.sources, &n.system, &n.model) {
            out.push((o.id.clone(), "its rows changed".into()));
        }
        let mut raised = |name: &str, a: Option<f64>, b: Option<f64>, higher_is_looser: bool| {
            let looser = match (a, b) {
                (Some(a), Some(b)) => (b > a) == higher_is_looser && a != b,
                (Some(_), None) => true,
                _ => false,
            };
            if looser {
                let v = |x: Option<f64>| x.map_or("none".to_string(), |x| x.to_string());
                out.push((o.id.clone(), format!("{name} {} -> {}", v(a), v(b))));
            }
        };
        raised("median", Some(o.median), Some(n.median), true);
        raised("worst", Some(o.worst), Some(n.worst), true);
        raised("signed", o.signed, n.signed, true);
        raised("coverage", o.coverage, n.coverage, false);
    }
    match (&old.held_out, &new.held_out) {
        (Some(_), None) => out.push(("held_out".into(), "removed".into())),
        (Some(o), Some(n)) => {
            for (name, a, b) in [("median", o.median, n.median), ("worst", o.worst, n.worst)] {
                if b > a {
                    out.push(("held_out".into(), format!("{name} {a} -> {b}")));
                }
            }
        }
        _ => {}
    }
    for n in &new.miss {
        let id = format!("miss {} #{}", n.source, n.row);
        match old
            .miss
            .iter()
            .find(|o| o.source == n.source && o.row == n.row)
        {
            None => out.push((id, "added".into())),
            Some(o) if n.bound > o.bound => {
                out.push((id, format!("bound {} -> {}", o.bound, n.bound)))
            }
            Some(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        [[guard]]
        id = "a"
        sources = ["vtrain"]
        median = 0.1
        worst = 0.3
        coverage = 0.5
        guards = "test"

        [[miss]]
        source = "vtrain"
        row = 3
        label = "r3"
        bound = 0.9
        reason = "test"
    "#;

    #[test]
    fn the_shipped_file_parses() {
        let f = GuardFile::shipped().unwrap();
        assert!(!f.guard.is_empty() && !f.goal.is_empty());
    }

    #[test]
    fn infinite_negative_or_unknown_is_refused_by_name() {
        let inf = BASE.replace("worst = 0.3", "worst = inf");
        let e = GuardFile::parse(&inf).unwrap_err().to_string();
        assert!(e.contains("guard 'a'") && e.contains("worst"), "{e}");
        let neg = BASE.replace("bound = 0.9", "bound = -0.1");
        assert!(GuardFile::parse(&neg)
            .unwrap_err()
            .to_string()
            .contains("bound"));
        let unknown = BASE.replace("sources = [\"vtrain\"]", "sources = [\"nope\"]");
        assert!(GuardFile::parse(&unknown)
            .unwrap_err()
            .to_string()
            .contains("'nope'"));
        let twice = format!("{BASE}\n[[guard]]\nid = \"a\"\nsources = [\"vtrain\"]\nmedian = 0.1\nworst = 0.2\nguards = \"x\"\n");
        assert!(GuardFile::parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    #[test]
    fn a_held_out_bound_raised_or_dropped_is_a_loosening() {
        let with = |median: f64, worst: f64| {
            GuardFile::parse(&format!(
                "{BASE}\n[held_out]\nmedian = {median}\nworst = {worst}\nguards = \"t\"\n"
            ))
            .unwrap()
        };
        let base = with(0.07, 0.25);
        assert!(loosened(&base, &with(0.06, 0.25)).is_empty());
        assert_eq!(
            loosened(&base, &with(0.07, 0.3)),
            vec![("held_out".into(), "worst 0.25 -> 0.3".into())]
        );
        assert_eq!(
            loosened(&base, &with(0.08, 0.25))[0].1,
            "median 0.07 -> 0.08"
        );
        let without = GuardFile::parse(BASE).unwrap();
        assert_eq!(
            loosened(&base, &without),
            vec![("held_out".into(), "removed".into())]
        );
        let inf = format!("{BASE}\n[held_out]\nmedian = 0.07\nworst = inf\nguards = \"t\"\n");
        assert!(GuardFile::parse(&inf)
            .unwrap_err()
            .to_string()
            .contains("held_out"));
    }

    #[test]
    fn tightening_is_silent_and_every_loosening_is_named() {
        let base = GuardFile::parse(BASE).unwrap();
        let tighter = GuardFile::parse(
            &BASE
                .replace("worst = 0.3", "worst = 0.2")
                .replace("coverage = 0.5", "coverage = 0.6")
                .replace("bound = 0.9", "bound = 0.8"),
        )
        .unwrap();
        assert!(loosened(&base, &tighter).is_empty());
        assert!(loosened(&base, &base).is_empty());
        let looser = GuardFile::parse(
            &BASE
                .replace("median = 0.1", "median = 0.2")
                .replace("coverage = 0.5", "coverage = 0.4")
                .replace("bound = 0.9", "bound = 1.0"),
        )
        .unwrap();
        let l = loosened(&base, &looser);
        let names: Vec<String> = l.iter().map(|(id, what)| format!("{id}: {what}")).collect();
        assert_eq!(l.len(), 3, "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("a: median")));
        assert!(names.iter().any(|n| n.starts_with("a: coverage")));
        assert!(names.iter().any(|n| n.starts_with("miss vtrain #3: bound")));
        // Dropping the coverage bound, the guard, or adding a miss loosens too.
        let no_cov = GuardFile::parse(&BASE.replace("coverage = 0.5\n", "")).unwrap();
        assert_eq!(loosened(&base, &no_cov).len(), 1);
        let empty = GuardFile::parse("").unwrap();
        assert_eq!(
            loosened(&base, &empty),
            vec![("a".into(), "removed".into())]
        );
        assert_eq!(loosened(&empty, &base)[0].1, "added");
        let scope =
            GuardFile::parse(&BASE.replace("id = \"a\"", "id = \"a\"\nsystem = \"A100\"")).unwrap();
        assert_eq!(loosened(&base, &scope)[0].1, "its rows changed");
    }
}
