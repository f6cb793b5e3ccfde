//! PyTorch's caching allocator: what it keeps reserved beyond the allocated peak, the figure
//! `torch.cuda.max_memory_reserved()` and nvidia-smi show.
//!
//! From c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch): a freed block stays cached in its
//! segment; a request is served by the smallest cached block at least as large (`get_free_block`,
//! splitting a large block), and only when none is large enough does the allocator take a new
//! segment from the driver (`alloc_block`); segments are never merged. When the driver refuses
//! a segment, the allocator returns its wholly free cached segments and retries
//! (`release_cached_blocks`), so the cache never makes a run fail by itself: the reserve stops
//! at the device's memory. Requests are rounded up to 512 bytes, and those over 10 MiB to a
//! multiple of 2 MiB (`round_size`, `get_allocation_size`), which for the buffers here is well
//! under a percent.
//!
//! The pattern this models: once the backward is done its activation blocks are free but
//! cached, and the reduce and the optimizer step allocate buffers one after another (DeepSpeed's
//! reduce bucket, its checks' fp32 and fp64 gradient copies, its flat gradient copies): each is
//! served by the best-fitting cached block with room, or takes a new segment beside them, so
//! the reserve peaks at the backward's plus those new segments. A framework whose step
//! allocates nothing large (Megatron-Core's in-place step on its grad buffer) reserves no more
//! than it allocates.

/// One allocation of the reduce or the step, in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepAlloc {
    pub bytes: u64,
    /// Still live when the next one is made (else freed right after its use).
    pub kept: bool,
}

/// The bytes of new segments `allocs` take, in order, when the cache holds free segments of
/// `cached` bytes: each request goes to the segment with the least free room that is enough
/// (best fit), else to a new segment of its own size, which stays cached for the later ones.
pub fn new_segment_bytes(cached: &[u64], allocs: &[StepAlloc]) -> u64 {
    // (size, live bytes) of each segment; a segment's free room serves as one block.
    let mut segments: Vec<(u64, u64)> = cached.iter().map(|&c| (c, 0)).collect();
    let mut fresh = 0;
    for a in allocs.iter().filter(|a| a.bytes > 0) {
        let best = segments
            .iter()
            .enumerate()
            .filter(|(_, (size, live))| size - live >= a.bytes)
            .min_by_key(|(_, (size, live))| size - live)
            .map(|(i, _)| i);
        let i = best.unwrap_or_else(|| {
            segments.push((a.bytes, 0));
            fresh += a.bytes;
            segments.len() - 1
        });
        if a.kept {
            segments[i].1 += a.bytes;
        }
    }
    fresh
}

/// What the allocator keeps reserved beyond an allocated peak of `total` on a device of
/// `capacity` bytes, when the backward's moment of `backward_total` bytes leaves its blocks
/// cached and the reduce and the step then take `new_segments` bytes of new segments: never
/// past the device's memory (`release_cached_blocks`).
pub fn cache_bytes(backward_total: u64, new_segments: u64, total: u64, capacity: u64) -> u64 {
    let reserved = backward_total.saturating_add(new_segments).min(capacity);
    reserved.saturating_sub(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(bytes: u64) -> StepAlloc {
        StepAlloc { bytes, kept: true }
    }
    fn passing(bytes: u64) -> StepAlloc {
        StepAlloc { bytes, kept: false }
    }

    #[test]
    fn a_buffer_larger_than_every_cached_block_takes_a_segment_of_its_own() {
        // Activations cached in a block of 1; a step buffer of 3: a new segment of 3.
        assert_eq!(new_segment_bytes(&[1], &[kept(3)]), 3);
        // The same buffer where a block of 4 is cached: served from it.
        assert_eq!(new_segment_bytes(&[4], &[kept(3)]), 0);
        // Nothing to allocate: nothing new.
        assert_eq!(new_segment_bytes(&[1], &[]), 0);
    }

    #[test]
    fn freed_segments_serve_the_requests_after_them() {
        // A passing copy of 4 then one of 8 (each freed before the next): two new segments
        // (the 4 cannot hold the 8). Then flat copies of 2 and 4, both kept: the 2 goes to the
        // best fit (the 4-segment, leaving 2), the 4 to the 8-segment. 12 new bytes in all.
        let allocs = [passing(4), passing(8), kept(2), kept(4)];
        assert_eq!(new_segment_bytes(&[1], &allocs), 12);
        // Kept copies of 3 and 3 in a cached 4: the second no longer fits there.
        assert_eq!(new_segment_bytes(&[4], &[kept(3), kept(3)]), 3);
    }

    #[test]
    fn the_reserve_stops_at_the_device_memory() {
        // Backward at 10 with 5 more in new segments, 12 allocated at most: 3 cached.
        assert_eq!(cache_bytes(10, 5, 12, 100), 3);
        // On a device of 14 the allocator returns cached segments: 2.
        assert_eq!(cache_bytes(10, 5, 12, 14), 2);
        // A step above the backward and its segments: nothing beyond the allocated peak.
        assert_eq!(cache_bytes(10, 1, 12, 100), 0);
    }
}
