//! Attention kernel rates from published benchmarks (calibration/data/attention-kernels.json:
//! the FlashAttention-3 paper's Figures 5 and 6, Shah et al. 2024, on H100; the
//! FlashAttention-2 paper's Figure 4, Dao 2023, on A100), so that the attention core's time
//! follows sequence length, head dimension and the causal mask instead of one fitted scalar.
//!
//! A kernel's name carries the software release its rates were measured with where one is
//! known ("cudnn-9.4" is cuDNN 9.4.0; "cudnn" is the cuDNN 9.1.1 of the FlashAttention-3
//! paper), and the table's `releases` map what a user runs (a cuDNN version, an NGC PyTorch
//! container, a Transformer Engine release) to that kernel ([`kernel_for_release`]), so a
//! 2024 stack is not timed at a later kernel's rates.
//!
//! A kernel published on one GPU only can be derived for another (the table's `derived`
//! entries: FlashAttention's Triton kernel on H100 from its A100 rates times
//! FlashAttention-2's published H100 / A100 speed-up), the assumption stated with it.
//!
//! Each published series (one GPU, kernel, pass and mask, over sequence lengths) is fitted
//! by `rate(s) = max * s / (s + half_s)`: a kernel whose per-tile work is fixed and whose
//! fixed costs (launch, prologue, the last partial wave of query tiles) are spread over
//! `s`. The fit is linear in `1/s` for `1/rate`, so it is solved in closed form.

use serde::Deserialize;
use std::sync::OnceLock;

/// The shipped table.
const TABLE_JSON: &str = include_str!("../../../calibration/data/attention-kernels.json");

/// FLOPs the FlashAttention papers count for a backward pass, per forward FLOP (defined
/// beside the op keys, whose attention work counts it).
pub use parsim_plan::op_timing::PAPER_BACKWARD_FLOPS_PER_FORWARD;

/// `training.attention_kernel` for a kernel without published rates (a custom one): the
/// core is timed at the profile's `efficiency.attention`.
pub const NO_PUBLISHED_KERNEL: &str = "none";

/// Which pass a series measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    Backward,
    /// Forward and backward together, FLOPs 3.5 times the forward's (the FlashAttention-2
    /// paper's Figure 4 and repository benchmark).
    ForwardBackward,
}

/// One published series: TFLOP/s against sequence length.
#[derive(Debug, Clone, Deserialize)]
pub struct Series {
    pub gpu: String,
    pub kernel: String,
    pub pass: Pass,
    pub causal: bool,
    pub head_dim: u64,
    pub seq_len: Vec<u64>,
    pub tflops: Vec<f64>,
    /// Key of the table's `sources` entry the series was read from (the FlashAttention-3
    /// paper when absent).
    #[serde(default)]
    pub source: Option<String>,
    /// The GPU the series was measured on where it differs from the table it is held in
    /// (cuDNN's H200 results held in the GH100 table `h100-sxm`, which the H100 and H200
    /// profiles share).
    #[serde(default)]
    pub measured_on: Option<String>,
    /// A causal sliding window: each query attends to the last `window` keys, itself
    /// included, and the series' FLOPs count only those pairs (cudnn-frontend's
    /// benchmark_single_sdpa.py `flops()`). `None`: full attention.
    #[serde(default)]
    pub window: Option<u64>,
}

/// A software release a user can name, the cuDNN version it runs and the published kernel
/// whose rates time it (the table's `releases`).
#[derive(Debug, Clone, Deserialize)]
pub struct Release {
    /// The name a user gives: "cudnn-9.4.0", "ngc-pytorch-25.04", "transformer-engine-2.0".
    pub release: String,
    /// The cuDNN version it runs ("9.4.0"), or the minimum it requires (">= 9.3").
    pub cudnn: String,
    /// The kernel (as `training.attention_kernel` names it) whose published rates are that
    /// cuDNN's; `None` where none are published.
    pub kernel: Option<String>,
    /// Where the version (and the rates) were read.
    pub source: String,
    /// Why no kernel times it, where none does.
    #[serde(default)]
    pub why: Option<String>,
}

/// A kernel with no published rates on one GPU, derived from its published rates on another
/// GPU times a reference kernel's published speed-up between the two GPUs (the table's
/// `derived` entries; the assumption is stated in each).
#[derive(Debug, Clone, Deserialize)]
pub struct Derived {
    pub gpu: String,
    pub kernel: String,
    /// The GPU whose published series of `kernel` are scaled.
    pub from_gpu: String,
    /// The kernel published on both GPUs whose rate ratio scales them.
    pub scaled_by: String,
    pub assumption: String,
}

#[derive(Debug, Deserialize)]
struct Table {
    series: Vec<Series>,
    #[serde(default)]
    derived: Vec<Derived>,
    #[serde(default)]
    releases: Vec<Release>,
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        // The table is part of the binary; tests/calibration/kernel_rates.rs checks that it parses.
        serde_json::from_str::<Table>(TABLE_JSON).unwrap_or(Table {
            series: Vec::new(),
            derived: Vec::new(),
            releases: Vec::new(),
        })
    })
}

/// `rate(s) = max_flops_per_s * s / (s + half_seq)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateCurve {
    /// The rate a very long sequence approaches, FLOP/s.
    pub max_flops_per_s: f64,
    /// The sequence length at which the kernel runs at half that rate.
    pub half_seq: f64,
}

impl RateCurve {
    /// Least-squares fit of `1/rate = 1/max + (half/max) / s` to published points (TFLOP/s).
    /// A series whose rate falls with length (cuDNN 9.1 and 9.4 beyond 8k: their last tiles
    /// cost more than the launch they amortise) is fitted flat, at its harmonic mean: the
    /// curve cannot fall, and a flat one keeps the published points within a few percent.
    /// `None` with fewer than two distinct lengths or non-positive rates.
    pub fn fit(seq_len: &[u64], tflops: &[f64]) -> Option<RateCurve> {
        if seq_len.len() != tflops.len() || seq_len.len() < 2 {
            return None;
        }
        let n = seq_len.len() as f64;
        let xs: Vec<f64> = seq_len.iter().map(|&s| 1.0 / s as f64).collect();
        let ys: Vec<f64> = tflops.iter().map(|&t| 1.0 / (t * 1e12)).collect();
        let mx = xs.iter().sum::<f64>() / n;
        let my = ys.iter().sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let slope = (sxy / sxx).max(0.0);
        let intercept = my - slope * mx;
        if !(intercept > 0.0 && intercept.is_finite()) {
            return None;
        }
        Some(RateCurve {
            max_flops_per_s: 1.0 / intercept,
            half_seq: slope / intercept,
        })
    }

    /// FLOP/s at sequence length `seq_len` (at least 1).
    pub fn flops_per_s(&self, seq_len: u64) -> f64 {
        let s = seq_len.max(1) as f64;
        self.max_flops_per_s * s / (s + self.half_seq)
    }
}

/// The rate curves of one kernel at one head dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Curves {
    /// Forward and backward published separately (FlashAttention-3 Figures 5 and 6).
    Split {
        forward: RateCurve,
        forward_causal: RateCurve,
        backward: RateCurve,
        backward_causal: Option<RateCurve>,
    },
    /// Only forward + backward published (FlashAttention-2 Figure 4): both passes run at the
    /// combined rate, the one split that gives the published total without further data.
    Combined {
        forward_backward: RateCurve,
        forward_backward_causal: RateCurve,
    },
}

/// The causal forward and backward curves of one kernel under one sliding window, at one
/// head dimension (FLOPs counted over the window's pairs).
#[derive(Debug, Clone, Copy, PartialEq)]
struct WindowCurves {
    head_dim: u64,
    window: u64,
    forward: RateCurve,
    backward: RateCurve,
}

/// A fused attention kernel on one GPU: forward and backward rates, with and without mask,
/// at each published head dimension, and causal rates under the published sliding windows.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionKernel {
    /// "gpu/kernel", as a profile's `attention_kernel` names it.
    pub name: String,
    /// (head dimension, curves), sorted by head dimension.
    variants: Vec<(u64, Curves)>,
    /// Sliding-window curves, sorted by head dimension and window.
    windows: Vec<WindowCurves>,
}

impl AttentionKernel {
    /// The published head dimensions.
    pub fn head_dims(&self) -> Vec<u64> {
        self.variants.iter().map(|v| v.0).collect()
    }

    /// The published head dimension nearest `head_dim` (the larger on a tie: a larger head
    /// does more work per loaded tile, as wide heads of other sizes do).
    pub fn nearest_head_dim(&self, head_dim: u64) -> u64 {
        self.variants
            .iter()
            .map(|v| v.0)
            .min_by_key(|d| (d.abs_diff(head_dim), u64::MAX - d))
            .expect("a kernel has at least one head dimension")
    }

    /// The curves of the published head dimension nearest `head_dim`.
    fn curves(&self, head_dim: u64) -> Curves {
        let d = self.nearest_head_dim(head_dim);
        self.variants
            .iter()
            .find(|v| v.0 == d)
            .map(|v| v.1)
            .expect("a published head dimension")
    }

    /// Forward FLOP/s (FLOPs as the papers count them: halved under a causal mask).
    pub fn forward_flops_per_s(&self, seq_len: u64, causal: bool, head_dim: u64) -> f64 {
        match self.curves(head_dim) {
            Curves::Split {
                forward,
                forward_causal,
                ..
            } => if causal { forward_causal } else { forward }.flops_per_s(seq_len),
            Curves::Combined {
                forward_backward,
                forward_backward_causal,
            } => if causal {
                forward_backward_causal
            } else {
                forward_backward
            }
            .flops_per_s(seq_len),
        }
    }

    /// Backward FLOP/s in the papers' convention (2.5 forward FLOPs per forward FLOP). Where
    /// no causal backward series is published, the causal mask costs the backward what it
    /// costs the forward: the non-causal rate times the forward's causal/non-causal ratio.
    pub fn backward_flops_per_s(&self, seq_len: u64, causal: bool, head_dim: u64) -> f64 {
        match self.curves(head_dim) {
            Curves::Split {
                forward,
                forward_causal,
                backward,
                backward_causal,
            } => match (causal, backward_causal) {
                (false, _) => backward.flops_per_s(seq_len),
                (true, Some(c)) => c.flops_per_s(seq_len),
                (true, None) => {
                    backward.flops_per_s(seq_len) * forward_causal.flops_per_s(seq_len)
                        / forward.flops_per_s(seq_len)
                }
            },
            Curves::Combined { .. } => self.forward_flops_per_s(seq_len, causal, head_dim),
        }
    }

    /// The published sliding windows, as (head dimension, window).
    pub fn windows(&self) -> Vec<(u64, u64)> {
        self.windows
            .iter()
            .map(|w| (w.head_dim, w.window))
            .collect()
    }

    /// The window curves that time a causal call of `head_dim` under `window` keys: the
    /// published head dimension nearest `head_dim` among the windowed series (as
    /// [`Self::nearest_head_dim`] picks), then the published window nearest `window` by
    /// ratio (a window's cost follows the key tiles each query tile visits, about w / 128 + 1
    /// of them). `None` when the kernel publishes no windowed series.
    fn window_curves(&self, head_dim: u64, window: u64) -> Option<&WindowCurves> {
        let d = self
            .windows
            .iter()
            .map(|w| w.head_dim)
            .min_by_key(|d| (d.abs_diff(head_dim), u64::MAX - d))?;
        let ratio = |w: &WindowCurves| (w.window.max(1) as f64 / window.max(1) as f64).ln().abs();
        self.windows
            .iter()
            .filter(|w| w.head_dim == d)
            .min_by(|a, b| ratio(a).total_cmp(&ratio(b)))
    }

    /// FLOP/s of one causal pass under a sliding window of `window` keys (FLOPs counted over
    /// the window's pairs; a backward in the papers' 2.5-forward convention), from the
    /// published window series nearest it ([`Self::window_curves`]); `None` where the kernel
    /// publishes none (the caller then times the call as full causal attention).
    pub fn window_flops_per_s(
        &self,
        seq_len: u64,
        head_dim: u64,
        window: u64,
        backward: bool,
    ) -> Option<f64> {
        let w = self.window_curves(head_dim, window)?;
        let curve = if backward { w.backward } else { w.forward };
        Some(curve.flops_per_s(seq_len))
    }

    /// The published window of exactly `head_dim` that stands in for a full causal call of
    /// `seq_len` where no full-attention series of that head dimension is published (cuDNN on
    /// Blackwell and Hopper publishes head dim 64 only under windows): a causal query tile
    /// visits s / 2 key tiles' worth on average, a window's w, so the window nearest s / 2
    /// stands in if it is within a factor of two of it (a window of 1024 for s = 4096); else
    /// `None`, and the call runs at the nearest published head dimension's full curves.
    pub fn full_causal_stand_in(&self, head_dim: u64, seq_len: u64) -> Option<u64> {
        if self.variants.iter().any(|v| v.0 == head_dim) {
            return None;
        }
        let half = (seq_len.max(2) / 2) as f64;
        let ratio = |w: u64| (w.max(1) as f64 / half).ln().abs();
        self.windows
            .iter()
            .filter(|w| w.head_dim == head_dim)
            .map(|w| w.window)
            .min_by(|a, b| ratio(*a).total_cmp(&ratio(*b)))
            .filter(|&w| ratio(w) <= std::f64::consts::LN_2 + 1e-9)
    }

    /// FLOP/s of one pass (`backward`: the papers' 2.5-forward convention) at sequence length
    /// `seq_len`, mask `causal` and head dimension `head_dim`, under a causal sliding window
    /// of `window` keys where one is set: the published window series nearest it
    /// ([`Self::window_flops_per_s`]); a full causal call whose head dimension is published
    /// only under windows runs at the window standing in for it
    /// ([`Self::full_causal_stand_in`]); else the full-attention curves of the nearest
    /// published head dimension.
    pub fn pass_flops_per_s(
        &self,
        seq_len: u64,
        causal: bool,
        head_dim: u64,
        window: Option<u64>,
        backward: bool,
    ) -> f64 {
        let windowed = match window {
            Some(w) if causal => Some(w),
            _ if causal => self.full_causal_stand_in(head_dim, seq_len),
            _ => None,
        };
        if let Some(rate) =
            windowed.and_then(|w| self.window_flops_per_s(seq_len, head_dim, w, backward))
        {
            return rate;
        }
        if backward {
            self.backward_flops_per_s(seq_len, causal, head_dim)
        } else {
            self.forward_flops_per_s(seq_len, causal, head_dim)
        }
    }

    /// Forward + backward FLOP/s in the papers' convention (3.5 forward FLOPs per forward
    /// FLOP): total FLOPs over the two passes' summed time.
    pub fn forward_backward_flops_per_s(&self, seq_len: u64, causal: bool, head_dim: u64) -> f64 {
        let f = self.forward_flops_per_s(seq_len, causal, head_dim);
        let b = self.backward_flops_per_s(seq_len, causal, head_dim);
        (1.0 + PAPER_BACKWARD_FLOPS_PER_FORWARD) / (1.0 / f + PAPER_BACKWARD_FLOPS_PER_FORWARD / b)
    }
}

/// Every published series in the shipped table.
pub fn published_series() -> &'static [Series] {
    &table().series
}

/// The table's derivation rules.
pub fn derivations() -> &'static [Derived] {
    &table().derived
}

/// The series of every derived kernel ([`Derived`]), computed from the published ones:
/// each published point of the kernel on `from_gpu` times the reference kernel's rate on
/// `gpu` over its rate on `from_gpu`, for the same pass, mask and sequence length, both read
/// at the head dimension the reference publishes on `gpu` nearest the point's.
pub fn derived_series() -> &'static [Series] {
    static SERIES: OnceLock<Vec<Series>> = OnceLock::new();
    SERIES.get_or_init(|| {
        let published = build_kernels(published_series());
        derivations()
            .iter()
            .flat_map(|d| derive(d, &published))
            .collect()
    })
}

fn derive(d: &Derived, kernels: &[AttentionKernel]) -> Vec<Series> {
    let find = |gpu: &str| {
        let name = format!("{gpu}/{}", d.scaled_by);
        kernels.iter().find(|k| k.name == name)
    };
    let (Some(to), Some(from)) = (find(&d.gpu), find(&d.from_gpu)) else {
        return Vec::new();
    };
    published_series()
        .iter()
        .filter(|s| s.gpu == d.from_gpu && s.kernel == d.kernel && s.window.is_none())
        .map(|s| {
            let hd = to.nearest_head_dim(s.head_dim);
            let rate = |k: &AttentionKernel, len: u64| match s.pass {
                Pass::Forward => k.forward_flops_per_s(len, s.causal, hd),
                Pass::Backward => k.backward_flops_per_s(len, s.causal, hd),
                Pass::ForwardBackward => k.forward_backward_flops_per_s(len, s.causal, hd),
            };
            let tflops = s
                .seq_len
                .iter()
                .zip(&s.tflops)
                .map(|(&len, &t)| t * rate(to, len) / rate(from, len))
                .collect();
            Series {
                gpu: d.gpu.clone(),
                kernel: d.kernel.clone(),
                tflops,
                source: Some("derived".into()),
                ..s.clone()
            }
        })
        .collect()
}

/// The kernels the table defines (those with forward, causal forward and backward series, or
/// both forward + backward series), published and derived.
pub fn attention_kernels() -> &'static [AttentionKernel] {
    static KERNELS: OnceLock<Vec<AttentionKernel>> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let mut all = build_kernels(published_series());
        all.extend(build_kernels(derived_series()));
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    })
}

/// The software releases the table documents (a cuDNN version, an NGC PyTorch container, a
/// Transformer Engine release), each with its cuDNN version and the kernel that times it.
pub fn releases() -> &'static [Release] {
    &table().releases
}

/// The release named `name` (case and surrounding space ignored: "NGC-PyTorch-25.04").
pub fn release(name: &str) -> Option<&'static Release> {
    let name = name.trim();
    releases()
        .iter()
        .find(|r| r.release.eq_ignore_ascii_case(name))
}

/// The kernel (as `training.attention_kernel` names it, e.g. "cudnn-9.4") whose published
/// rates are those of the release named `name`; `None` for an unknown release or one whose
/// cuDNN has no published rates (its `why` says so).
pub fn kernel_for_release(name: &str) -> Option<&'static str> {
    release(name)?.kernel.as_deref()
}

/// The kernel named `name` ("gpu/kernel", e.g. "h100-sxm/flash-attention-3").
pub fn attention_kernel(name: &str) -> Option<&'static AttentionKernel> {
    attention_kernels().iter().find(|k| k.name == name)
}

fn build_kernels(series: &[Series]) -> Vec<AttentionKernel> {
    let mut names: Vec<String> = series
        .iter()
        .map(|s| format!("{}/{}", s.gpu, s.kernel))
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let (windowed, mine): (Vec<&Series>, Vec<&Series>) = series
                .iter()
                .filter(|s| format!("{}/{}", s.gpu, s.kernel) == name)
                .partition(|s| s.window.is_some());
            let mut dims: Vec<u64> = mine.iter().map(|s| s.head_dim).collect();
            dims.sort_unstable();
            dims.dedup();
            let variants: Vec<(u64, Curves)> = dims
                .into_iter()
                .filter_map(|d| Some((d, curves_of(&mine, d)?)))
                .collect();
            let windows = window_curves_of(&windowed);
            (!variants.is_empty()).then_some(AttentionKernel {
                name,
                variants,
                windows,
            })
        })
        .collect()
}

/// The window curves of one kernel's windowed series: one per (head dimension, window) whose
/// causal forward and backward are both published.
fn window_curves_of(series: &[&Series]) -> Vec<WindowCurves> {
    let mut keys: Vec<(u64, u64)> = series
        .iter()
        .filter_map(|s| Some((s.head_dim, s.window?)))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .filter_map(|(head_dim, window)| {
            let curve = |pass: Pass| {
                series
                    .iter()
                    .find(|s| {
                        s.head_dim == head_dim
                            && s.window == Some(window)
                            && s.pass == pass
                            && s.causal
                    })
                    .and_then(|s| RateCurve::fit(&s.seq_len, &s.tflops))
            };
            Some(WindowCurves {
                head_dim,
                window,
                forward: curve(Pass::Forward)?,
                backward: curve(Pass::Backward)?,
            })
        })
        .collect()
}

/// The curves of one kernel's series at head dimension `head_dim`: split when forward,
/// causal forward and backward are published, combined when both forward + backward series
/// are; `None` otherwise.
fn curves_of(series: &[&Series], head_dim: u64) -> Option<Curves> {
    let curve = |pass: Pass, causal: bool| {
        series
            .iter()
            .find(|s| s.head_dim == head_dim && s.pass == pass && s.causal == causal)
            .and_then(|s| RateCurve::fit(&s.seq_len, &s.tflops))
    };
    let split = || {
        Some(Curves::Split {
            forward: curve(Pass::Forward, false)?,
            forward_causal: curve(Pass::Forward, true)?,
            backward: curve(Pass::Backward, false)?,
            backward_causal: curve(Pass::Backward, true),
        })
    };
    let combined = || {
        Some(Curves::Combined {
            forward_backward: curve(Pass::ForwardBackward, false)?,
            forward_backward_causal: curve(Pass::ForwardBackward, true)?,
        })
    };
    split().or_else(combined)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points on an exact curve are fitted back exactly (closed form vs the generator).
    #[test]
    fn fit_recovers_an_exact_curve() {
        let truth = RateCurve {
            max_flops_per_s: 600e12,
            half_seq: 300.0,
        };
        let seq = [512u64, 1024, 4096, 16384];
        let tflops: Vec<f64> = seq.iter().map(|&s| truth.flops_per_s(s) / 1e12).collect();
        let fit = RateCurve::fit(&seq, &tflops).expect("fit");
        assert!((fit.max_flops_per_s / truth.max_flops_per_s - 1.0).abs() < 1e-9);
        assert!((fit.half_seq / truth.half_seq - 1.0).abs() < 1e-9);
    }

    #[test]
    fn fit_rejects_degenerate_input() {
        assert_eq!(RateCurve::fit(&[1024], &[500.0]), None);
        assert_eq!(RateCurve::fit(&[1024, 1024], &[500.0, 510.0]), None);
        assert_eq!(RateCurve::fit(&[512, 1024], &[500.0]), None);
        assert_eq!(RateCurve::fit(&[512, 1024], &[-500.0, -400.0]), None);
    }

    /// A falling series is fitted flat at its harmonic mean (the time-weighted rate).
    #[test]
    fn a_falling_series_is_fitted_flat() {
        let fit = RateCurve::fit(&[4096, 65536], &[600.0, 400.0]).expect("fit");
        assert_eq!(fit.half_seq, 0.0);
        assert!((fit.max_flops_per_s / 480e12 - 1.0).abs() < 1e-12);
    }

    /// Releases resolve to the kernel of their cuDNN, names case-insensitively; a release
    /// without published rates, or an unknown one, has none; every kernel a release names
    /// is published on the GH100 or a Blackwell table, and every release without one says why.
    #[test]
    fn attention_rates_kernel_for_release() {
        assert_eq!(kernel_for_release("cudnn-9.4.0"), Some("cudnn-9.4"));
        assert_eq!(kernel_for_release(" CUDNN-9.19.1 "), Some("cudnn-9.19"));
        assert_eq!(kernel_for_release("cudnn-9.1.1"), Some("cudnn"));
        assert_eq!(kernel_for_release("ngc-pytorch-25.04"), None);
        assert_eq!(release("ngc-pytorch-25.04").unwrap().cudnn, "9.9.0");
        assert_eq!(kernel_for_release("cudnn-7.0"), None);
        for r in releases() {
            match &r.kernel {
                Some(k) => assert!(
                    ["h100-sxm", "gb200", "gb300"]
                        .iter()
                        .any(|table| attention_kernel(&format!("{table}/{k}")).is_some()),
                    "{}: {k}",
                    r.release
                ),
                None => assert!(r.why.is_some(), "{} says why it has no kernel", r.release),
            }
        }
    }
}
