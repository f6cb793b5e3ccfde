//! The activation walk's loop ([`super::activation_peak`]): live bytes action by action, in
//! whichever signed integer holds every sum of the walk. The bytes are u64 figures and the
//! walk subtracts what it frees, so i128 always holds them; i64, when the walk's largest
//! possible sum fits, gives the same result with half-width arithmetic.

use crate::schedule::{whole_passes_sets, ActionKind, ComputeAction};
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
/// `whole_sets`, when given, says the actions are whole forwards and backwards of one stage,
/// each set freed, at most that many live (what [`crate::schedule::whole_passes_sets`] finds).
pub(super) fn peaks(
    actions: &[ComputeAction],
    chunks: &[ChunkBytes<i128>],
    whole_sets: Option<u32>,
) -> (i128, i128) {
    if let [only] = chunks {
        let on_chunk = actions.first().is_none_or(|a| a.stage == only.stage);
        let sets = whole_sets
            .or_else(|| whole_passes_sets(actions))
            .filter(|_| on_chunk);
        if let Some(p) = sets.and_then(|k| whole_passes_peaks(only, k.into())) {
            return p;
        }
    }
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

/// [`walk`]'s result, in closed form, for a rank of one chunk `c` whose actions are whole
/// forwards and backwards with at most `sets` live ([`whole_passes_sets`]); `None` when a field
/// is negative. Every term the walk takes grows with the live bytes, and the most sets live,
/// K, are reached by a forward that a backward follows (another forward would make K + 1): so
/// each term is largest at K live sets, which is what walking K forwards and K backwards gives.
fn whole_passes_peaks(c: &ChunkBytes<i128>, sets: u64) -> Option<(i128, i128)> {
    if c.fields().iter().any(|&x| x < 0) {
        return None;
    }
    if sets == 0 {
        return Some((0, 0));
    }
    let l = i128::from(sets) * c.saved;
    let layers = l - c.tail + c.rebuilt;
    let peak = l.max(layers).max(0);
    let mut with = [
        layers + c.fwd,
        l + if c.tail > 0 { c.out_fwd } else { c.fwd },
        l,
        layers + c.layer_bwd,
        0,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if c.tail > 0 {
        with = with.max(l + c.out_bwd);
    }
    Some((peak, with))
}

/// The walk itself (docs on [`super::activation_peak`]): (peak, peak with buffers).
fn walk<T>(actions: &[ComputeAction], chunks: &[ChunkBytes<T>]) -> (T, T)
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
        let actions: Vec<ComputeAction> =
            kinds.iter().map(|&k| ComputeAction::new(k, 0, 0)).collect();
        let small = [chunk(1_000_003)];
        let wide = walk(&actions, &small);
        let narrow = walk(&actions, &[small[0].narrow().expect("fits")]);
        assert_eq!(wide, (narrow.0.into(), narrow.1.into()));
        assert_eq!(peaks(&actions, &small, None), wide);
        // By hand with S = 2^62 saved bytes a set: F, F (2 S live), I frees S - S/4 (1.25 S),
        // then the third F holds 2.25 S, less its tail S/8 plus the rebuilt S/2 while its
        // layers run: 2.625 S = 2^63 + 2^61 + 2^59, past i64.
        let huge = [chunk(1i128 << 62)];
        let (peak, _) = peaks(&actions, &huge, None);
        assert_eq!(peak, (1i128 << 63) + (1i128 << 61) + (1i128 << 59));
    }

    /// The closed form of a rank of whole forwards and backwards is the walk's result, on
    /// random orders (every prefix frees no more sets than it made) and random byte counts,
    /// with and without an output block; anything else (a split backward, a second stage,
    /// a set never freed) is left to the walk.
    #[test]
    fn whole_passes_closed_form_is_the_walk() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut compared = 0;
        for case in 0..400 {
            let mut field = || i128::from(draw(1 << 40));
            let saved = field();
            let c = ChunkBytes {
                stage: 3,
                saved,
                pending: field() % (saved + 1),
                tail: if case % 2 == 0 {
                    0
                } else {
                    field() % (saved + 1)
                },
                tail_pending: field() % 1000,
                rebuilt: if case % 3 == 0 { 0 } else { field() },
                fwd: field(),
                out_fwd: field(),
                out_bwd: field(),
                layer_bwd: field(),
                wpass: field(),
            };
            let n = 1 + draw(12);
            let (mut made, mut freed) = (0, 0);
            let mut actions = Vec::new();
            while freed < n {
                let forward = made < n && (made == freed || draw(2) == 0);
                let kind = if forward {
                    ActionKind::F
                } else {
                    ActionKind::B
                };
                actions.push(ComputeAction::new(kind, 3, 0));
                if forward {
                    made += 1;
                } else {
                    freed += 1;
                }
            }
            let sets = whole_passes_sets(&actions).expect("whole passes");
            let closed = whole_passes_peaks(&c, sets.into()).expect("no negative field");
            assert_eq!(closed, walk(&actions, &[c]), "case {case}: {actions:?}");
            assert_eq!(peaks(&actions, &[c], None), closed);
            assert_eq!(peaks(&actions, &[c], Some(sets)), closed);
            compared += 1;
        }
        assert_eq!(compared, 400);
        let c = ChunkBytes {
            stage: 0,
            saved: 10,
            ..ChunkBytes::default()
        };
        let split = [ActionKind::F, ActionKind::I, ActionKind::W];
        let split: Vec<ComputeAction> =
            split.iter().map(|&k| ComputeAction::new(k, 0, 0)).collect();
        assert_eq!(whole_passes_sets(&split), None);
        let two_stages = [
            ComputeAction::new(ActionKind::F, 0, 0),
            ComputeAction::new(ActionKind::F, 1, 0),
        ];
        assert_eq!(whole_passes_sets(&two_stages), None);
        assert_eq!(
            whole_passes_sets(&[ComputeAction::new(ActionKind::F, 0, 0)]),
            None
        );
        let other_stage = [
            ComputeAction::new(ActionKind::F, 1, 0),
            ComputeAction::new(ActionKind::B, 1, 0),
        ];
        assert_eq!(whole_passes_sets(&other_stage), Some(1));
        // Whole passes, but of a stage the chunk is not: the walk's answer (nothing live).
        assert_eq!(peaks(&other_stage, &[c], None), walk(&other_stage, &[c]));
    }
}
