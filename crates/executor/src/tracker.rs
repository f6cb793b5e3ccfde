//! Per-rank memory tracker: every live tensor adds its bytes to its category while it lives.
//! Each rank's device owns one [`MemoryTracker`] and every tensor it allocates holds a handle
//! to it, so a rank sees exactly its own tensors whatever thread frees them. Communication
//! staging inside the collectives (the shared slots that stand in for NCCL's internal channel
//! buffers) is not tracked, as PyTorch's allocator does not see NCCL's buffers either.
//!
//! Two figures per category: *requested* bytes (what tensors asked for, the engine's
//! prediction) and *reserved* bytes (what the backend's allocator holds for them; the CPU
//! backend allocates exactly, so the two agree there; a caching device allocator rounds up).

use std::sync::{Arc, Mutex, MutexGuard};

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

use parsim_plan::run_report::MemoryBreakdown;

/// The field of `b` that counts category `c`.
fn slot(b: &mut MemoryBreakdown, c: Category) -> &mut u64 {
    match c {
        Category::Weights => &mut b.weights,
        Category::Gradients => &mut b.gradients,
        Category::Optimizer => &mut b.optimizer,
        Category::Activations => &mut b.activations,
        Category::Buffers => &mut b.buffers,
    }
}

#[derive(Debug, Default)]
struct State {
    live: MemoryBreakdown,
    /// The breakdown at the moment the total was highest.
    peak: MemoryBreakdown,
    /// Each category's own maximum (at different moments).
    max: MemoryBreakdown,
    /// Where the allocation that reached the peak was made (for diagnosis).
    peak_site: Option<&'static std::panic::Location<'static>>,
    /// Reserved bytes live now and at their highest.
    reserved_live: MemoryBreakdown,
    reserved_peak: MemoryBreakdown,
}

/// One rank's tracker of requested and reserved bytes by category; clones share the count.
#[derive(Debug, Clone, Default)]
pub struct MemoryTracker {
    state: Arc<Mutex<State>>,
}

impl MemoryTracker {
    /// A tracker with nothing live.
    pub fn new() -> MemoryTracker {
        MemoryTracker::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves counts that are still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an allocation of `requested_bytes` that the allocator served with
    /// `reserved_bytes`.
    #[track_caller]
    pub fn alloc(&self, c: Category, requested_bytes: u64, reserved_bytes: u64) {
        let site = std::panic::Location::caller();
        let mut t = self.lock();
        *slot(&mut t.live, c) += requested_bytes;
        if t.live.total() > t.peak.total() {
            t.peak = t.live;
            t.peak_site = Some(site);
        }
        let v = *slot(&mut t.live, c);
        let m = slot(&mut t.max, c);
        *m = (*m).max(v);
        *slot(&mut t.reserved_live, c) += reserved_bytes;
        if t.reserved_live.total() > t.reserved_peak.total() {
            t.reserved_peak = t.reserved_live;
        }
    }

    /// Counts the release of an allocation counted by [`MemoryTracker::alloc`].
    pub fn free(&self, c: Category, requested_bytes: u64, reserved_bytes: u64) {
        let mut t = self.lock();
        let s = slot(&mut t.live, c);
        *s = s.saturating_sub(requested_bytes);
        let r = slot(&mut t.reserved_live, c);
        *r = r.saturating_sub(reserved_bytes);
    }

    /// Requested bytes live now.
    pub fn live(&self) -> MemoryBreakdown {
        self.lock().live
    }

    /// The requested breakdown at the peak total since the last [`MemoryTracker::reset_peak`].
    pub fn peak(&self) -> MemoryBreakdown {
        self.lock().peak
    }

    /// The reserved breakdown at the reserved peak since the last reset.
    pub fn reserved_peak(&self) -> MemoryBreakdown {
        self.lock().reserved_peak
    }

    /// The source location of the allocation that reached the peak.
    pub fn peak_site(&self) -> Option<String> {
        self.lock()
            .peak_site
            .map(|l| format!("{}:{}", l.file(), l.line()))
    }

    /// Each category's own maximum since the last reset (reached at different moments).
    pub fn category_max(&self) -> MemoryBreakdown {
        self.lock().max
    }

    /// Starts a new peak measurement from what is live now.
    pub fn reset_peak(&self) {
        let mut t = self.lock();
        t.peak = t.live;
        t.max = t.live;
        t.reserved_peak = t.reserved_live;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trackers_count_apart_and_keep_the_peak_breakdown() {
        let (a, b) = (MemoryTracker::new(), MemoryTracker::new());
        a.alloc(Category::Weights, 100, 128);
        a.alloc(Category::Activations, 50, 64);
        a.free(Category::Activations, 50, 64);
        a.alloc(Category::Buffers, 10, 16);
        b.alloc(Category::Gradients, 7, 7);
        assert_eq!(a.peak().total(), 150);
        assert_eq!(a.peak().activations, 50);
        assert_eq!(a.live().total(), 110);
        assert_eq!(a.reserved_peak().total(), 192);
        assert_eq!(a.category_max().buffers, 10);
        assert_eq!(b.live().total(), 7);
        assert_eq!(b.live().weights, 0);
        a.reset_peak();
        assert_eq!(a.peak().total(), 110);
    }
}
