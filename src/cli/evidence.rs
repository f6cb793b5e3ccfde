//! The published evidence set beside a prediction: the best MFU any published run reached on
//! the GPU (calibration/data/published-throughput.json), for the confidence notes of
//! `parsim::report::confidence`.

use parsim::report::confidence::PublishedBest;

/// The best published MFU on the GPU profile `gpu`, if parsim's data holds a run on it.
pub fn published_best(gpu: &str) -> Option<PublishedBest> {
    parsim::calibrate::published::best_mfu(gpu).map(|(mfu, source)| PublishedBest { mfu, source })
}
