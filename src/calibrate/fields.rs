//! The hardware-profile fields that calibration fits, described once: each field's name in
//! the profile file and how to read and write it ([`ProfileField`]), and the one change of
//! variables both fitters optimise in ([`Scale`]): a bounded fraction through a logit, a time
//! through a logarithm, so that an unconstrained optimiser (Nelder-Mead) never leaves the
//! field's range. [`super::fit`] (published throughput) and [`super::profile_fit`] (your own
//! measurements) pick their fields and bounds from here.

use crate::config::GpuProfile;
use statrs::statistics::{Data, OrderStatistics};

/// One profile field: its dotted name in the profile file and its accessors.
#[derive(Clone, Copy)]
pub struct ProfileField {
    pub name: &'static str,
    pub get: fn(&GpuProfile) -> f64,
    pub set: fn(&mut GpuProfile, f64),
}

impl std::fmt::Debug for ProfileField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// `efficiency.matmul`: achieved share of peak on GEMMs.
pub const MATMUL: ProfileField = ProfileField {
    name: "efficiency.matmul",
    get: |g| g.efficiency.matmul,
    set: |g, v| g.efficiency.matmul = v,
};

/// `efficiency.attention`: achieved share of peak in the attention core.
pub const ATTENTION: ProfileField = ProfileField {
    name: "efficiency.attention",
    get: |g| g.efficiency.attention,
    set: |g, v| g.efficiency.attention = v,
};

/// `efficiency.memory_bound`: achieved share of memory bandwidth on elementwise ops.
pub const MEMORY_BOUND: ProfileField = ProfileField {
    name: "efficiency.memory_bound",
    get: |g| g.efficiency.memory_bound,
    set: |g, v| g.efficiency.memory_bound = v,
};

/// `efficiency.kernel_overhead_s`: fixed launch cost per kernel, in seconds.
pub const KERNEL_OVERHEAD_S: ProfileField = ProfileField {
    name: "efficiency.kernel_overhead_s",
    get: |g| g.efficiency.kernel_overhead_s,
    set: |g, v| g.efficiency.kernel_overhead_s = v,
};

/// `efficiency.overlap_interference`: how much overlapped communication slows compute.
pub const OVERLAP_INTERFERENCE: ProfileField = ProfileField {
    name: "efficiency.overlap_interference",
    get: |g| g.efficiency.overlap_interference,
    set: |g, v| g.efficiency.overlap_interference = v,
};

/// `links.intra_node.efficiency`: achieved share of NVLink bandwidth.
pub const INTRA_LINK: ProfileField = ProfileField {
    name: "links.intra_node.efficiency",
    get: |g| g.links.intra_node.efficiency,
    set: |g, v| g.links.intra_node.efficiency = v,
};

/// `links.inter_node.efficiency`: achieved share of the network's bandwidth.
pub const INTER_LINK: ProfileField = ProfileField {
    name: "links.inter_node.efficiency",
    get: |g| g.links.inter_node.efficiency,
    set: |g, v| g.links.inter_node.efficiency = v,
};

/// How a field's value maps to the unbounded coordinate an optimiser moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// A value in `(lo, hi)`, through the logit of its position in the range.
    Logit { lo: f64, hi: f64 },
    /// A positive value (a time), through its natural logarithm.
    Log,
}

/// How close to a bound (as a share of the range) a logit coordinate may start: a value on
/// its bound would be an infinite coordinate, a flat spot for the optimiser.
const LOGIT_EDGE: f64 = 1e-6;

impl Scale {
    /// The unbounded coordinate of value `v` (clamped just inside the range).
    pub fn to_unbounded(self, v: f64) -> f64 {
        match self {
            Scale::Log => v.max(1e-12).ln(),
            Scale::Logit { lo, hi } => {
                let x = ((v - lo) / (hi - lo)).clamp(LOGIT_EDGE, 1.0 - LOGIT_EDGE);
                (x / (1.0 - x)).ln()
            }
        }
    }

    /// The value at unbounded coordinate `u` (the inverse of [`Scale::to_unbounded`]).
    pub fn from_unbounded(self, u: f64) -> f64 {
        match self {
            Scale::Log => u.exp(),
            Scale::Logit { lo, hi } => lo + (hi - lo) / (1.0 + (-u).exp()),
        }
    }
}

/// Median of `values` (NaN when empty).
pub fn median(values: Vec<f64>) -> f64 {
    Data::new(values).median()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_round_trip() {
        for (scale, v) in [
            (Scale::Logit { lo: 0.05, hi: 1.0 }, 0.7),
            (Scale::Logit { lo: 0.0, hi: 1.0 }, 0.25),
            (Scale::Log, 3.5e-6),
        ] {
            let back = scale.from_unbounded(scale.to_unbounded(v));
            assert!(
                (back - v).abs() < 1e-9 * v.max(1e-6),
                "{scale:?} {v} {back}"
            );
        }
    }

    #[test]
    fn fields_read_what_they_write() {
        let mut g = GpuProfile::load("h100-sxm").unwrap();
        for f in [
            MATMUL,
            ATTENTION,
            MEMORY_BOUND,
            KERNEL_OVERHEAD_S,
            OVERLAP_INTERFERENCE,
            INTRA_LINK,
            INTER_LINK,
        ] {
            (f.set)(&mut g, 0.123);
            assert_eq!((f.get)(&g), 0.123, "{}", f.name);
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
