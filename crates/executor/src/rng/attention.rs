//! The mask of attention dropout (dropout of the softmax probabilities, Megatron's
//! `--attention-dropout`), drawn from Philox 4x32-10 keyed by the element's global coordinates:
//! (seed, step, layer, global query head, global query token, key position). Any TP split of the
//! heads, CP layout of the sequence (ring, zigzag, all-gather, Ulysses) or DP/PP placement
//! therefore draws the single-rank run's mask, and backward regenerates it instead of keeping it
//! (as FlashAttention-2 does).
//!
//! Philox call: counter = [query token low word, key position / 4, global head XOR (query token
//! high word rotated left 16), layer], key = [seed low XOR step rotated left 16, seed high XOR
//! step XOR [`ATTN_KEY_TAG`]]; output word `key position % 4` is the uniform draw, and the
//! element is kept when it is at least round(p 2^32) (then scaled by 1 / (1 - p)). The tag keeps
//! these keys disjoint from the hidden dropout's ([`super::DropoutKey`]): the first key word
//! fixes the step, and the second then differs in its top bit.

use super::philox::{fill_kept, philox4x32_10};

/// XORed into the second key word so attention and hidden dropout never share a Philox key.
pub const ATTN_KEY_TAG: u32 = 0x8000_0000;

/// The coordinates shared by every element of one attention call's dropout mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDropout {
    pub seed: u64,
    /// Optimizer step (0-based).
    pub step: u32,
    /// Global decoder layer.
    pub layer: u32,
    /// Drop probability, in [0, 1).
    pub p: f32,
    /// Global index of the call's first query head (the TP rank's heads, and under Ulysses the
    /// CP rank's head group), so head `h` of the call is global head `head0 + h`.
    pub head0: u32,
    /// Global batch index of the call's first sequence.
    pub sample0: u64,
    /// Sequence length: query row at position `q` of sequence `b` is global token
    /// `(sample0 + b) seq + q`.
    pub seq: u64,
}

impl AttnDropout {
    /// round(p 2^32): a draw below it drops the element (the device kernels take it as is).
    pub fn threshold(&self) -> u64 {
        (f64::from(self.p) * 4_294_967_296.0).round() as u64
    }

    /// The scale of a kept probability (inverted dropout).
    pub fn keep_scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    fn block(&self, head: u32, qtok: u64, kblock: u32) -> [u32; 4] {
        let counter = [
            qtok as u32,
            kblock,
            head ^ ((qtok >> 32) as u32).rotate_left(16),
            self.layer,
        ];
        let key = [
            self.seed as u32 ^ self.step.rotate_left(16),
            (self.seed >> 32) as u32 ^ self.step ^ ATTN_KEY_TAG,
        ];
        philox4x32_10(counter, key)
    }

    /// Whether the probability of (sequence `b` of the call, head `h` of the call, query at
    /// position `qpos`, key at position `kpos`) is kept.
    pub fn keep(&self, b: usize, h: usize, qpos: u32, kpos: u32) -> bool {
        let qtok = (self.sample0 + b as u64) * self.seq + u64::from(qpos);
        let w = self.block(self.head0 + h as u32, qtok, kpos / 4)[(kpos % 4) as usize];
        u64::from(w) >= self.threshold()
    }

    /// Writes the scaled mask (0 or 1 / (1 - p)) of one query row against the consecutive keys
    /// at positions `k0, k0 + 1, ..` into `out`.
    pub fn fill_row(&self, b: usize, h: usize, qpos: u32, k0: u32, out: &mut [f32]) {
        let qtok = (self.sample0 + b as u64) * self.seq + u64::from(qpos);
        let head = self.head0 + h as u32;
        let (thr, scale) = (self.threshold(), self.keep_scale());
        fill_kept(out, u64::from(k0), thr, scale, |kb| {
            self.block(head, qtok, kb as u32)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AttnDropout {
        AttnDropout {
            seed: 1234,
            step: 1,
            layer: 2,
            p: 0.3,
            head0: 0,
            sample0: 0,
            seq: 16,
        }
    }

    /// A TP rank (head0 = 2) and a later microbatch (sample0 = 1) name the same elements as
    /// the whole call; a row filled from a mid-block key start matches `keep` element-wise.
    #[test]
    fn shifted_heads_and_samples_draw_the_whole_calls_mask() {
        let whole = key();
        let part = AttnDropout {
            head0: 2,
            sample0: 1,
            ..whole
        };
        let mut row = vec![0.0; 9];
        part.fill_row(0, 1, 13, 5, &mut row);
        for (j, &z) in row.iter().enumerate() {
            assert_eq!(z != 0.0, whole.keep(1, 3, 13, 5 + j as u32));
            assert_eq!(z != 0.0, part.keep(0, 1, 13, 5 + j as u32));
        }
    }

    /// Bernoulli(p) over 64 x 64 x 4 elements: the drop fraction within 5 sigma of p, and
    /// the attention mask is not the hidden dropout's for the same coordinates.
    #[test]
    fn drop_fraction_is_p_and_distinct_from_hidden_dropout() {
        let k = key();
        let mut dropped = 0usize;
        let mut n = 0usize;
        for h in 0..4 {
            for q in 0..64u32 {
                let mut row = vec![0.0; 64];
                k.fill_row(0, h, q, 0, &mut row);
                dropped += row.iter().filter(|&&z| z == 0.0).count();
                n += 64;
            }
        }
        let frac = dropped as f64 / n as f64;
        let sigma = (0.3 * 0.7 / n as f64).sqrt();
        assert!((frac - 0.3).abs() < 5.0 * sigma, "{frac}");
        let hidden = super::super::DropoutKey {
            seed: 1234,
            step: 1,
            layer: 2,
            site: super::super::DropoutSite::Embedding,
            p: 0.5,
        };
        let attn = AttnDropout { p: 0.5, ..k };
        let same = (0..256u32)
            .filter(|&e| hidden.keep(0, u64::from(e)) == attn.keep(0, 0, 0, e))
            .count();
        assert!((64..192).contains(&same), "{same}");
    }
}
