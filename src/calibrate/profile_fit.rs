//! Fits a hardware profile's efficiency parameters to measured step times and peak memory
//! (`parsim calibrate`), with the model's own cost functions (every prediction is a full
//! `estimate`), held-out validation, goodness of fit, confidence intervals, and a report of
//! the parameters the measurements cannot identify.
//!
//! Robustness (documented choices): repeats of one configuration are collapsed to their
//! median; after a first fit, measurements whose log residual lies more than 3 scaled MADs
//! from the median are set aside as outliers and the fit is repeated once.

use super::fit::nelder_mead;
use super::measurements::Measurement;
use crate::config::GpuProfile;
use crate::estimate::estimate;
use nalgebra::DMatrix;
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;

/// A fitted profile field: how to read and write it and its bounds.
pub struct FitParam {
    pub name: &'static str,
    get: fn(&GpuProfile) -> f64,
    set: fn(&mut GpuProfile, f64),
    lo: f64,
    hi: f64,
    /// Fitted in log space (a time), else in logit space between lo and hi.
    log_scale: bool,
}

impl FitParam {
    fn coordinate_of(&self, v: f64) -> f64 {
        if self.log_scale {
            v.max(1e-12).ln()
        } else {
            let x = ((v - self.lo) / (self.hi - self.lo)).clamp(1e-6, 1.0 - 1e-6);
            (x / (1.0 - x)).ln()
        }
    }

    fn value_of(&self, u: f64) -> f64 {
        if self.log_scale {
            u.exp()
        } else {
            self.lo + (self.hi - self.lo) / (1.0 + (-u).exp())
        }
    }
}

/// The step-time parameters `calibrate` fits (runtime overhead is fitted from memory).
pub const PARAMS: [FitParam; 7] = [
    FitParam {
        name: "efficiency.matmul",
        get: |g| g.efficiency.matmul,
        set: |g, v| g.efficiency.matmul = v,
        lo: 0.01,
        hi: 1.0,
        log_scale: false,
    },
    FitParam {
        name: "efficiency.attention",
        get: |g| g.efficiency.attention,
        set: |g, v| g.efficiency.attention = v,
        lo: 0.01,
        hi: 1.0,
        log_scale: false,
    },
    FitParam {
        name: "efficiency.memory_bound",
        get: |g| g.efficiency.memory_bound,
        set: |g, v| g.efficiency.memory_bound = v,
        lo: 0.01,
        hi: 1.0,
        log_scale: false,
    },
    FitParam {
        name: "efficiency.kernel_overhead_s",
        get: |g| g.efficiency.kernel_overhead_s,
        set: |g, v| g.efficiency.kernel_overhead_s = v,
        lo: 0.0,
        hi: 0.0,
        log_scale: true,
    },
    FitParam {
        name: "efficiency.overlap_interference",
        get: |g| g.efficiency.overlap_interference,
        set: |g, v| g.efficiency.overlap_interference = v,
        lo: 0.0,
        hi: 1.0,
        log_scale: false,
    },
    FitParam {
        name: "links.intra_node.efficiency",
        get: |g| g.links.intra_node.efficiency,
        set: |g, v| g.links.intra_node.efficiency = v,
        lo: 0.01,
        hi: 1.0,
        log_scale: false,
    },
    FitParam {
        name: "links.inter_node.efficiency",
        get: |g| g.links.inter_node.efficiency,
        set: |g, v| g.links.inter_node.efficiency = v,
        lo: 0.01,
        hi: 1.0,
        log_scale: false,
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
    first: &'a Measurement,
    repeats: usize,
    step_s: f64,
    peak: Option<u64>,
    holdout: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn collapse(ms: &[Measurement]) -> Vec<Group<'_>> {
    let mut by: BTreeMap<String, Vec<&Measurement>> = BTreeMap::new();
    let mut order = Vec::new();
    for m in ms {
        let key = serde_json::to_string(&m.config).unwrap_or_default();
        if !by.contains_key(&key) {
            order.push(key.clone());
        }
        by.entry(key).or_default().push(m);
    }
    order
        .iter()
        .map(|k| {
            let g = &by[k];
            let peaks: Vec<f64> = g
                .iter()
                .filter_map(|m| m.peak_bytes)
                .map(|b| b as f64)
                .collect();
            Group {
                first: g[0],
                repeats: g.len(),
                step_s: median(g.iter().map(|m| m.step_s).collect()),
                peak: (!peaks.is_empty()).then(|| median(peaks).round() as u64),
                holdout: g.iter().any(|m| m.holdout),
            }
        })
        .collect()
}

fn predict(g: &Group, profile: &GpuProfile) -> Result<(f64, u64), ProfileFitError> {
    let err = |e: String| ProfileFitError::Predict {
        line: g.first.line,
        message: e,
    };
    let r = g.first.resolve(profile).map_err(|e| err(e.to_string()))?;
    let e = estimate(&r).map_err(|e| err(e.to_string()))?;
    Ok((e.time.step_s, e.memory.per_gpu_max_bytes))
}

/// Fits `base`'s parameters to `ms`. Rows marked `holdout` are held out; when none are, every
/// fourth configuration is (if there are at least four).
pub fn fit_profile(
    base: &GpuProfile,
    ms: &[Measurement],
    origin: &str,
) -> Result<ProfileFit, ProfileFitError> {
    let groups = collapse(ms);
    let any_marked = groups.iter().any(|g| g.holdout);
    let held: Vec<bool> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if any_marked {
                g.holdout
            } else {
                groups.len() >= 4 && i % 4 == 3
            }
        })
        .collect();
    let train: Vec<usize> = (0..groups.len()).filter(|&i| !held[i]).collect();
    if train.is_empty() {
        return Err(ProfileFitError::NothingToFit);
    }

    // Start strictly inside the bounds: a value on its bound is a flat spot in logit space.
    let u0: Vec<f64> = PARAMS
        .iter()
        .map(|p| {
            let v = (p.get)(base);
            let v = if p.log_scale {
                v
            } else {
                v.clamp(p.lo + 0.02 * (p.hi - p.lo), p.hi - 0.02 * (p.hi - p.lo))
            };
            p.coordinate_of(v)
        })
        .collect();
    // The base profile with the parameters `idx` taken from `u` (a full-length coordinate
    // vector); every other field keeps its exact base value.
    let profile_at = |u: &[f64], idx: &[usize]| {
        let mut g = base.clone();
        for &j in idx {
            (PARAMS[j].set)(&mut g, PARAMS[j].value_of(u[j]));
        }
        g
    };
    let log_pred = |rows: &[usize], g: &GpuProfile| -> Result<Vec<f64>, ProfileFitError> {
        rows.iter()
            .map(|&i| predict(&groups[i], g).map(|(s, _)| s.ln()))
            .collect()
    };

    // Identifiability: how much a step of 0.05 in each transformed parameter moves any
    // fitting prediction (in log time).
    let base_logs = log_pred(&train, base)?;
    let mut identifiable = vec![false; PARAMS.len()];
    for j in 0..PARAMS.len() {
        // Move the value itself by 5% of its range toward the interior (a time by 20%): a
        // step in logit coordinates would not move a value sitting on its bound.
        let p = &PARAMS[j];
        let v = (p.get)(base);
        let moved_v = if p.log_scale {
            v * 1.2
        } else if v > 0.5 * (p.lo + p.hi) {
            v - 0.05 * (p.hi - p.lo)
        } else {
            v + 0.05 * (p.hi - p.lo)
        };
        let mut g = base.clone();
        (p.set)(&mut g, moved_v);
        let moved = log_pred(&train, &g)?;
        let sens = moved
            .iter()
            .zip(&base_logs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        identifiable[j] = sens > 1e-4;
    }
    let mut free: Vec<usize> = (0..PARAMS.len()).filter(|&j| identifiable[j]).collect();
    // More parameters than measurements cannot be fitted: keep the most sensitive ones.
    free.truncate(train.len().saturating_sub(1).max(1).min(free.len()));

    let measured: Vec<f64> = groups.iter().map(|g| g.step_s.ln()).collect();
    let sse = |rows: &[usize], g: &GpuProfile| -> f64 {
        match log_pred(rows, g) {
            Ok(p) => rows
                .iter()
                .zip(p)
                .map(|(&i, x)| (x - measured[i]).powi(2))
                .sum(),
            Err(_) => f64::INFINITY,
        }
    };
    let fit_on = |rows: &[usize], start: &[f64]| -> Vec<f64> {
        if free.is_empty() {
            return Vec::new();
        }
        let f = |x: &[f64]| {
            let mut u = u0.clone();
            for (k, &j) in free.iter().enumerate() {
                u[j] = x[k];
            }
            sse(rows, &profile_at(&u, &free))
        };
        let (mut x, mut fx, _) = nelder_mead(f, start, 0.3, 1e-12, 600);
        for _ in 0..6 {
            let (x2, f2, _) = nelder_mead(f, &x, 0.3, 1e-12, 600);
            let improved = f2 < fx - 1e-12;
            if f2 < fx {
                x = x2;
                fx = f2;
            }
            if !improved {
                break;
            }
        }
        x
    };
    let start: Vec<f64> = free.iter().map(|&j| u0[j]).collect();
    let mut x = fit_on(&train, &start);
    let u_at = |x: &[f64]| {
        let mut u = u0.clone();
        for (k, &j) in free.iter().enumerate() {
            u[j] = x[k];
        }
        u
    };

    // Outliers: beyond 3 scaled MADs of the log residuals, then refit once.
    let mut fitted = profile_at(&u_at(&x), &free);
    let resid: Vec<f64> = log_pred(&train, &fitted)?
        .iter()
        .zip(&train)
        .map(|(p, &i)| p - measured[i])
        .collect();
    let med = median(resid.clone());
    let mad = 1.4826 * median(resid.iter().map(|r| (r - med).abs()).collect());
    let mut outlier = vec![false; groups.len()];
    if mad > 0.0 && train.len() > free.len() + 2 {
        for (k, &i) in train.iter().enumerate() {
            outlier[i] = (resid[k] - med).abs() > 3.0 * mad;
        }
    }
    let kept: Vec<usize> = train.iter().copied().filter(|&i| !outlier[i]).collect();
    if kept.len() < train.len() {
        x = fit_on(&kept, &x);
        fitted = profile_at(&u_at(&x), &free);
    }

    // Profiles carry 4 decimals of a fitted fraction and 4 significant figures of a time.
    for &j in &free {
        let p = &PARAMS[j];
        let v = (p.get)(&fitted);
        let rounded = if !p.log_scale {
            (v * 1e4).round() / 1e4
        } else if v > 0.0 {
            let scale = 10f64.powi(3 - v.log10().floor() as i32);
            (v * scale).round() / scale
        } else {
            v
        };
        (p.set)(&mut fitted, rounded);
    }

    // Goodness of fit and Gauss-Newton confidence intervals on the kept fitting rows.
    let logs = log_pred(&kept, &fitted)?;
    let res: Vec<f64> = kept
        .iter()
        .zip(&logs)
        .map(|(&i, p)| p - measured[i])
        .collect();
    let ss_res: f64 = res.iter().map(|r| r * r).sum();
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
    let dof = kept.len().saturating_sub(free.len());
    let mut ci: Vec<Option<(f64, f64)>> = vec![None; PARAMS.len()];
    if dof > 0 && !free.is_empty() {
        let h = 1e-4;
        let mut jac = DMatrix::<f64>::zeros(kept.len(), free.len());
        for (k, &j) in free.iter().enumerate() {
            let mut u = u_at(&x);
            u[j] += h;
            let up = log_pred(&kept, &profile_at(&u, &free))?;
            u[j] -= 2.0 * h;
            let dn = log_pred(&kept, &profile_at(&u, &free))?;
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
            let t = StudentsT::new(0.0, 1.0, dof as f64)
                .map(|d| d.inverse_cdf(0.975))
                .unwrap_or(f64::NAN);
            for (c, &k) in live.iter().enumerate() {
                let j = free[k];
                let sd = (s2 * inv[(c, c)]).max(0.0).sqrt();
                let u = u_at(&x)[j];
                let (a, b) = (
                    PARAMS[j].value_of(u - t * sd),
                    PARAMS[j].value_of(u + t * sd),
                );
                if a.is_finite() && b.is_finite() {
                    ci[j] = Some((a.min(b), a.max(b)));
                }
            }
        }
    }

    // Runtime overhead from memory: the median gap between measured and predicted peaks.
    let mem_rows: Vec<usize> = kept
        .iter()
        .copied()
        .filter(|&i| groups[i].peak.is_some())
        .collect();
    let overhead_before = base.runtime_overhead_bytes;
    if !mem_rows.is_empty() {
        let gaps: Vec<f64> = mem_rows
            .iter()
            .map(|&i| {
                let (_, p) = predict(&groups[i], &fitted).unwrap_or((0.0, 0));
                groups[i].peak.unwrap_or(0) as f64 - (p as f64 - overhead_before as f64)
            })
            .collect();
        fitted.runtime_overhead_bytes = median(gaps).max(0.0).round() as u64;
    }

    let stamp = format!(
        "fitted by `parsim calibrate` from {origin} ({} measurements, {} configurations)",
        ms.len(),
        groups.len()
    );
    let mut params = Vec::new();
    for (j, p) in PARAMS.iter().enumerate() {
        let before = (p.get)(base);
        let after = (p.get)(&fitted);
        let is_free = free.contains(&j);
        let note = if is_free {
            match ci[j] {
                Some((a, b)) => format!(
                    "{stamp}; 95% CI [{a:.4}, {b:.4}]; R^2 {r2:.3}; residual spread {:.1}% rms",
                    100.0 * residual_rms
                ),
                None => format!(
                    "{stamp}; R^2 {r2:.3}; residual spread {:.1}% rms; no confidence interval (on its bound, too few degrees of freedom, or collinear)",
                    100.0 * residual_rms
                ),
            }
        } else if identifiable[j] {
            "identifiable, but there are more parameters than measurements: kept".to_string()
        } else {
            "not identifiable from these measurements (no prediction depends on it): kept at the base value".to_string()
        };
        if is_free {
            fitted.provenance.insert(p.name.to_string(), note.clone());
        }
        params.push(ParamReport {
            name: p.name.to_string(),
            before,
            after,
            ci95: ci[j],
            identifiable: identifiable[j],
            note,
        });
    }
    if !mem_rows.is_empty() {
        fitted.provenance.insert(
            "runtime_overhead_bytes".into(),
            format!("{stamp}; median gap between measured and predicted peak memory over {} configurations", mem_rows.len()),
        );
    }

    let mut rows = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let (bs, bp) = predict(g, base)?;
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
