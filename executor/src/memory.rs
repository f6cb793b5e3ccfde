//! Per-rank memory tracker: every live [`Tensor`](crate::backend::cpu::Tensor) adds its bytes to its
//! category while it lives. Ranks are threads, so the tracker is thread-local: a rank sees
//! exactly its own tensors. Communication staging inside the collectives (the shared slots
//! that stand in for NCCL's internal channel buffers) is not tracked, as PyTorch's allocator
//! does not see NCCL's buffers either.

use serde::Serialize;
use std::cell::RefCell;

/// What a tensor is, for the memory breakdown (the engine's categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Weights,
    Gradients,
    Optimizer,
    /// Tensors kept from forward to backward (and, for split backward, until W).
    Activations,
    /// Everything else: temporaries, gathered parameters, communication buffers.
    Buffers,
}

/// Bytes per category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryBreakdown {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.buffers
    }

    fn slot(&mut self, c: Category) -> &mut u64 {
        match c {
            Category::Weights => &mut self.weights,
            Category::Gradients => &mut self.gradients,
            Category::Optimizer => &mut self.optimizer,
            Category::Activations => &mut self.activations,
            Category::Buffers => &mut self.buffers,
        }
    }
}

#[derive(Default)]
struct Tracker {
    live: MemoryBreakdown,
    /// The breakdown at the moment the total was highest.
    peak: MemoryBreakdown,
    /// Each category's own maximum (at different moments).
    max: MemoryBreakdown,
    /// Where the allocation that reached the peak was made (for diagnosis).
    peak_site: Option<&'static std::panic::Location<'static>>,
}

thread_local! {
    static TRACKER: RefCell<Tracker> = RefCell::new(Tracker::default());
}

#[track_caller]
pub(crate) fn alloc(c: Category, bytes: u64) {
    let site = std::panic::Location::caller();
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        *t.live.slot(c) += bytes;
        if t.live.total() > t.peak.total() {
            t.peak = t.live;
            t.peak_site = Some(site);
        }
        let v = *t.live.slot(c);
        let m = t.max.slot(c);
        *m = (*m).max(v);
    });
}

pub(crate) fn free(c: Category, bytes: u64) {
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        let s = t.live.slot(c);
        *s = s.saturating_sub(bytes);
    });
}

/// Live bytes of this thread (rank) now.
pub fn live() -> MemoryBreakdown {
    TRACKER.with(|t| t.borrow().live)
}

/// The breakdown at this thread's peak total since the last [`reset_peak`].
pub fn peak() -> MemoryBreakdown {
    TRACKER.with(|t| t.borrow().peak)
}

/// The source location of the allocation that reached this thread's peak.
pub fn peak_site() -> Option<String> {
    TRACKER.with(|t| {
        t.borrow()
            .peak_site
            .map(|l| format!("{}:{}", l.file(), l.line()))
    })
}

/// Each category's own maximum since the last [`reset_peak`] (reached at different moments).
pub fn category_max() -> MemoryBreakdown {
    TRACKER.with(|t| t.borrow().max)
}

/// Starts a new peak measurement from what is live now.
pub fn reset_peak() {
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        t.peak = t.live;
        t.max = t.live;
    });
}
