//! Fits a hardware profile's efficiency parameters to measured step times and peak memory
//! (`parsim calibrate`), with the model's own cost functions (every prediction is a full
//! `estimate`), held-out validation, goodness of fit, confidence intervals, and a report of
//! the parameters the measurements cannot identify.
//!
//! Robustness (documented choices): repeats of one configuration are collapsed to their
//! median; after a first fit, measurements whose log residual lies more than 3 scaled MADs
//! from the median are set aside as outliers and the fit is repeated once.

use super::fields::{self, median, ProfileField, Scale};
use super::fit::nelder_mead_restarted;
use super::measurements::Measurement;
use crate::config::GpuProfile;
use crate::estimate::estimate;
use nalgebra::DMatrix;
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A fitted profile field and the change of variables it is fitted in.
#[derive(Debug)]
pub struct FitParam {
    pub field: ProfileField,
    /// A time is fitted in log space, a fraction in logit space between its bounds.
    pub scale: Scale,
}

impl FitParam {
    pub fn name(&self) -> &'static str {
        self.field.name
    }

    fn get(&self, g: &GpuProfile) -> f64 {
        (self.field.get)(g)
    }

    fn set(&self, g: &mut GpuProfile, v: f64) {
        (self.field.set)(g, v);
    }

    /// The bounds of a fraction; `None` for a time.
    fn bounds(&self) -> Option<(f64, f64)> {
        match self.scale {
            Scale::Logit { lo, hi } => Some((lo, hi)),
            Scale::Log => None,
        }
    }
}

const FRACTION: Scale = Scale::Logit { lo: 0.01, hi: 1.0 };
const SHARE: Scale = Scale::Logit { lo: 0.0, hi: 1.0 };

/// The step-time parameters `calibrate` fits (runtime overhead is fitted from memory).
pub const PARAMS: [FitParam; 8] = [
    FitParam {
        field: fields::MATMUL,
        scale: FRACTION,
    },
    FitParam {
        field: fields::ATTENTION,
        scale: FRACTION,
    },
    FitParam {
        field: fields::MEMORY_BOUND,
        scale: FRACTION,
    },
    FitParam {
        field: fields::KERNEL_OVERHEAD_S,
        scale: Scale::Log,
    },
    FitParam {
        field: fields::OVERLAP_INTERFERENCE,
        scale: SHARE,
    },
    FitParam {
        field: fields::SYNC_SKEW,
        scale: SHARE,
    },
    FitParam {
        field: fields::INTRA_LINK,
        scale: FRACTION,
    },
    FitParam {
        field: fields::INTER_LINK,
        scale: FRACTION,
    },
];

/// A parameter's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ParamReport {
    pub name: String,
    pub before: f64,
    pub after: f64,
    /// 95% confidence interval (Student's t on the Gauss-Newton covariance), when available.
    pub ci95: Option<(f64, f64)>,
    pub identifiable: bool,
    /// Measured apart from the step times (its provenance says how) and held at that value:
    /// never a free parameter of the fit.
    pub measured: bool,
    pub note: String,
}

/// One (collapsed) measurement, predicted before and after.
#[derive(Debug, Clone, Serialize)]
pub struct RowReport {
    pub label: String,
    pub line: usize,
    /// "fit", "held out" or "outlier".
    pub role: &'static str,
    pub repeats: usize,
    pub measured_s: f64,
    pub before_s: f64,
    pub after_s: f64,
    pub measured_peak_bytes: Option<u64>,
    pub before_peak_bytes: u64,
    pub after_peak_bytes: u64,
}

impl RowReport {
    pub fn step_error(&self, after: bool) -> f64 {
        (if after { self.after_s } else { self.before_s }) / self.measured_s - 1.0
    }

    pub fn peak_error(&self, after: bool) -> Option<f64> {
        self.measured_peak_bytes.map(|m| {
            (if after {
                self.after_peak_bytes
            } else {
                self.before_peak_bytes
            }) as f64
                / m as f64
                - 1.0
        })
    }
}

/// The whole fit.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileFit {
    #[serde(skip)]
    pub profile: GpuProfile,
    pub params: Vec<ParamReport>,
    pub runtime_overhead_bytes: (u64, u64),
    pub rows: Vec<RowReport>,
    /// R^2 of log step times on the fitting rows.
    pub r2: f64,
    /// Root mean square of the relative step-time error on the fitting rows.
    pub residual_rms: f64,
    pub degrees_of_freedom: usize,
}

/// Why a fit failed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileFitError {
    #[error("line {line}: {message}")]
    Predict { line: usize, message: String },
    #[error("no measurements left to fit (every one is held out)")]
    NothingToFit,
}

struct Group<'a> {
    /// The configuration as JSON: what its repeats share.
    key: String,
    first: &'a Measurement,
    repeats: usize,
    step_s: f64,
    peak: Option<u64>,
    holdout: bool,
}

/// What repeats of one configuration share: its configuration as JSON.
fn config_key(m: &Measurement) -> String {
    serde_json::to_string(&m.config).unwrap_or_default()
}

fn collapse(ms: &[Measurement]) -> Vec<Group<'_>> {
    let mut by: BTreeMap<String, Vec<&Measurement>> = BTreeMap::new();
    let mut order = Vec::new();
    for m in ms {
        let key = config_key(m);
        if !by.contains_key(&key) {
            order.push(key.clone());
        }
        by.entry(key).or_default().push(m);
    }
    order
        .into_iter()
        .map(|key| {
            let g = &by[&key];
            let peaks: Vec<f64> = g
                .iter()
                .filter_map(|m| m.peak_bytes)
                .map(|b| b as f64)
                .collect();
            Group {
                first: g[0],
                repeats: g.len(),
                key,
                step_s: median(g.iter().map(|m| m.step_s).collect()),
                peak: (!peaks.is_empty()).then(|| median(peaks).round() as u64),
                holdout: g.iter().any(|m| m.holdout),
            }
        })
        .collect()
}

fn predict(g: &Group<'_>, profile: &Arc<GpuProfile>) -> Result<(f64, u64), ProfileFitError> {
    let err = |e: String| ProfileFitError::Predict {
        line: g.first.line,
        message: e,
    };
    let r = g.first.resolve(profile).map_err(|e| err(e.to_string()))?;
    let e = estimate(&r).map_err(|e| err(e.to_string()))?;
    Ok((e.time.step_s, e.memory.per_gpu_max_bytes))
}

/// Which configurations are held out: those marked `holdout` when any is, else every fourth
/// (when there are at least four).
fn held_out(groups: &[Group<'_>]) -> Vec<bool> {
    let any_marked = groups.iter().any(|g| g.holdout);
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if any_marked {
                g.holdout
            } else {
                groups.len() >= 4 && i % 4 == 3
            }
        })
        .collect()
}

/// The least change of some fitting line's log step time (0.5%) that moving a parameter by 5%
/// of its range (a time by 20%) must make for the parameter to count as identifiable: below
/// it, the ops the parameter times are too small a share of every step to be told from the
/// measurements' noise (a few percent), and fitting it would only absorb that noise.
const IDENTIFIABLE_LOG_STEP: f64 = 5e-3;

/// Per measurement line, whether [`fit_profile`] holds it out (its configuration's group is
/// held out by the rule of [`held_out`]).
pub fn held_out_lines(ms: &[Measurement]) -> Vec<bool> {
    let groups = collapse(ms);
    let held: BTreeMap<&str, bool> = groups
        .iter()
        .map(|g| g.key.as_str())
        .zip(held_out(&groups))
        .collect();
    ms.iter().map(|m| held[config_key(m).as_str()]).collect()
}

/// The configurations [`fit_profile`] holds out, each as its first measurement and its
/// median measured step time (what the held-out residuals of the interval model compare).
pub fn held_out_configs(ms: &[Measurement]) -> Vec<(&Measurement, f64)> {
    let groups = collapse(ms);
    let held = held_out(&groups);
    groups
        .iter()
        .zip(held)
        .filter(|(_, h)| *h)
        .map(|(g, _)| (g.first, g.step_s))
        .collect()
}

/// The fit's working state: the base profile, the collapsed measurements and their log step
/// times, and the starting coordinates of every parameter in [`PARAMS`].
struct Fitter<'a> {
    base: &'a GpuProfile,
    groups: &'a [Group<'a>],
    /// Log of each group's measured step time.
    measured: Vec<f64>,
    /// Unbounded coordinates of the base values, strictly inside the bounds.
    u0: Vec<f64>,
}

impl<'a> Fitter<'a> {
    fn new(base: &'a GpuProfile, groups: &'a [Group<'a>]) -> Self {
        // Start strictly inside the bounds: a value on its bound is a flat spot in logit space.
        let u0 = PARAMS
            .iter()
            .map(|p| {
                let v = p.get(base);
                let v = match p.bounds() {
                    None => v,
                    Some((lo, hi)) => v.clamp(lo + 0.02 * (hi - lo), hi - 0.02 * (hi - lo)),
                };
                p.scale.to_unbounded(v)
            })
            .collect();
        Fitter {
            base,
            groups,
            measured: groups.iter().map(|g| g.step_s.ln()).collect(),
            u0,
        }
    }

    /// The base profile with the parameters `idx` taken from `u` (a full-length coordinate
    /// vector); every other field keeps its exact base value.
    fn profile_at(&self, u: &[f64], idx: &[usize]) -> GpuProfile {
        let mut g = self.base.clone();
        for &j in idx {
            PARAMS[j].set(&mut g, PARAMS[j].scale.from_unbounded(u[j]));
        }
        g
    }

    /// The full coordinate vector with the `free` parameters taken from `x`.
    fn u_at(&self, x: &[f64], free: &[usize]) -> Vec<f64> {
        let mut u = self.u0.clone();
        for (k, &j) in free.iter().enumerate() {
            u[j] = x[k];
        }
        u
    }

    /// Predicted log step times of the groups `rows` under profile `g`.
    fn log_pred(&self, rows: &[usize], g: &GpuProfile) -> Result<Vec<f64>, ProfileFitError> {
        let g = Arc::new(g.clone());
        rows.iter()
            .map(|&i| predict(&self.groups[i], &g).map(|(s, _)| s.ln()))
            .collect()
    }

    /// Sum of squared log residuals over `rows` (infinite when a prediction fails).
    fn sse(&self, rows: &[usize], g: &GpuProfile) -> f64 {
        match self.log_pred(rows, g) {
            Ok(p) => rows
                .iter()
                .zip(p)
                .map(|(&i, x)| (x - self.measured[i]).powi(2))
                .sum(),
            Err(_) => f64::INFINITY,
        }
    }

    /// Identifiability: whether moving each parameter moves any fitting prediction (in log
    /// time) by more than 1e-4.
    fn identifiable(&self, train: &[usize]) -> Result<Vec<bool>, ProfileFitError> {
        let base_logs = self.log_pred(train, self.base)?;
        PARAMS
            .iter()
            .map(|p| {
                // Move the value itself by 5% of its range toward the interior (a time by
                // 20%): a step in logit coordinates would not move a value sitting on its bound.
                let v = p.get(self.base);
                let moved_v = match p.bounds() {
                    None => v * 1.2,
                    Some((lo, hi)) if v > 0.5 * (lo + hi) => v - 0.05 * (hi - lo),
                    Some((lo, hi)) => v + 0.05 * (hi - lo),
                };
                let mut g = self.base.clone();
                p.set(&mut g, moved_v);
                let moved = self.log_pred(train, &g)?;
                let sens = moved
                    .iter()
                    .zip(&base_logs)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                Ok(sens > IDENTIFIABLE_LOG_STEP)
            })
            .collect()
    }

    /// Nelder-Mead on the `free` coordinates over `rows` from `start`, restarted from its
    /// optimum until it stops improving.
    fn fit_on(&self, rows: &[usize], start: &[f64], free: &[usize]) -> Vec<f64> {
        if free.is_empty() {
            return Vec::new();
        }
        let f = |x: &[f64]| self.sse(rows, &self.profile_at(&self.u_at(x, free), free));
        nelder_mead_restarted(f, start, 1e-12, 600, 6).0
    }

    /// Fitting rows whose log residual under `fitted` lies beyond 3 scaled MADs of the median
    /// (only when there are enough rows to spare).
    fn outliers(
        &self,
        train: &[usize],
        fitted: &GpuProfile,
        n_free: usize,
    ) -> Result<Vec<bool>, ProfileFitError> {
        let resid: Vec<f64> = self
            .log_pred(train, fitted)?
            .iter()
            .zip(train)
            .map(|(p, &i)| p - self.measured[i])
            .collect();
        let med = median(resid.clone());
        let mad = 1.4826 * median(resid.iter().map(|r| (r - med).abs()).collect());
        let mut outlier = vec![false; self.groups.len()];
        if mad > 0.0 && train.len() > n_free + 2 {
            for (k, &i) in train.iter().enumerate() {
                outlier[i] = (resid[k] - med).abs() > 3.0 * mad;
            }
        }
        Ok(outlier)
    }

    /// R^2 of log step times and the rms relative step-time error over `kept` under `fitted`.
    fn goodness(
        &self,
        kept: &[usize],
        fitted: &GpuProfile,
    ) -> Result<(f64, f64, f64), ProfileFitError> {
        let logs = self.log_pred(kept, fitted)?;
        let measured = &self.measured;
        let ss_res: f64 = kept
            .iter()
            .zip(&logs)
            .map(|(&i, p)| (p - measured[i]).powi(2))
            .sum();
        let mean = kept.iter().map(|&i| measured[i]).sum::<f64>() / kept.len() as f64;
        let ss_tot: f64 = kept.iter().map(|&i| (measured[i] - mean).powi(2)).sum();
        let r2 = if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            f64::NAN
        };
        let residual_rms = (kept
            .iter()
            .zip(&logs)
            .map(|(&i, p)| (p.exp() / measured[i].exp() - 1.0).powi(2))
            .sum::<f64>()
            / kept.len() as f64)
            .sqrt();
        Ok((ss_res, r2, residual_rms))
    }

    /// 95% confidence intervals of the `free` parameters at coordinates `x` (Student's t on
    /// the Gauss-Newton covariance of the log residuals over `kept`), by index into [`PARAMS`].
    fn confidence_intervals(
        &self,
        kept: &[usize],
        x: &[f64],
        free: &[usize],
        ss_res: f64,
    ) -> Result<Vec<Option<(f64, f64)>>, ProfileFitError> {
        let mut ci: Vec<Option<(f64, f64)>> = vec![None; PARAMS.len()];
        let dof = kept.len().saturating_sub(free.len());
        if dof == 0 || free.is_empty() {
            return Ok(ci);
        }
        let h = 1e-4;
        let mut jac = DMatrix::<f64>::zeros(kept.len(), free.len());
        for (k, &j) in free.iter().enumerate() {
            let mut u = self.u_at(x, free);
            u[j] += h;
            let up = self.log_pred(kept, &self.profile_at(&u, free))?;
            u[j] -= 2.0 * h;
            let dn = self.log_pred(kept, &self.profile_at(&u, free))?;
            for r in 0..kept.len() {
                jac[(r, k)] = (up[r] - dn[r]) / (2.0 * h);
            }
        }
        let s2 = ss_res / dof as f64;
        // A parameter fitted onto its bound has a flat (zero) column: leave it out so the
        // others still get intervals; it is reported as sitting on its bound.
        let live: Vec<usize> = (0..free.len())
            .filter(|&k| (0..kept.len()).map(|r| jac[(r, k)].powi(2)).sum::<f64>() > 1e-12)
            .collect();
        let reduced = jac.select_columns(live.iter());
        if let Some(inv) = (reduced.transpose() * &reduced).try_inverse() {
            let t = StudentsT::new(0.0, 1.0, dof as f64).map_or(f64::NAN, |d| d.inverse_cdf(0.975));
            let u = self.u_at(x, free);
            for (c, &k) in live.iter().enumerate() {
                let j = free[k];
                let sd = (s2 * inv[(c, c)]).max(0.0).sqrt();
                let scale = PARAMS[j].scale;
                let (a, b) = (
                    scale.from_unbounded(u[j] - t * sd),
                    scale.from_unbounded(u[j] + t * sd),
                );
                if a.is_finite() && b.is_finite() {
                    ci[j] = Some((a.min(b), a.max(b)));
                }
            }
        }
        Ok(ci)
    }

    /// Runtime overhead from memory: the median gap between measured and predicted peaks
    /// over `mem_rows` (None when no row has a measured peak).
    fn runtime_overhead(&self, mem_rows: &[usize], fitted: &GpuProfile) -> Option<u64> {
        if mem_rows.is_empty() {
            return None;
        }
        let overhead_before = self.base.runtime_overhead_bytes;
        let fitted = Arc::new(fitted.clone());
        let gaps: Vec<f64> = mem_rows
            .iter()
            .map(|&i| {
                let g = &self.groups[i];
                let (_, p) = predict(g, &fitted).unwrap_or((0.0, 0));
                g.peak.unwrap_or(0) as f64 - (p as f64 - overhead_before as f64)
            })
            .collect();
        Some(median(gaps).max(0.0).round() as u64)
    }
}

/// Profiles carry 4 decimals of a fitted fraction and 4 significant figures of a time.
fn round_fitted(fitted: &mut GpuProfile, free: &[usize]) {
    for &j in free {
        let p = &PARAMS[j];
        let v = p.get(fitted);
        let rounded = if p.bounds().is_some() {
            (v * 1e4).round() / 1e4
        } else if v > 0.0 {
            let scale = 10f64.powi(3 - v.log10().floor() as i32);
            (v * scale).round() / scale
        } else {
            v
        };
        p.set(fitted, rounded);
    }
}

/// What the fit found, for [`param_reports`].
struct Outcome<'a> {
    stamp: &'a str,
    free: &'a [usize],
    /// By index into [`PARAMS`]: held at a measured value.
    measured: &'a [bool],
    identifiable: &'a [bool],
    ci: &'a [Option<(f64, f64)>],
    r2: f64,
    residual_rms: f64,
}

/// One report per parameter; the provenance of each fitted one is written into `fitted`.
fn param_reports(base: &GpuProfile, fitted: &mut GpuProfile, o: &Outcome<'_>) -> Vec<ParamReport> {
    let (stamp, r2, rms) = (o.stamp, o.r2, 100.0 * o.residual_rms);
    let mut params = Vec::new();
    for (j, p) in PARAMS.iter().enumerate() {
        let is_free = o.free.contains(&j);
        let note = if o.measured[j] {
            base.provenance
                .get(p.name())
                .cloned()
                .unwrap_or_else(|| "measured, not fitted".into())
        } else if is_free {
            match o.ci[j] {
                Some((a, b)) => format!(
                    "{stamp}; 95% CI [{a:.4}, {b:.4}]; R^2 {r2:.3}; residual spread {rms:.1}% rms"
                ),
                None => format!(
                    "{stamp}; R^2 {r2:.3}; residual spread {rms:.1}% rms; no confidence interval (on its bound, too few degrees of freedom, or collinear)"
                ),
            }
        } else if o.identifiable[j] {
            "identifiable, but there are more parameters than measurements: kept".to_string()
        } else {
            "not identifiable from these measurements (no prediction depends on it): kept at the base value".to_string()
        };
        if is_free {
            fitted.provenance.insert(p.name().to_string(), note.clone());
        }
        params.push(ParamReport {
            name: p.name().to_string(),
            before: p.get(base),
            after: p.get(fitted),
            ci95: o.ci[j],
            identifiable: o.identifiable[j],
            measured: o.measured[j],
            note,
        });
    }
    params
}

/// Every configuration predicted under `base` and `fitted`, with its role in the fit.
fn row_reports(
    groups: &[Group<'_>],
    base: &GpuProfile,
    fitted: &GpuProfile,
    held: &[bool],
    outlier: &[bool],
) -> Result<Vec<RowReport>, ProfileFitError> {
    let (base, fitted) = (Arc::new(base.clone()), Arc::new(fitted.clone()));
    let mut rows = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let (bs, bp) = predict(g, &base)?;
        let (a_s, ap) = predict(g, &fitted)?;
        rows.push(RowReport {
            label: g.first.label.clone(),
            line: g.first.line,
            role: if held[i] {
                "held out"
            } else if outlier[i] {
                "outlier"
            } else {
                "fit"
            },
            repeats: g.repeats,
            measured_s: g.step_s,
            before_s: bs,
            after_s: a_s,
            measured_peak_bytes: g.peak,
            before_peak_bytes: bp,
            after_peak_bytes: ap,
        });
    }
    Ok(rows)
}

/// Fits `base`'s parameters to `ms`. Rows marked `holdout` are held out; when none are, every
/// fourth configuration is (if there are at least four).
pub fn fit_profile(
    base: &GpuProfile,
    ms: &[Measurement],
    origin: &str,
) -> Result<ProfileFit, ProfileFitError> {
    fit_profile_holding(base, ms, origin, &[])
}

/// [`fit_profile`], holding the fields named in `measured` at their values in `base`: values
/// measured apart from the step times (the GEMM timings' own efficiency), which the scalar fit
/// must not move to absorb what some other cost of the fitting steps leaves over.
pub fn fit_profile_holding(
    base: &GpuProfile,
    ms: &[Measurement],
    origin: &str,
    measured: &[&str],
) -> Result<ProfileFit, ProfileFitError> {
    let measured: Vec<bool> = PARAMS
        .iter()
        .map(|p| measured.contains(&p.name()))
        .collect();
    let groups = collapse(ms);
    let held = held_out(&groups);
    let train: Vec<usize> = (0..groups.len()).filter(|&i| !held[i]).collect();
    if train.is_empty() {
        return Err(ProfileFitError::NothingToFit);
    }
    let fitter = Fitter::new(base, &groups);

    let identifiable = fitter.identifiable(&train)?;
    let mut free: Vec<usize> = (0..PARAMS.len())
        .filter(|&j| identifiable[j] && !measured[j])
        .collect();
    // More parameters than measurements cannot be fitted: keep the most sensitive ones.
    free.truncate(train.len().saturating_sub(1).max(1).min(free.len()));

    let start: Vec<f64> = free.iter().map(|&j| fitter.u0[j]).collect();
    let mut x = fitter.fit_on(&train, &start, &free);
    // Outliers: beyond 3 scaled MADs of the log residuals, then refit once.
    let mut fitted = fitter.profile_at(&fitter.u_at(&x, &free), &free);
    let outlier = fitter.outliers(&train, &fitted, free.len())?;
    let kept: Vec<usize> = train.iter().copied().filter(|&i| !outlier[i]).collect();
    if kept.len() < train.len() {
        x = fitter.fit_on(&kept, &x, &free);
        fitted = fitter.profile_at(&fitter.u_at(&x, &free), &free);
    }
    round_fitted(&mut fitted, &free);

    // Goodness of fit and Gauss-Newton confidence intervals on the kept fitting rows.
    let (ss_res, r2, residual_rms) = fitter.goodness(&kept, &fitted)?;
    let dof = kept.len().saturating_sub(free.len());
    let ci = fitter.confidence_intervals(&kept, &x, &free, ss_res)?;

    let mem_rows: Vec<usize> = kept
        .iter()
        .copied()
        .filter(|&i| groups[i].peak.is_some())
        .collect();
    let overhead_before = base.runtime_overhead_bytes;
    if let Some(overhead) = fitter.runtime_overhead(&mem_rows, &fitted) {
        fitted.runtime_overhead_bytes = overhead;
    }

    let stamp = format!(
        "{} from {origin} ({} measurements, {} configurations)",
        crate::config::CALIBRATE_PROVENANCE,
        ms.len(),
        groups.len()
    );
    let outcome = Outcome {
        stamp: &stamp,
        free: &free,
        measured: &measured,
        identifiable: &identifiable,
        ci: &ci,
        r2,
        residual_rms,
    };
    let params = param_reports(base, &mut fitted, &outcome);
    if !mem_rows.is_empty() {
        fitted.provenance.insert(
            "runtime_overhead_bytes".into(),
            format!("{stamp}; median gap between measured and predicted peak memory over {} configurations", mem_rows.len()),
        );
    }
    let rows = row_reports(&groups, base, &fitted, &held, &outlier)?;
    Ok(ProfileFit {
        profile: fitted,
        params,
        runtime_overhead_bytes: (overhead_before, 0),
        rows,
        r2,
        residual_rms,
        degrees_of_freedom: dof,
    }
    .with_overhead())
}

impl ProfileFit {
    fn with_overhead(mut self) -> Self {
        self.runtime_overhead_bytes.1 = self.profile.runtime_overhead_bytes;
        self
    }

    /// (median, worst) absolute relative error over rows with `role`, step time or memory.
    pub fn summary(&self, role: &str, memory: bool, after: bool) -> Option<(f64, f64)> {
        let errs: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.role == role)
            .filter_map(|r| {
                if memory {
                    r.peak_error(after)
                } else {
                    Some(r.step_error(after))
                }
            })
            .map(f64::abs)
            .collect();
        if errs.is_empty() {
            return None;
        }
        let worst = errs.iter().copied().fold(0.0, f64::max);
        Some((median(errs), worst))
    }
}
