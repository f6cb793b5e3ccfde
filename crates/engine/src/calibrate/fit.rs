//! Fitting a GPU family's efficiencies to published throughput: Nelder-Mead on the mean
//! squared log-error of predicted vs published TFLOP/s per GPU over the fitting rows, each
//! source weighted equally.

use super::fields::{self, median, ProfileField, Scale};
use super::published::{Case, Source};
use crate::config::{ConfigError, GpuProfile, Registry, Resolved};
use crate::estimate::{estimate, EstimateError};

/// GPUs that share one set of fitted efficiencies: the shipped profiles whose
/// `efficiency_family` names it (calibration/*.toml), the first of them the one its shipped
/// values are read from. A100 (40 and 80 GB: Narayanan et al. 2021 and llm-foundry) and H100
/// (Megatron-Core 2024 and llm-foundry) today; the profiles say which one each GPU reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Family(&'static str);

impl Family {
    /// Every family the shipped profiles declare, in registration order.
    pub fn all() -> Vec<Family> {
        Registry::shipped()
            .efficiency_families()
            .into_iter()
            .map(Family)
            .collect()
    }

    /// The family of the shipped profile `gpu`: `None` for one that declares none (the CPU's
    /// efficiencies are its own) and for a name that is not shipped.
    pub fn of(gpu: &str) -> Option<Family> {
        Registry::shipped()
            .get(gpu)
            .and_then(|p| p.efficiency_family.as_deref())
            .map(Family)
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    /// Shipped profiles that take this family's fitted values, in registration order.
    pub fn profiles(self) -> Vec<&'static str> {
        Registry::shipped().efficiency_family_members(self.0)
    }
}

/// The fitted parameters of one family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// `efficiency.matmul`.
    pub matmul: f64,
    /// `efficiency.attention`.
    pub attention: f64,
    /// `efficiency.memory_bound`.
    pub memory_bound: f64,
    /// `efficiency.overlap_interference`.
    pub overlap_interference: f64,
    /// `links.intra_node.efficiency`.
    pub intra_link: f64,
}

impl Params {
    /// The profile fields, in the order of [`Params::to_vec`].
    pub const PROFILE_FIELDS: [ProfileField; 5] = [
        fields::MATMUL,
        fields::ATTENTION,
        fields::MEMORY_BOUND,
        fields::OVERLAP_INTERFERENCE,
        fields::INTRA_LINK,
    ];

    /// Names in the profile, in the order of [`Params::to_vec`].
    pub const FIELDS: [&'static str; 5] = [
        Self::PROFILE_FIELDS[0].name,
        Self::PROFILE_FIELDS[1].name,
        Self::PROFILE_FIELDS[2].name,
        Self::PROFILE_FIELDS[3].name,
        Self::PROFILE_FIELDS[4].name,
    ];

    /// The values a profile carries.
    pub fn of(p: &GpuProfile) -> Params {
        Params::from_slice(&Self::PROFILE_FIELDS.map(|f| (f.get)(p)))
    }

    pub fn to_vec(self) -> [f64; 5] {
        [
            self.matmul,
            self.attention,
            self.memory_bound,
            self.overlap_interference,
            self.intra_link,
        ]
    }

    pub fn from_slice(x: &[f64]) -> Params {
        Params {
            matmul: x[0],
            attention: x[1],
            memory_bound: x[2],
            overlap_interference: x[3],
            intra_link: x[4],
        }
    }

    /// Writes the values into a profile.
    pub fn apply(self, p: &mut GpuProfile) {
        for (f, v) in Self::PROFILE_FIELDS.iter().zip(self.to_vec()) {
            (f.set)(p, v);
        }
    }
}

/// A family's fitted `efficiency.matmul` carried to another GPU of it (`to`, from the GPU the
/// family's rows ran on): scaled by the two GPUs' measured best-shape GEMM fractions
/// (`gemm.achievable_bf16_fraction`, calibration/data/gemm-rates.json) and rounded as profiles
/// are written; unchanged where either is unmeasured. So MI300X, whose hipBLASLt GEMMs reach
/// 51% of peak against H100's 80%, does not inherit H100's share.
pub fn transfer_matmul(matmul: f64, to: &GpuProfile, from: &GpuProfile) -> f64 {
    match (
        to.gemm.achievable_bf16_fraction,
        from.gemm.achievable_bf16_fraction,
    ) {
        (Some(to), Some(from)) => (matmul * to / from * 1000.0).round() / 1000.0,
        _ => matmul,
    }
}

/// Why a row could not be predicted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Estimate(#[from] EstimateError),
    #[error("no rows to fit for {0}")]
    NoRows(&'static str),
    /// A published row names a GPU whose profile declares no `efficiency_family`.
    #[error("{0}: its profile declares no efficiency_family, so no fitted values apply to it")]
    NoFamily(String),
}

/// parsim's prediction for one published row.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    pub step_s: f64,
    /// TFLOP/s per GPU counted in the source's convention.
    pub tflops: f64,
    /// Predicted / published - 1.
    pub error: f64,
    /// parsim's own model FLOPs of the step over the source's count (a check of the FLOPs).
    pub flops_ratio: f64,
    /// The estimate says the configuration fits in memory.
    pub fits: bool,
    /// Predicted peak memory of the most loaded GPU over its capacity.
    pub memory_fraction: f64,
    /// Exposed communication over the predicted step (the regime of its residual).
    pub comm_share: f64,
}

/// Predicts one row with `profile` (already carrying the efficiencies to use).
pub fn predict(case: &Case, profile: &GpuProfile) -> Result<Prediction, FitError> {
    let r = Resolved::with_gpu(case.config.clone(), profile.clone())?;
    let e = estimate(&r)?;
    let flops = case.convention_flops();
    let tflops = flops / e.time.step_s / r.world() as f64 / 1e12;
    let own = if case.config.training.recompute == crate::config::Recompute::Full
        && case.source == Source::Narayanan2021
    {
        e.flops.per_step_hardware
    } else {
        e.flops.per_step_model
    };
    Ok(Prediction {
        step_s: e.time.step_s,
        tflops,
        error: tflops / case.published_tflops - 1.0,
        flops_ratio: own / flops,
        fits: e.memory.fits,
        memory_fraction: e.memory.per_gpu_max_bytes as f64 / e.memory.capacity_bytes as f64,
        comm_share: e.time.exposed_comm_s / e.time.step_s,
    })
}

/// The train/test split: within each (source, GPU) group, rows alternate in data order,
/// the first, third, ... fit and the second, fourth, ... are held out. The tables are
/// ordered by model size then sequence or scale, so both halves span every size.
pub fn is_training(case: &Case, cases: &[Case]) -> bool {
    let position = cases
        .iter()
        .filter(|c| c.source == case.source && c.gpu == case.gpu && c.index < case.index)
        .count();
    position % 2 == 0
}

/// Loads a shipped profile and applies `params`.
pub fn profile_with(gpu: &str, params: Params) -> Result<GpuProfile, FitError> {
    let mut p = GpuProfile::load(gpu)?;
    params.apply(&mut p);
    Ok(p)
}

/// Predicts `case` on its shipped profile with `params` applied, the error as text for a row.
pub fn predict_with(case: &Case, params: Params) -> Result<Prediction, String> {
    profile_with(case.gpu, params)
        .and_then(|profile| predict(case, &profile))
        .map_err(|e| e.to_string())
}

/// Weighted mean squared log-error of `params` over `rows` (each source weighs the same).
/// Rows that fail to estimate count as a large error.
pub fn objective(rows: &[&Case], params: Params) -> f64 {
    let mut sum = 0.0;
    let mut weight = 0.0;
    let per_source = |s: Source| rows.iter().filter(|c| c.source == s).count().max(1) as f64;
    let mut profiles: Vec<(&str, GpuProfile)> = Vec::new();
    for c in rows {
        if !profiles.iter().any(|(n, _)| *n == c.gpu) {
            match profile_with(c.gpu, params) {
                Ok(p) => profiles.push((c.gpu, p)),
                Err(_) => return f64::INFINITY,
            }
        }
        let profile = &profiles
            .iter()
            .find(|(n, _)| *n == c.gpu)
            .expect("loaded")
            .1;
        let w = 1.0 / per_source(c.source);
        let e = match predict(c, profile) {
            Ok(p) => (1.0 + p.error).ln(),
            Err(_) => 1.0,
        };
        sum += w * e * e;
        weight += w;
    }
    if weight == 0.0 {
        f64::INFINITY
    } else {
        sum / weight
    }
}

/// Indices into [`Params::FIELDS`] that may be fitted: matmul, attention and memory_bound.
/// The overlap interference is measured ([`super::interference`]) and the link efficiency
/// keeps the profile's value.
pub const FITTED: [usize; 3] = [0, 1, 2];

/// The indices of [`FITTED`] that `rows` constrain: moving one of them away from `start`
/// changes the objective. The others keep `start`'s value: a direction no row depends on
/// (`attention` where every core runs a published kernel or as GEMMs) would wander to a
/// bound and mean nothing.
pub fn free_params(rows: &[&Case], start: Params) -> Vec<usize> {
    let base = objective(rows, start);
    FITTED
        .into_iter()
        .filter(|&i| {
            let mut x = start.to_vec();
            x[i] = if x[i] > 0.5 { x[i] - 0.3 } else { x[i] + 0.3 };
            let moved = objective(rows, Params::from_slice(&x));
            (moved - base).abs() > 1e-12 * (1.0 + base.abs())
        })
        .collect()
}

/// The change of variables of each value, in the order of [`Params::FIELDS`]: efficiencies
/// stay in (0.05, 1], the overlap interference in [0, 1].
const SCALES: [Scale; 5] = [
    Scale::Logit { lo: 0.05, hi: 1.0 },
    Scale::Logit { lo: 0.05, hi: 1.0 },
    Scale::Logit { lo: 0.05, hi: 1.0 },
    Scale::Logit { lo: 0.0, hi: 1.0 },
    Scale::Logit { lo: 0.05, hi: 1.0 },
];

fn to_unbounded(p: Params) -> Vec<f64> {
    p.to_vec()
        .iter()
        .zip(SCALES)
        .map(|(&v, scale)| scale.to_unbounded(v))
        .collect()
}

fn from_unbounded(x: &[f64]) -> Params {
    let v: Vec<f64> = x
        .iter()
        .zip(SCALES)
        .map(|(&z, scale)| scale.from_unbounded(z))
        .collect();
    Params::from_slice(&v)
}

/// The result of fitting one family.
#[derive(Debug, Clone)]
pub struct FitResult {
    pub family: Family,
    pub params: Params,
    pub objective: f64,
    pub evaluations: usize,
    pub rows: usize,
}

/// Fits `family`'s efficiencies on `rows` from `start` by Nelder-Mead (Nelder and Mead 1965)
/// in logit space, so every efficiency stays inside (0.05, 1).
pub fn fit(family: Family, rows: &[&Case], start: Params) -> Result<FitResult, FitError> {
    if rows.is_empty() {
        return Err(FitError::NoRows(family.name()));
    }
    // The fitted coordinates; the rest keep `start`.
    let free = free_params(rows, start);
    // Nelder-Mead from `start`, each simplex restarted from its optimum until it stops
    // improving.
    let x0 = to_unbounded(start);
    let full = |x: &[f64]| -> Params { from_unbounded(&with_free(&x0, &free, x)) };
    let f = |x: &[f64]| objective(rows, full(x));
    let init: Vec<f64> = free.iter().map(|&i| x0[i]).collect();
    let (x, fx, evaluations) = nelder_mead_restarted(f, &init, 1e-9, 400, 8);
    Ok(FitResult {
        family,
        params: round_params(from_unbounded(&with_free(&x0, &free, &x))),
        objective: fx,
        evaluations,
        rows: rows.len(),
    })
}

/// `base` with the coordinates `free` replaced by `x`, in order.
fn with_free(base: &[f64], free: &[usize], x: &[f64]) -> Vec<f64> {
    let mut z = base.to_vec();
    for (&i, &v) in free.iter().zip(x) {
        z[i] = v;
    }
    z
}

/// Profile values are written with three decimals.
pub fn round_params(p: Params) -> Params {
    let r = |v: f64| (v * 1000.0).round() / 1000.0;
    Params {
        matmul: r(p.matmul),
        attention: r(p.attention),
        memory_bound: r(p.memory_bound),
        overlap_interference: r(p.overlap_interference),
        intra_link: r(p.intra_link),
    }
}

/// Minimises `f` from `x0` with the Nelder-Mead simplex (standard coefficients: reflection 1,
/// expansion 2, contraction 0.5, shrink 0.5). Stops when the simplex's values differ by less
/// than `ftol` or after `max_evals` evaluations. Returns (argmin, min, evaluations).
pub fn nelder_mead(
    f: impl Fn(&[f64]) -> f64,
    x0: &[f64],
    step: f64,
    ftol: f64,
    max_evals: usize,
) -> (Vec<f64>, f64, usize) {
    let n = x0.len();
    let evals = std::cell::Cell::new(0usize);
    let eval = |x: &[f64]| {
        evals.set(evals.get() + 1);
        f(x)
    };
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    simplex.push((x0.to_vec(), eval(x0)));
    for i in 0..n {
        let mut x = x0.to_vec();
        x[i] += step;
        let fx = eval(&x);
        simplex.push((x, fx));
    }
    loop {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[n].1);
        if (worst - best).abs() <= ftol * (1.0 + best.abs()) || evals.get() >= max_evals {
            break;
        }
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|(x, _)| x[j]).sum::<f64>() / n as f64)
            .collect();
        let along = |t: f64| -> Vec<f64> {
            centroid
                .iter()
                .zip(&simplex[n].0)
                .map(|(c, w)| c + t * (c - w))
                .collect()
        };
        let xr = along(1.0);
        let fr = eval(&xr);
        if fr < simplex[0].1 {
            let xe = along(2.0);
            let fe = eval(&xe);
            simplex[n] = if fe < fr { (xe, fe) } else { (xr, fr) };
        } else if fr < simplex[n - 1].1 {
            simplex[n] = (xr, fr);
        } else {
            let (xc, fc) = if fr < simplex[n].1 {
                let x = along(0.5);
                let fx = eval(&x);
                (x, fx)
            } else {
                let x = along(-0.5);
                let fx = eval(&x);
                (x, fx)
            };
            if fc < fr.min(simplex[n].1) {
                simplex[n] = (xc, fc);
            } else {
                let x_best = simplex[0].0.clone();
                for (x, fx) in simplex.iter_mut().skip(1) {
                    for (xi, bi) in x.iter_mut().zip(&x_best) {
                        *xi = bi + 0.5 * (*xi - bi);
                    }
                    *fx = eval(x);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (x, fx) = simplex.swap_remove(0);
    (x, fx, evals.get())
}

/// [`nelder_mead`] (initial step 0.3) from `x0`, then restarted from its optimum up to
/// `restarts` times until a restart improves the minimum by less than `ftol`: a fresh simplex
/// escapes the collapsed one a first run can stop in. Returns (argmin, min, evaluations).
pub fn nelder_mead_restarted(
    f: impl Fn(&[f64]) -> f64,
    x0: &[f64],
    ftol: f64,
    max_evals: usize,
    restarts: usize,
) -> (Vec<f64>, f64, usize) {
    let (mut x, mut fx, mut evaluations) = nelder_mead(&f, x0, 0.3, ftol, max_evals);
    for _ in 0..restarts {
        let (x2, f2, e2) = nelder_mead(&f, &x, 0.3, ftol, max_evals);
        evaluations += e2;
        let improved = f2 < fx - ftol;
        if f2 < fx {
            x = x2;
            fx = f2;
        }
        if !improved {
            break;
        }
    }
    (x, fx, evaluations)
}

/// Median and largest absolute error of a set of relative errors.
pub fn summary(errors: &[f64]) -> (f64, f64) {
    if errors.is_empty() {
        return (0.0, 0.0);
    }
    let abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    let worst = abs.iter().copied().fold(0.0, f64::max);
    (median(abs), worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nelder_mead_finds_a_quadratic_minimum() {
        let f = |x: &[f64]| (x[0] - 1.0).powi(2) + 3.0 * (x[1] + 2.0).powi(2);
        let (x, fx, _) = nelder_mead(f, &[0.0, 0.0], 0.5, 1e-14, 2000);
        assert!(
            (x[0] - 1.0).abs() < 1e-4 && (x[1] + 2.0).abs() < 1e-4,
            "{x:?}"
        );
        assert!(fx < 1e-8);
    }

    #[test]
    fn logit_round_trip() {
        let p = Params {
            matmul: 0.7,
            attention: 0.4,
            memory_bound: 0.9,
            overlap_interference: 0.25,
            intra_link: 0.6,
        };
        let q = from_unbounded(&to_unbounded(p));
        for (a, b) in p.to_vec().iter().zip(q.to_vec()) {
            assert!((a - b).abs() < 1e-9);
        }
    }

    #[test]
    fn summary_median_and_worst() {
        assert_eq!(summary(&[0.1, -0.3, 0.2]), (0.2, 0.3));
        assert_eq!(summary(&[0.1, -0.4, 0.2, 0.3]), (0.25, 0.4));
    }
}
