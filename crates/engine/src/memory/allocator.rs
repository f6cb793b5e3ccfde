//! PyTorch's caching allocator: what it keeps reserved beyond the allocated peak, the figure
//! `torch.cuda.max_memory_reserved()` and nvidia-smi show.
//!
//! From c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch): a freed block stays cached in its
//! segment; a request is served by the smallest cached block at least as large (`get_free_block`,
//! splitting a large block), and only when none is large enough does the allocator take a new
//! segment from the driver (`alloc_block`); segments are never merged, and cached blocks are
//! returned to the driver only when that fails (`release_cached_blocks`). Requests are rounded
//! up to 512 bytes, and those over 10 MiB to a multiple of 2 MiB (`round_size`,
//! `get_allocation_size`), which for the buffers here is well under a percent.
//!
//! The pattern this models: once the backward is done its activation blocks are free but
//! cached, and an optimizer step that allocates a flat buffer larger than every one of them
//! (DeepSpeed's flat gradient copies) takes a new segment beside them, so the reserve peaks at
//! the activations' peak plus that buffer while the allocated peak is the larger of the two.
//! Steps whose buffers fit in the cached blocks (or a framework whose step allocates nothing
//! large, as Megatron-Core's in-place step on its grad buffer) reserve no more than they
//! allocate.

/// The bytes reserved beyond the allocated peak of a rank whose memory outside the walk is
/// `resident`, whose activations and phase buffers peak at `walk_peak`, and whose optimizer
/// step allocates `step` bytes, `step_largest` of them in one buffer, after the backward freed
/// blocks of at most `largest_cached` bytes each.
pub fn step_reserve(walk_peak: u64, step: u64, step_largest: u64, largest_cached: u64) -> u64 {
    let allocated = walk_peak.max(step);
    let reserved = if step_largest > largest_cached {
        // The largest buffer takes a new segment; the rest reuses cached blocks as far as the
        // walk's peak left them.
        walk_peak.max(step - step_largest) + step_largest
    } else {
        allocated
    };
    reserved - allocated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_buffer_larger_than_every_cached_block_sits_beside_them() {
        // 10 GB of activations cached in blocks of at most 1 GB; a step of 3 GB in one buffer:
        // allocated peak 10, reserved 13.
        assert_eq!(step_reserve(10, 3, 3, 1), 3);
        // The same step in buffers the cache can serve: nothing beyond the allocated peak.
        assert_eq!(step_reserve(10, 3, 3, 4), 0);
        // A step larger than the walk: of its 12, the 8 outside its largest buffer reuse the
        // cache, the largest (4) is new: reserved 10 + 4 = 14 against 12 allocated.
        assert_eq!(step_reserve(10, 12, 4, 1), 2);
        // No step buffers: nothing.
        assert_eq!(step_reserve(10, 0, 0, 1), 0);
    }
}
