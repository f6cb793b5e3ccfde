//! Inverse questions over a range of GPU counts: the best mix at each count and the smallest
//! count where any mix fits (`parsim search --gpus 64..4096`).
//!
//! The counts tried are the powers of two inside the range, plus both ends (so `96..768`
//! tries 96, 128, 256, 512 and 768).

use crate::search::{search, Ranked, SearchError, SearchSpec};
use serde::Serialize;
use std::sync::atomic::AtomicBool;

/// The largest range end accepted: the search enumerates divisors of each count.
pub const MAX_GPUS: u32 = 1 << 20;

/// Why a range could not be searched.
#[derive(Debug, thiserror::Error)]
pub enum ScalingError {
    #[error("--gpus {0}: expected N or LOW..HIGH with 1 <= LOW <= HIGH <= {MAX_GPUS}")]
    Range(String),
    #[error(transparent)]
    Search(#[from] SearchError),
}

/// A GPU range `LOW..HIGH` (both included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuRange {
    pub low: u32,
    pub high: u32,
}

impl GpuRange {
    /// Parses `LOW..HIGH` (also `LOW..=HIGH`).
    pub fn parse(text: &str) -> Result<GpuRange, ScalingError> {
        let err = || ScalingError::Range(text.to_string());
        let (a, b) = text.split_once("..").ok_or_else(err)?;
        let b = b.strip_prefix('=').unwrap_or(b);
        let low: u32 = a.trim().parse().map_err(|_| err())?;
        let high: u32 = b.trim().parse().map_err(|_| err())?;
        if low == 0 || low > high || high > MAX_GPUS {
            return Err(err());
        }
        Ok(GpuRange { low, high })
    }

    /// The counts tried: both ends and every power of two between them, ascending.
    pub fn counts(&self) -> Vec<u32> {
        let mut out = vec![self.low];
        let mut p = self.low.next_power_of_two();
        while p < self.high {
            if p > self.low {
                out.push(p);
            }
            p *= 2;
        }
        if self.high != self.low {
            out.push(self.high);
        }
        out
    }
}

/// The best mix at one GPU count (`None` when no mix fits).
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    pub gpus: u32,
    pub candidates: u64,
    pub best: Option<Ranked>,
}

/// The result of a range search (`parsim search --gpus LOW..HIGH --json`).
#[derive(Debug, Clone, Serialize)]
pub struct ScalingResult {
    pub range: GpuRange,
    /// The smallest count tried where some mix fits.
    pub smallest_fitting_gpus: Option<u32>,
    pub points: Vec<ScalePoint>,
    /// True when interrupted (Ctrl-C): the points cover the counts searched so far.
    pub interrupted: bool,
}

/// Searches `spec` at every count of `range` (the spec's GPU count is replaced).
/// `progress(count_index, counts)` is called before each count.
pub fn search_range(
    spec: &SearchSpec,
    range: GpuRange,
    progress: &(dyn Fn(usize, usize) + Sync),
    cancel: &AtomicBool,
) -> Result<ScalingResult, ScalingError> {
    let counts = range.counts();
    let mut points = Vec::new();
    let mut interrupted = false;
    for (i, &gpus) in counts.iter().enumerate() {
        progress(i, counts.len());
        let mut s = spec.clone();
        s.base.cluster.num_gpus = gpus;
        s.top = 1;
        let r = search(&s, &|_, _| {}, cancel)?;
        interrupted = r.interrupted;
        points.push(ScalePoint {
            gpus,
            candidates: r.candidates,
            best: r.top.into_iter().next(),
        });
        if interrupted {
            break;
        }
    }
    Ok(ScalingResult {
        range,
        smallest_fitting_gpus: points.iter().find(|p| p.best.is_some()).map(|p| p.gpus),
        points,
        interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_powers_of_two_and_both_ends() {
        let r = GpuRange::parse("64..4096").unwrap();
        assert_eq!(r.counts(), vec![64, 128, 256, 512, 1024, 2048, 4096]);
        let r = GpuRange::parse("96..=768").unwrap();
        assert_eq!(r.counts(), vec![96, 128, 256, 512, 768]);
        assert_eq!(GpuRange::parse("8..8").unwrap().counts(), vec![8]);
        for bad in ["0..8", "8..4", "8", "a..b", "1..99999999"] {
            assert!(GpuRange::parse(bad).is_err(), "{bad}");
        }
    }
}
