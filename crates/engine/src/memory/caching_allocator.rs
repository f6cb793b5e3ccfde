//! PyTorch's CUDA caching allocator, block by block, as of the releases without expandable
//! segments (c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch, `DeviceCachingAllocator`):
//! - a request is rounded up to 512 bytes (`round_size`, `kMinBlockSize`);
//! - requests of at most 1 MiB (`kSmallSize`) come from the small pool, larger ones from the
//!   large pool; each pool serves a request from its smallest free block at least as large,
//!   the lowest address first among equals (`get_free_block`, `BlockComparatorSize`);
//! - when no free block fits, a new segment comes from the driver (`alloc_block`) of
//!   `get_allocation_size`: 2 MiB (`kSmallBuffer`) for a small request, 20 MiB
//!   (`kLargeBuffer`) for one under 10 MiB (`kMinLargeAlloc`), else the request rounded up to
//!   2 MiB (`kRoundLarge`);
//! - a block larger than the request is split when what remains is at least 512 bytes (small
//!   pool) or more than 1 MiB (large pool) (`should_split`, without `max_split_size`), else
//!   the request takes the whole block;
//! - a freed block merges with its free neighbours of the same segment (`free_block`,
//!   `try_merge_blocks`); segments are never merged with each other, and stay reserved
//!   (nothing here calls `empty_cache`).
//!
//! What it gives: the reserved bytes (`torch.cuda.memory_reserved`, what nvidia-smi shows
//! beside the CUDA context) of an allocation sequence, against its allocated bytes.

use std::collections::{BTreeMap, BTreeSet};

/// Every request is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_BYTES: u64 = 512;
/// The largest request of the small pool (`kSmallSize`).
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// The segment of the small pool (`kSmallBuffer`).
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// The segment a large request under [`MIN_LARGE_ALLOC_BYTES`] takes (`kLargeBuffer`).
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;
/// Large requests from this size on take a segment of their own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// Such segments are rounded up to a multiple of this (`kRoundLarge`).
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

/// The block size a request of `bytes` takes (`round_size`).
pub fn round_size(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
}

/// The segment the driver gives when no cached block holds a request of `rounded` bytes
/// (`get_allocation_size`).
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE_BYTES {
        SMALL_BUFFER_BYTES
    } else if rounded < MIN_LARGE_ALLOC_BYTES {
        LARGE_BUFFER_BYTES
    } else {
        rounded.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    allocated: bool,
    small: bool,
}

/// The allocator's state: blocks by address, the free ones by (size, address) per pool.
#[derive(Debug, Default, Clone)]
pub struct CachingAllocator {
    blocks: BTreeMap<u64, Block>,
    /// Free blocks of the large pool (index 0) and the small pool (index 1).
    free: [BTreeSet<(u64, u64)>; 2],
    next_segment: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
}

impl CachingAllocator {
    pub fn new() -> CachingAllocator {
        CachingAllocator::default()
    }

    /// Allocates `bytes` (`malloc`); returns the block's address, for [`Self::free`].
    pub fn malloc(&mut self, bytes: u64) -> u64 {
        let size = round_size(bytes);
        let small = size <= SMALL_SIZE_BYTES;
        let pool = usize::from(small);
        let found = self.free[pool].range((size, 0)..).next().copied();
        let (block_size, addr) = match found {
            Some(f) => {
                self.free[pool].remove(&f);
                f
            }
            None => {
                let seg = segment_size(size);
                // Segments sit apart (a gap between them), so address neighbours always
                // share a segment.
                let addr = self.next_segment;
                self.next_segment += seg + MIN_BLOCK_BYTES;
                self.reserved_bytes += seg;
                self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
                (seg, addr)
            }
        };
        let remaining = block_size - size;
        let split = if small {
            remaining >= MIN_BLOCK_BYTES
        } else {
            remaining > SMALL_SIZE_BYTES
        };
        let taken = if split {
            self.blocks.insert(
                addr + size,
                Block {
                    size: remaining,
                    allocated: false,
                    small,
                },
            );
            self.free[pool].insert((remaining, addr + size));
            size
        } else {
            block_size
        };
        self.blocks.insert(
            addr,
            Block {
                size: taken,
                allocated: true,
                small,
            },
        );
        self.allocated_bytes += taken;
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(self.allocated_bytes);
        addr
    }

    /// Frees the block at `addr`, merging it with its free neighbours (`free_block`).
    /// An address that holds no allocated block is left alone.
    pub fn free(&mut self, addr: u64) {
        let Some(mut b) = self.blocks.get(&addr).copied().filter(|b| b.allocated) else {
            return;
        };
        self.allocated_bytes -= b.size;
        let pool = usize::from(b.small);
        let mut start = addr;
        if let Some(next) = self.blocks.get(&(addr + b.size)).copied() {
            if !next.allocated {
                self.free[pool].remove(&(next.size, addr + b.size));
                self.blocks.remove(&(addr + b.size));
                b.size += next.size;
            }
        }
        if let Some((&prev_addr, &prev)) = self.blocks.range(..addr).next_back() {
            if !prev.allocated && prev_addr + prev.size == addr {
                self.free[pool].remove(&(prev.size, prev_addr));
                self.blocks.remove(&addr);
                start = prev_addr;
                b.size += prev.size;
            }
        }
        b.allocated = false;
        self.blocks.insert(start, b);
        self.free[pool].insert((b.size, start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_round_as_torch_rounds_them() {
        // round_size: 512-byte multiples; get_allocation_size: 2 MiB, 20 MiB, or 2 MiB steps.
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(round_size(1000)), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(10 * MIB + 512), 12 * MIB);
    }

    /// A sequence traced by hand through the rules above.
    #[test]
    fn a_hand_traced_sequence() {
        let mut a = CachingAllocator::new();
        // 5 MiB: a 20 MiB segment, split (15 MiB left > 1 MiB).
        let x = a.malloc(5 * MIB);
        assert_eq!((a.reserved_bytes, a.allocated_bytes), (20 * MIB, 5 * MIB));
        // 14 MiB: the 15 MiB remainder is the smallest that fits; 1 MiB left is not more than
        // 1 MiB, so the request takes all 15 MiB.
        let y = a.malloc(14 * MIB);
        assert_eq!((a.reserved_bytes, a.allocated_bytes), (20 * MIB, 20 * MIB));
        // 100 bytes: the small pool's own 2 MiB segment.
        let z = a.malloc(100);
        assert_eq!(a.reserved_bytes, 22 * MIB);
        assert_eq!(a.allocated_bytes, 20 * MIB + 512);
        // Free the 5 MiB block: cached; a 6 MiB request does not fit it: a new 20 MiB segment.
        a.free(x);
        let w = a.malloc(6 * MIB);
        assert_eq!(a.reserved_bytes, 42 * MIB);
        // Free the 15 MiB block: it merges with the free 5 MiB before it (20 MiB again), which
        // now serves a 20 MiB request without a new segment.
        a.free(y);
        let v = a.malloc(20 * MIB);
        assert_eq!(a.reserved_bytes, 42 * MIB);
        assert_eq!(a.allocated_bytes, 512 + 6 * MIB + 20 * MIB);
        // 12 MiB fits the 14 MiB left of the second segment (split: 2 MiB remain); 16 MiB then
        // fits no free block: a segment of its own, 16 MiB (a 2 MiB multiple from 10 MiB on).
        let t = a.malloc(12 * MIB);
        assert_eq!(a.reserved_bytes, 42 * MIB);
        let u = a.malloc(16 * MIB);
        assert_eq!(a.reserved_bytes, 58 * MIB);
        // Free everything: reserved stays, allocated drops to zero.
        for b in [z, w, v, t, u] {
            a.free(b);
        }
        assert_eq!(a.allocated_bytes, 0);
        assert_eq!(a.reserved_bytes, 58 * MIB);
        assert_eq!(a.peak_reserved_bytes, 58 * MIB);
        // The most allocated at once: everything but x and y, 512 + 6 + 20 + 12 + 16 MiB.
        assert_eq!(a.peak_allocated_bytes, 54 * MIB + 512);
    }

    /// Fragmentation: a long-lived block carved out of a freed segment keeps the rest of it
    /// from serving a request as large as the segment.
    #[test]
    fn a_kept_block_inside_a_freed_segment_forces_a_new_one() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(256 * MIB);
        a.free(big);
        // 224 MiB kept in the 256 MiB segment (32 MiB remain, split off).
        let kept = a.malloc(224 * MIB);
        assert_eq!(a.reserved_bytes, 256 * MIB);
        // The next 256 MiB request cannot use the 32 MiB remainder.
        a.malloc(256 * MIB);
        assert_eq!(a.reserved_bytes, 512 * MIB);
        assert_eq!(a.allocated_bytes, 480 * MIB);
        // Freed, the kept block merges back with its remainder: 256 MiB serve a request again.
        a.free(kept);
        a.malloc(256 * MIB);
        assert_eq!(a.reserved_bytes, 512 * MIB);
    }

    /// Properties over random sequences: allocated never exceeds reserved, each request is
    /// served by at least its rounded size, and freeing everything leaves nothing allocated
    /// and every segment one free block.
    #[test]
    fn random_sequences_keep_the_books() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut draw = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..50 {
            let mut a = CachingAllocator::new();
            let mut live = Vec::new();
            for _ in 0..400 {
                if live.is_empty() || draw(3) > 0 {
                    let scale = 10 + draw(19);
                    let bytes = 1 + draw(1 << scale);
                    let before = a.allocated_bytes;
                    live.push(a.malloc(bytes));
                    assert!(a.allocated_bytes - before >= round_size(bytes));
                } else {
                    let i = draw(live.len() as u64) as usize;
                    a.free(live.swap_remove(i));
                }
                assert!(a.allocated_bytes <= a.reserved_bytes);
            }
            for b in live {
                a.free(b);
            }
            assert_eq!(a.allocated_bytes, 0);
            let free: u64 = a.free.iter().flatten().map(|(s, _)| s).sum();
            assert_eq!(free, a.reserved_bytes);
        }
    }
}
