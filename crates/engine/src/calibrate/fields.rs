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

/// Declares a [`ProfileField`] constant for the profile field at `path`, named after it.
macro_rules! profile_field {
    ($(#[$doc:meta])* $constant:ident: $first:ident $(. $rest:ident)*) => {
        $(#[$doc])*
        pub const $constant: ProfileField = ProfileField {
            name: concat!(stringify!($first) $(, ".", stringify!($rest))*),
            get: |g| g.$first$(.$rest)*,
            set: |g, v| g.$first$(.$rest)* = v,
        };
    };
}

profile_field!(
    /// `efficiency.matmul`: achieved share of peak on GEMMs.
    MATMUL: efficiency.matmul
);
profile_field!(
    /// `efficiency.attention`: achieved share of peak in the attention core.
    ATTENTION: efficiency.attention
);
profile_field!(
    /// `efficiency.memory_bound`: achieved share of memory bandwidth on elementwise ops.
    MEMORY_BOUND: efficiency.memory_bound
);
profile_field!(
    /// `efficiency.kernel_overhead_s`: fixed launch cost per kernel, in seconds.
    KERNEL_OVERHEAD_S: efficiency.kernel_overhead_s
);
profile_field!(
    /// `efficiency.overlap_interference`: how much overlapped communication slows compute.
    OVERLAP_INTERFERENCE: efficiency.overlap_interference
);
profile_field!(
    /// `efficiency.sync_skew`: waiting at synchronising collectives, per second of compute.
    SYNC_SKEW: efficiency.sync_skew
);
profile_field!(
    /// `links.intra_node.efficiency`: achieved share of NVLink bandwidth.
    INTRA_LINK: links.intra_node.efficiency
);
profile_field!(
    /// `links.inter_node.efficiency`: achieved share of the network's bandwidth.
    INTER_LINK: links.inter_node.efficiency
);

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
    fn names_are_the_dotted_paths() {
        assert_eq!(MATMUL.name, "efficiency.matmul");
        assert_eq!(INTRA_LINK.name, "links.intra_node.efficiency");
        assert_eq!(KERNEL_OVERHEAD_S.name, "efficiency.kernel_overhead_s");
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
