//! The activation walk's loop ([`super::activation_peak`]): live bytes action by action, in
//! whichever signed integer holds every sum of the walk. The bytes are u64 figures and the
//! walk subtracts what it frees, so i128 always holds them; i64, when the walk's largest
//! possible sum fits, gives the same result with half-width arithmetic.

use crate::schedule::{Action, ActionKind};
use std::ops::{Add, Sub};

/// One chunk's bytes as the walk adds them, with the buffers of its passes.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct ChunkBytes<T> {
    pub stage: u32,
    pub saved: T,
    pub pending: T,
    /// Saved bytes of the output block, which comes after the layers: freed first in
    /// backward, created last in forward.
    pub tail: T,
    /// What the output block's split backward keeps for its W (its share of `pending`).
    pub tail_pending: T,
    /// Full recompute: what the layer being rebuilt adds to its kept input.
    pub rebuilt: T,
    /// [`super::PhaseBuffers`] of the chunk's passes.
    pub fwd: T,
    pub out_fwd: T,
    pub out_bwd: T,
    pub layer_bwd: T,
    pub wpass: T,
}

impl ChunkBytes<i128> {
    fn fields(&self) -> [i128; 10] {
        [
            self.saved,
            self.pending,
            self.tail,
            self.tail_pending,
            self.rebuilt,
            self.fwd,
            self.out_fwd,
            self.out_bwd,
            self.layer_bwd,
            self.wpass,
        ]
    }

    /// The same in i64, when every field fits.
    fn narrow(&self) -> Option<ChunkBytes<i64>> {
        let n = |x: i128| i64::try_from(x).ok();
        Some(ChunkBytes {
            stage: self.stage,
            saved: n(self.saved)?,
            pending: n(self.pending)?,
            tail: n(self.tail)?,
            tail_pending: n(self.tail_pending)?,
            rebuilt: n(self.rebuilt)?,
            fwd: n(self.fwd)?,
            out_fwd: n(self.out_fwd)?,
            out_bwd: n(self.out_bwd)?,
            layer_bwd: n(self.layer_bwd)?,
            wpass: n(self.wpass)?,
        })
    }
}

/// (peak activation bytes, peak activation plus buffer bytes) of `actions` over `chunks`:
/// in i64 when no sum of the walk can leave it, else in i128. Every field is non-negative
/// and each action moves the live bytes by at most one field, so no sum exceeds
/// (actions + 4) x 4 x the largest field.
pub(super) fn peaks(actions: &[Action], chunks: &[ChunkBytes<i128>]) -> (i128, i128) {
    let largest = chunks
        .iter()
        .flat_map(ChunkBytes::fields)
        .map(i128::abs)
        .max()
        .unwrap_or(0);
    let bound = (actions.len() as i128 + 4)
        .saturating_mul(4)
        .saturating_mul(largest);
    if bound <= i64::MAX as i128 {
        let narrow = match chunks {
            [only] => only.narrow().map(|c| walk(actions, &[c])),
            _ => chunks
                .iter()
                .map(ChunkBytes::narrow)
                .collect::<Option<Vec<_>>>()
                .map(|c| walk(actions, &c)),
        };
        if let Some((peak, with)) = narrow {
            return (peak.into(), with.into());
        }
    }
    walk(actions, chunks)
}

/// The walk itself (docs on [`super::activation_peak`]): (peak, peak with buffers).
fn walk<T>(actions: &[Action], chunks: &[ChunkBytes<T>]) -> (T, T)
where
    T: Copy + Ord + Default + Add<Output = T> + Sub<Output = T>,
{
    let zero = T::default();
    let none = ChunkBytes::default();
    let mut live = zero;
    let mut peak = zero;
    let mut with = zero;
    let mut at = |a: T, buf: T, peak: &mut T| {
        *peak = (*peak).max(a);
        with = with.max(a + buf);
    };
    for a in actions {
        let c = chunks.iter().find(|c| c.stage == a.stage).unwrap_or(&none);
        match a.kind {
            ActionKind::F => {
                live = live + c.saved;
                // Full recompute: each layer's forward builds its whole set before keeping
                // only its input; the last layer does so before the output block's set exists.
                at(live - c.tail + c.rebuilt, c.fwd, &mut peak);
                // The output block runs last: with every set live, only its own transients.
                at(
                    live,
                    if c.tail > zero { c.out_fwd } else { c.fwd },
                    &mut peak,
                );
            }
            ActionKind::B | ActionKind::I => {
                // The output block's backward runs first, with everything still live; then
                // the layers, rebuilt one by one under full recompute, once its set is freed
                // (a split backward keeps what its W needs).
                if c.tail > zero {
                    at(live, c.out_bwd, &mut peak);
                }
                let kept_tail = if a.kind == ActionKind::I {
                    c.tail_pending
                } else {
                    zero
                };
                let layers = live - c.tail + kept_tail;
                at(layers + c.rebuilt, c.layer_bwd, &mut peak);
                if a.kind == ActionKind::I {
                    // The layers' pending set is built while their saved set is freed.
                    let grown = (c.pending - c.tail_pending) - (c.saved - c.tail);
                    at(layers + grown.max(zero), c.layer_bwd, &mut peak);
                    live = live + c.pending - c.saved;
                } else {
                    live = live - c.saved;
                }
            }
            ActionKind::W => {
                at(live, c.wpass, &mut peak);
                live = live - c.pending;
            }
        }
        at(live, zero, &mut peak);
    }
    (peak, with)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The i64 walk and the i128 walk agree where both hold the sums; figures too large for
    /// i64 take the i128 walk (three sets of 2^62 bytes live at once).
    #[test]
    fn narrow_and_wide_walks_agree() {
        let chunk = |saved: i128| ChunkBytes {
            stage: 0,
            saved,
            pending: saved / 4,
            tail: saved / 8,
            tail_pending: saved / 16,
            rebuilt: saved / 2,
            fwd: 7,
            out_fwd: 3,
            out_bwd: 5,
            layer_bwd: 11,
            wpass: 2,
        };
        let kinds = [
            ActionKind::F,
            ActionKind::F,
            ActionKind::I,
            ActionKind::F,
            ActionKind::W,
            ActionKind::I,
            ActionKind::W,
            ActionKind::I,
            ActionKind::W,
        ];
        let actions: Vec<Action> = kinds.iter().map(|&k| Action::new(k, 0, 0)).collect();
        let small = [chunk(1_000_003)];
        let wide = walk(&actions, &small);
        let narrow = walk(&actions, &[small[0].narrow().expect("fits")]);
        assert_eq!(wide, (narrow.0.into(), narrow.1.into()));
        assert_eq!(peaks(&actions, &small), wide);
        // By hand with S = 2^62 saved bytes a set: F, F (2 S live), I frees S - S/4 (1.25 S),
        // then the third F holds 2.25 S, less its tail S/8 plus the rebuilt S/2 while its
        // layers run: 2.625 S = 2^63 + 2^61 + 2^59, past i64.
        let huge = [chunk(1i128 << 62)];
        let (peak, _) = peaks(&actions, &huge);
        assert_eq!(peak, (1i128 << 63) + (1i128 << 61) + (1i128 << 59));
    }
}
