//! Batch: the global batch splits into microbatches over data parallelism.

use super::super::{Config, Violation};
use super::data_parallel;

/// The most microbatches per step: counts of per-microbatch collectives (twice the
/// microbatches for ZeRO-3's gathers) stay within 32 bits.
const MAX_MICROBATCHES: u64 = 1 << 30;

/// The global batch is a multiple of micro batch x DP, in at most 2^30 microbatches.
pub fn batch(cfg: &Config) -> Vec<Violation> {
    let t = &cfg.training;
    let dp = data_parallel(cfg).unwrap_or(0);
    let mut errs = Vec::new();
    if dp > 0 {
        let per_step = t.micro_batch_size * dp;
        if t.global_batch_size % per_step != 0 {
            errs.push(
                Violation::new(
                    "training.global_batch_size",
                    format!(
                        "must be divisible by micro_batch_size x dp = {} x {dp} = {per_step}, got {}",
                        t.micro_batch_size, t.global_batch_size
                    ),
                )
                .hint(nearest_multiples(t.global_batch_size, per_step)),
            );
        } else {
            let microbatches = t.global_batch_size / per_step;
            if microbatches > MAX_MICROBATCHES {
                errs.push(
                    Violation::new(
                        "training.global_batch_size",
                        format!(
                            "too many microbatches: {} / ({} x {dp}) = {microbatches}, at most 2^30",
                            t.global_batch_size, t.micro_batch_size
                        ),
                    )
                    .hint("raise the micro batch size or the data-parallel degree"),
                );
            }
        }
    }
    errs
}

/// The multiples of `per_step` on either side of `gbs` (one when `gbs` is below the first).
fn nearest_multiples(gbs: u64, per_step: u64) -> String {
    let (below, above) = (gbs / per_step * per_step, (gbs / per_step + 1) * per_step);
    if below == 0 {
        format!("use {above}")
    } else {
        format!("use {below} or {above}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fields, with};
    use super::*;

    #[test]
    fn the_global_batch_splits_over_dp() {
        assert!(batch(&Config::default()).is_empty());
        // dp 4 x micro batch 1: 62 is not a multiple of 4.
        let v = batch(&with(|c| c.training.global_batch_size = 62));
        assert_eq!(fields(&v), ["training.global_batch_size"]);
        assert_eq!(v[0].hint.as_deref(), Some("use 60 or 64"));
        // Below the first multiple there is one to suggest, not the same one twice.
        let v = batch(&with(|c| c.training.global_batch_size = 3));
        assert_eq!(v[0].hint.as_deref(), Some("use 4"));
    }
}
