//! The caching pool of device memory: requests rounded up to a size class, freed blocks kept
//! for reuse (as PyTorch's CUDA caching allocator does, without block splitting), the cache
//! emptied and the allocation retried once when the device is out of memory. It counts what
//! it holds from the device (reserved) and its peak; the categories of each tensor are counted
//! by the rank's `MemoryTracker` with the block size as the reserved figure. The bookkeeping
//! is generic over [`RawDevice`] so that it is unit-tested without a GPU.

use crate::backend::cuda::diag::error::CudaError;
use std::collections::BTreeMap;

/// Requests up to 1 MiB are rounded to 512 bytes, larger ones to 2 MiB (the granularity the
/// driver maps large allocations with).
const SMALL_ROUND_BYTES: u64 = 512;
const LARGE_THRESHOLD_BYTES: u64 = 1 << 20;
const LARGE_ROUND_BYTES: u64 = 2 << 20;
/// A cached block serves a request up to this factor smaller (beyond, it would waste more
/// than it saves).
const MAX_REUSE_RATIO: u64 = 2;

/// Device memory as the driver hands it out.
pub trait RawDevice {
    /// `bytes` of device memory (`cuMemAlloc`); `Ok(None)` when the device is out of memory.
    fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, CudaError>;
    /// Returns a block from [`RawDevice::malloc`] (`cuMemFree`).
    fn free(&mut self, ptr: u64) -> Result<(), CudaError>;
}

/// A block of device memory lent by the pool.
#[derive(Debug, PartialEq, Eq)]
pub struct Block {
    pub ptr: u64,
    pub size_bytes: u64,
}

/// The pool's own totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes held from the device (lent plus cached).
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Bytes lent to tensors (block sizes).
    pub lent_bytes: u64,
    /// Device allocations made, and cached blocks reused.
    pub device_allocs: u64,
    pub reuses: u64,
}

/// Why a block could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(
        "out of GPU memory: {requested_bytes} bytes requested with {reserved_bytes} bytes \
         already reserved by this rank (cache emptied and retried)"
    )]
    OutOfMemory {
        requested_bytes: u64,
        reserved_bytes: u64,
    },
}

/// Whether the work of other streams on a released block is done (a CUDA event query).
pub type Fence = Box<dyn FnMut() -> Result<bool, CudaError> + Send>;

/// The caching pool over a raw device allocator.
pub struct Pool<R: RawDevice> {
    raw: R,
    /// Cached blocks by size.
    cached: BTreeMap<u64, Vec<u64>>,
    /// Released blocks another stream may still use, with the fence that says when it no
    /// longer does (PyTorch's `record_stream`): reused only after the fence passes.
    fenced: Vec<(Block, Fence)>,
    stats: PoolStats,
}

impl<R: RawDevice + std::fmt::Debug> std::fmt::Debug for Pool<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("raw", &self.raw)
            .field("cached", &self.cached)
            .field("fenced", &self.fenced.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// The size class of a request of `bytes` (zero-byte requests get the smallest block so that
/// every tensor has a distinct address).
pub fn round_bytes(bytes: u64) -> u64 {
    let unit = if bytes > LARGE_THRESHOLD_BYTES {
        LARGE_ROUND_BYTES
    } else {
        SMALL_ROUND_BYTES
    };
    bytes.max(1).div_ceil(unit) * unit
}

impl<R: RawDevice> Pool<R> {
    pub fn new(raw: R) -> Self {
        Pool {
            raw,
            cached: BTreeMap::new(),
            fenced: Vec::new(),
            stats: PoolStats::default(),
        }
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// A block of at least `bytes`: the smallest cached one that fits without wasting more
    /// than half, else a new device allocation (after emptying the cache when the device is
    /// full).
    pub fn alloc(&mut self, bytes: u64) -> Result<Block, PoolError> {
        self.reclaim()?;
        let size = round_bytes(bytes);
        let hit = self
            .cached
            .range(size..=size.saturating_mul(MAX_REUSE_RATIO))
            .next()
            .map(|(&s, _)| s);
        if let Some(s) = hit {
            let list = self.cached.get_mut(&s).expect("size listed");
            let ptr = list.pop().expect("non-empty list");
            if list.is_empty() {
                self.cached.remove(&s);
            }
            self.stats.reuses += 1;
            self.stats.lent_bytes += s;
            return Ok(Block { ptr, size_bytes: s });
        }
        let ptr = match self.raw.malloc(size)? {
            Some(p) => p,
            None => {
                self.empty_cache()?;
                self.raw.malloc(size)?.ok_or(PoolError::OutOfMemory {
                    requested_bytes: bytes,
                    reserved_bytes: self.stats.reserved_bytes,
                })?
            }
        };
        self.stats.device_allocs += 1;
        self.stats.reserved_bytes += size;
        self.stats.peak_reserved_bytes = self
            .stats
            .peak_reserved_bytes
            .max(self.stats.reserved_bytes);
        self.stats.lent_bytes += size;
        Ok(Block {
            ptr,
            size_bytes: size,
        })
    }

    /// Takes a block back into the cache (the caller has ordered every stream that used it
    /// before its next use: the backend frees on the compute stream's order).
    pub fn release(&mut self, b: Block) {
        self.stats.lent_bytes -= b.size_bytes;
        self.cached.entry(b.size_bytes).or_default().push(b.ptr);
    }

    /// Takes a block back once `fence` passes: the collective stream may still read it (a
    /// gradient bucket being reduce-scattered while backward goes on).
    pub fn release_when(&mut self, b: Block, fence: Fence) {
        self.fenced.push((b, fence));
    }

    /// Moves the fenced blocks whose fence has passed into the cache.
    pub fn reclaim(&mut self) -> Result<(), CudaError> {
        let mut i = 0;
        while i < self.fenced.len() {
            if (self.fenced[i].1)()? {
                let (b, _) = self.fenced.swap_remove(i);
                self.release(b);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Blocks released but still fenced.
    pub fn fenced_blocks(&self) -> usize {
        self.fenced.len()
    }

    /// Returns every block the pool holds to the device, the fenced ones too: the pool goes
    /// away with its last tensor, so nothing can use them any more.
    fn release_all(&mut self) -> Result<(), CudaError> {
        for (b, _) in std::mem::take(&mut self.fenced) {
            self.release(b);
        }
        self.empty_cache()
    }

    /// Returns every cached block to the device; a failed free is reported after the others
    /// were tried (the first error).
    pub fn empty_cache(&mut self) -> Result<(), CudaError> {
        let mut first = None;
        for (size, ptrs) in std::mem::take(&mut self.cached) {
            for p in ptrs {
                match self.raw.free(p) {
                    Ok(()) => self.stats.reserved_bytes -= size,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The raw allocator, e.g. to read its device's figures.
    pub fn raw(&self) -> &R {
        &self.raw
    }
}

/// Without this, every block a run's pool cached stayed allocated when the run ended: a
/// calibration sweep (many runs in one process) ran out of GPU memory at its second point.
impl<R: RawDevice> Drop for Pool<R> {
    fn drop(&mut self) {
        if let Err(e) = self.release_all() {
            eprintln!("warning: device blocks could not be freed when a run ended: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `capacity` bytes handing out increasing addresses.
    #[derive(Debug, Default)]
    struct Fake {
        capacity: u64,
        used: u64,
        next: u64,
        live: BTreeMap<u64, u64>,
    }

    impl RawDevice for Fake {
        fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, CudaError> {
            if self.used + bytes > self.capacity {
                return Ok(None);
            }
            self.next += bytes.max(1) + 4096;
            self.used += bytes;
            self.live.insert(self.next, bytes);
            Ok(Some(self.next))
        }
        fn free(&mut self, ptr: u64) -> Result<(), CudaError> {
            let b = self
                .live
                .remove(&ptr)
                .expect("freed twice or never allocated");
            self.used -= b;
            Ok(())
        }
    }

    fn fake(capacity: u64) -> Pool<Fake> {
        Pool::new(Fake {
            capacity,
            ..Fake::default()
        })
    }

    /// Dropping the pool (its last tensor gone) hands every cached and fenced block back.
    #[test]
    fn release_all_returns_cached_and_fenced_blocks_to_the_device() {
        let mut p = fake(1 << 30);
        let a = p.alloc(1 << 20).expect("alloc");
        let b = p.alloc(3 << 20).expect("alloc");
        let c = p.alloc(5000).expect("alloc");
        p.release(a);
        p.release_when(b, Box::new(|| Ok(false)));
        assert!(p.raw.used > 0);
        p.release(c);
        assert!(p.release_all().is_ok());
        assert_eq!(p.raw.used, 0, "{:?}", p.raw.live);
        assert!(p.raw.live.is_empty());
        assert_eq!(p.stats().reserved_bytes, 0);
    }

    #[test]
    fn sizes_round_up_to_their_class() {
        assert_eq!(round_bytes(0), 512);
        assert_eq!(round_bytes(1), 512);
        assert_eq!(round_bytes(512), 512);
        assert_eq!(round_bytes(513), 1024);
        assert_eq!(round_bytes(1 << 20), 1 << 20);
        assert_eq!(round_bytes((1 << 20) + 1), 2 << 20);
        assert_eq!(round_bytes((5 << 20) + 3), 6 << 20);
    }

    #[test]
    fn freed_blocks_are_reused_and_reserved_is_what_the_device_holds() {
        let mut p = fake(1 << 30);
        let a = p.alloc(1000).unwrap();
        let b = p.alloc(3 << 20).unwrap();
        assert_eq!(p.stats().reserved_bytes, 1024 + (4 << 20));
        assert_eq!(p.stats().reserved_bytes, p.raw().used);
        let a_ptr = a.ptr;
        p.release(a);
        // A request of the same class gets the cached block back: no new device memory.
        let c = p.alloc(900).unwrap();
        assert_eq!(c.ptr, a_ptr);
        assert_eq!(p.stats().device_allocs, 2);
        assert_eq!(p.stats().reuses, 1);
        // A block more than twice the request is not reused.
        p.release(b);
        let d = p.alloc(1 << 20).unwrap();
        assert_eq!(p.stats().device_allocs, 3);
        assert_eq!(p.stats().lent_bytes, 1024 + (1 << 20));
        p.release(c);
        p.release(d);
        assert_eq!(p.stats().lent_bytes, 0);
        assert_eq!(p.stats().peak_reserved_bytes, 1024 + (5 << 20));
        p.empty_cache().unwrap();
        assert_eq!(p.stats().reserved_bytes, 0);
        assert_eq!(p.raw().used, 0);
    }

    #[test]
    fn a_fenced_block_is_reused_only_after_its_fence_passes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let mut p = fake(1 << 30);
        let a = p.alloc(1000).unwrap();
        let a_ptr = a.ptr;
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        p.release_when(a, Box::new(move || Ok(d.load(Ordering::SeqCst))));
        // The other stream still reads it: a request of the same class gets new memory.
        let b = p.alloc(900).unwrap();
        assert_ne!(b.ptr, a_ptr);
        assert_eq!(p.fenced_blocks(), 1);
        assert_eq!(p.stats().lent_bytes, 2 * 1024);
        // Once the fence passes, the block is cached and handed out again.
        done.store(true, Ordering::SeqCst);
        let c = p.alloc(800).unwrap();
        assert_eq!(c.ptr, a_ptr);
        assert_eq!(p.fenced_blocks(), 0);
        assert_eq!(p.stats().device_allocs, 2);
        p.release(b);
        p.release(c);
        assert_eq!(p.stats().lent_bytes, 0);
    }

    #[test]
    fn a_full_device_empties_the_cache_and_retries_then_names_the_request() {
        let mut p = fake(7 << 20);
        let a = p.alloc(6 << 20).unwrap();
        p.release(a);
        // 1.5 MiB (class 2 MiB) does not fit beside the cached 6 MiB block, which is more
        // than twice the class and so not reused: the cache is emptied and the call retried.
        let b = p.alloc(3 << 19).unwrap();
        assert_eq!(b.size_bytes, 2 << 20);
        assert_eq!(p.stats().reserved_bytes, 2 << 20);
        assert_eq!(p.raw().used, 2 << 20);
        let e = p.alloc(6 << 20).unwrap_err();
        assert!(matches!(
            e,
            PoolError::OutOfMemory {
                requested_bytes,
                reserved_bytes
            } if requested_bytes == 6 << 20 && reserved_bytes == 2 << 20
        ));
        assert!(e.to_string().contains("6291456 bytes requested"), "{e}");
        p.release(b);
    }
}
