//! Counter-based random numbers for dropout: Philox 4x32-10 (Salmon et al., "Parallel random
//! numbers: as easy as 1, 2, 3", SC'11), the generator of cuRAND and PyTorch's CUDA dropout.
//!
//! A counter-based generator is a keyed bijection of its counter, so a mask element depends only
//! on its coordinates (seed, step, layer, site, global token, element) and not on which rank
//! draws it or in what order. Any TP/SP/CP/PP/DP mix therefore draws exactly the mask of the
//! single-rank run, which is what Megatron's RNG tracker achieves for TP regions by forking seeds.

mod attention;
mod philox;
pub use attention::{AttnDropout, ATTN_KEY_TAG};
use philox::fill_kept;
pub use philox::{philox4x32, philox4x32_10, PHILOX_ROUNDS};

/// Where in the model a dropout sits; part of the mask's coordinates so two dropouts of one
/// layer draw independent masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropoutSite {
    /// After the word (+ position) embedding.
    Embedding = 0,
    /// After the attention output projection (Megatron's hidden dropout of the attention block).
    Attention = 1,
    /// After the MLP's down projection.
    Mlp = 2,
}

/// Sites per layer in the counter word that holds (layer, site).
const SITES: u32 = 3;

/// Why a dropout cannot be drawn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DropoutError {
    #[error("dropout probability {p} must lie in [0, 1)")]
    Probability { p: f32 },
    #[error("layer {layer} is too large for the dropout counter (at most {max})")]
    Layer { layer: u32, max: u32 },
    #[error("dropout over {elements} elements cannot be split into {rows} token rows")]
    Rows { elements: usize, rows: usize },
}

/// A [`DropoutKey`] as the words of the device generator's arguments (backend/cuda/compile/philox.h):
/// `layer_site` = layer x 3 + site, `threshold` = round(p 2^32) (kept where word >= it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutWords {
    pub seed: u64,
    pub step: u32,
    pub layer_site: u32,
    pub threshold: u64,
}

/// The coordinates of one dropout application that are shared by all its elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutKey {
    pub seed: u64,
    /// Optimizer step (0-based), so each step draws a fresh mask.
    pub step: u32,
    /// Global layer index (the same whatever pipeline stage or virtual chunk holds the layer);
    /// the embedding uses 0.
    pub layer: u32,
    pub site: DropoutSite,
    /// Drop probability, in [0, 1).
    pub p: f32,
}

impl DropoutKey {
    /// Checks the probability and the layer range.
    pub fn validate(&self) -> Result<(), DropoutError> {
        if !(0.0..1.0).contains(&self.p) {
            return Err(DropoutError::Probability { p: self.p });
        }
        let max = u32::MAX / SITES - 1;
        if self.layer > max {
            return Err(DropoutError::Layer {
                layer: self.layer,
                max,
            });
        }
        Ok(())
    }

    /// Uniform u32 below which an element is dropped: round(p * 2^32), so P(drop) = p to 2^-32.
    fn threshold(&self) -> u64 {
        (f64::from(self.p) * 4_294_967_296.0).round() as u64
    }

    /// The scale of a kept element (inverted dropout: expectation preserved in training).
    pub fn keep_scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// The key's words as the device generator (backend/cuda/compile/philox.h) takes them.
    pub fn words(&self) -> DropoutWords {
        DropoutWords {
            seed: self.seed,
            step: self.step,
            layer_site: self.layer * SITES + self.site as u32,
            threshold: self.threshold(),
        }
    }

    /// The 4 uniform words of the Philox block holding elements 4b..4b+3 of `token`
    /// (backend/cuda/compile/philox.h's `dropout_block`).
    pub fn block(&self, token: u64, b: u64) -> [u32; 4] {
        let counter = [
            token as u32,
            (token >> 32) as u32 ^ ((b >> 32) as u32).rotate_left(16),
            b as u32,
            self.layer * SITES + self.site as u32,
        ];
        let key = [
            self.seed as u32 ^ self.step.rotate_left(16),
            (self.seed >> 32) as u32 ^ self.step,
        ];
        philox4x32_10(counter, key)
    }

    /// Whether element `element` of global token `token` is kept.
    pub fn keep(&self, token: u64, element: u64) -> bool {
        let w = self.block(token, element / 4)[(element % 4) as usize];
        u64::from(w) >= self.threshold()
    }

    /// Writes the scaled mask (0 or 1 / (1 - p)) of a row-major block: row i is global token
    /// `tokens[i]`, column j is element `col_offset + j` of that token.
    pub fn fill_mask(&self, tokens: &[u64], col_offset: u64, out: &mut [f32]) {
        if tokens.is_empty() {
            return;
        }
        let cols = out.len() / tokens.len();
        let scale = self.keep_scale();
        let thr = self.threshold();
        for (row, &t) in out.chunks_mut(cols).zip(tokens) {
            fill_kept(row, col_offset, thr, scale, |b| self.block(t, b));
        }
    }
}

/// The global index of a token: sample `sample` of the global batch at sequence position
/// `position`, so every rank names a token the same way whatever its DP/CP/SP coordinates.
pub fn global_token(sample: u64, seq_len: u64, position: u64) -> u64 {
    sample * seq_len + position
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: f32) -> DropoutKey {
        DropoutKey {
            seed: 1234,
            step: 2,
            layer: 5,
            site: DropoutSite::Mlp,
            p,
        }
    }

    #[test]
    fn any_shard_of_the_mask_equals_the_same_slice_of_the_full_mask() {
        // Full mask of 8 tokens x 12 elements, then a CP zigzag-like token subset and a TP-like
        // column shard starting mid-block (offset 6 is not a multiple of 4).
        let k = key(0.3);
        let tokens: Vec<u64> = (0..8).collect();
        let mut full = vec![0.0; 8 * 12];
        k.fill_mask(&tokens, 0, &mut full);
        let rows = [0u64, 7, 3, 4];
        let mut shard = vec![0.0; rows.len() * 5];
        k.fill_mask(&rows, 6, &mut shard);
        for (i, &t) in rows.iter().enumerate() {
            for j in 0..5 {
                assert_eq!(shard[i * 5 + j], full[t as usize * 12 + 6 + j]);
                assert_eq!(shard[i * 5 + j] != 0.0, k.keep(t, 6 + j as u64));
            }
        }
    }

    #[test]
    fn drop_fraction_is_within_five_sigma_of_p() {
        // Bernoulli(p) over n elements: standard deviation sqrt(p (1 - p) / n).
        for p in [0.1f32, 0.5] {
            let k = key(p);
            let n_tokens = 256u64;
            let cols = 256usize;
            let tokens: Vec<u64> = (0..n_tokens).collect();
            let mut m = vec![0.0; n_tokens as usize * cols];
            k.fill_mask(&tokens, 0, &mut m);
            let n = m.len() as f64;
            let dropped = m.iter().filter(|&&v| v == 0.0).count() as f64 / n;
            let sigma = (f64::from(p) * (1.0 - f64::from(p)) / n).sqrt();
            assert!(
                (dropped - f64::from(p)).abs() < 5.0 * sigma,
                "p {p}: {dropped}"
            );
            let kept = m.iter().find(|&&v| v != 0.0).copied().unwrap();
            assert!((kept - 1.0 / (1.0 - p)).abs() < 1e-6);
        }
    }

    #[test]
    fn step_layer_and_site_draw_different_masks() {
        let base = key(0.5);
        let tokens: Vec<u64> = (0..16).collect();
        let draw = |k: DropoutKey| {
            let mut m = vec![0.0; 16 * 16];
            k.fill_mask(&tokens, 0, &mut m);
            m
        };
        let a = draw(base);
        for other in [
            DropoutKey { step: 3, ..base },
            DropoutKey { layer: 6, ..base },
            DropoutKey {
                site: DropoutSite::Attention,
                ..base
            },
            DropoutKey { seed: 1235, ..base },
        ] {
            let b = draw(other);
            // Independent Bernoulli(1/2) masks agree on about half the 256 elements.
            let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
            assert!((64..192).contains(&same), "{other:?}: {same}");
        }
    }

    #[test]
    fn bad_probability_and_layer_are_refused() {
        assert_eq!(
            key(1.0).validate(),
            Err(DropoutError::Probability { p: 1.0 })
        );
        assert!(key(-0.1).validate().is_err());
        assert!(key(f32::NAN).validate().is_err());
        assert!(DropoutKey {
            layer: u32::MAX,
            ..key(0.1)
        }
        .validate()
        .is_err());
        assert_eq!(key(0.0).validate(), Ok(()));
    }

    #[test]
    fn zero_probability_keeps_everything_unscaled() {
        let k = key(0.0);
        let mut m = vec![0.0; 4 * 9];
        k.fill_mask(&[1, 2, 3, 4], 0, &mut m);
        assert!(m.iter().all(|&v| v == 1.0));
    }
}
