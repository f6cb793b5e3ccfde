//! DualPipe-V: DeepSeek's DualPipe (DeepSeek-V3 technical report, §3.2.1) folded into a V on
//! one direction ("DualPipeV" in the deepseek-ai/DualPipe repository, `dualpipev.py`).
//!
//! Rank r holds stages r (phase 0, going down the ranks) and 2p-1-r (phase 1, coming back up);
//! the loss is on rank 0's phase-1 chunk. The per-rank order follows the eight steps of
//! `DualPipeV.step()`:
//! 1. `2(p-r-1)` forwards of phase 0;
//! 2. `r+1` pairs (F phase 0, F phase 1);
//! 3. `p-r-1` triples (I phase 1, W, F phase 1) — zero-bubble backward;
//! 4. `m-2p+r+1` pairs of overlapped slots (F0 & B1, F1 & B0); on the last rank the very
//!    first F0, B1 pair is not overlapped, as in the reference;
//! 5. `p-r-1` pairs (B phase 1, overlapped F1 & B0);
//! 6. `r+1` pairs (B phase 1, B phase 0), the second half as I (W deferred);
//! 7. `p-r-1` pairs (W, I phase 0);
//! 8. `r+1` W passes.
//!
//! W passes pop the oldest deferred weight gradient (the reference's `WeightGradStore` FIFO).
//! An overlapped slot is two actions marked [`Overlap::First`] (the forward) and
//! [`Overlap::Second`] (the full backward); the simulator starts both when both inputs exist.
//! The reference asserts `m >= 2p`. Per the README, activations per device peak at PP+1 chunk
//! sets with PP = 2p stages, i.e. 2p+1, and the bubble is (PP/2-1)(F&B + B - 3W).

use super::action::{ActionKind, ComputeAction, Overlap};
use std::collections::VecDeque;

struct Rank {
    out: Vec<ComputeAction>,
    stage: [u32; 2],
    f: [u32; 2],
    b: [u32; 2],
    pending_w: VecDeque<(u32, u32)>,
}

impl Rank {
    fn forward(&mut self, phase: usize) {
        let a = ComputeAction::new(ActionKind::F, self.stage[phase], self.f[phase]);
        self.f[phase] += 1;
        self.out.push(a);
    }

    fn backward(&mut self, phase: usize, zero_bubble: bool) {
        let mb = self.b[phase];
        self.b[phase] += 1;
        let stage = self.stage[phase];
        if zero_bubble {
            self.out.push(ComputeAction::new(ActionKind::I, stage, mb));
            self.pending_w.push_back((stage, mb));
        } else {
            self.out.push(ComputeAction::new(ActionKind::B, stage, mb));
        }
    }

    fn weight(&mut self) {
        // The generator pushes and pops in matched numbers (checked by the tests); an empty
        // queue would be a bug in this file, and the simulator's program check would report
        // the missing W rather than panicking here.
        if let Some((stage, mb)) = self.pending_w.pop_front() {
            self.out.push(ComputeAction::new(ActionKind::W, stage, mb));
        }
    }

    fn overlapped(&mut self, f_phase: usize, b_phase: usize) {
        self.forward(f_phase);
        if let Some(a) = self.out.last_mut() {
            a.overlap = Overlap::First;
        }
        self.backward(b_phase, false);
        if let Some(a) = self.out.last_mut() {
            a.overlap = Overlap::Second;
        }
    }
}

/// Rank programs for `pp` ranks and `m >= 2 pp` microbatches (checked by the caller).
pub(super) fn ranks(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
    (0..pp)
        .map(|r| {
            let mut k = Rank {
                out: Vec::with_capacity(6 * m as usize),
                stage: [r, 2 * pp - 1 - r],
                f: [0; 2],
                b: [0; 2],
                pending_w: VecDeque::new(),
            };
            let last = r == pp - 1;
            for _ in 0..2 * (pp - r - 1) {
                k.forward(0);
            }
            for _ in 0..r + 1 {
                k.forward(0);
                k.forward(1);
            }
            for _ in 0..pp - r - 1 {
                k.backward(1, true);
                k.weight();
                k.forward(1);
            }
            for i in 0..(m + r + 1 - 2 * pp) {
                if i == 0 && last {
                    k.forward(0);
                    k.backward(1, false);
                } else {
                    k.overlapped(0, 1);
                }
                k.overlapped(1, 0);
            }
            for _ in 0..pp - r - 1 {
                k.backward(1, false);
                k.overlapped(1, 0);
            }
            let step6 = r + 1;
            let mut zb = false;
            for i in 0..step6 {
                if i == step6 / 2 && r % 2 == 1 {
                    zb = true;
                }
                k.backward(1, zb);
                if i == step6 / 2 && r % 2 == 0 {
                    zb = true;
                }
                k.backward(0, zb);
            }
            for _ in 0..pp - r - 1 {
                k.weight();
                k.backward(0, true);
            }
            for _ in 0..r + 1 {
                k.weight();
            }
            k.out
        })
        .collect()
}
