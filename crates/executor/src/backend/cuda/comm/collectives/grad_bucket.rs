//! ZeRO 0/1 gradient buckets reduced during the last microbatch's backward (Megatron-Core's
//! DDP with `overlap_grad_reduce`). Over NCCL a bucket is queued on the rank's gradient
//! stream after the compute queued so far, and the compute stream does not wait for it: the
//! optimizer step does ([`CudaComm::join_step`]). ZeRO 0 all-reduces the bucket in place;
//! ZeRO 1 reduces each member's piece of it (the bucket inside that member's flat shard) onto
//! that member, one in-place `ncclReduce` per piece in one NCCL group, so no metadata meets
//! on the host and nothing blocks it. Between ranks sharing a GPU the reduction meets the
//! peers on the host and runs in place, as every shared-GPU collective does.

use super::{overlapped, CudaComm, CudaGroup, Transport};
use crate::backend::cuda::device::context::drv;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::{flat_shard, overlap, DeviceTensor, ReduceOp};
use std::ops::Range;

/// The pieces of `bucket` (a range of a flat buffer of `total` elements) held by each of
/// `size` members' [`flat_shard`]s: (member, range), in member order, empty pieces left out.
pub fn bucket_pieces(
    total: usize,
    size: usize,
    bucket: &Range<usize>,
) -> Vec<(usize, Range<usize>)> {
    (0..size)
        .map(|i| (i, overlap(&flat_shard(total, size, i), bucket)))
        .filter(|(_, r)| !r.is_empty())
        .collect()
}

impl CudaComm {
    /// See [`crate::backend::DeviceCollectives::reduce_grad_bucket`].
    pub(super) fn grad_bucket(
        &self,
        g: &CudaGroup,
        grads: &CudaTensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), CudaError> {
        if bucket.is_empty() || g.transport == Transport::Solo {
            return Ok(());
        }
        let dt = grads.dtype();
        if !overlapped(g.transport) {
            return self.grad_bucket_in_place(g, grads, bucket, sharded);
        }
        let nccl = self.nccl_of(g)?;
        let es = dt.size_bytes();
        let pieces: Vec<(usize, u64, usize)> = if sharded {
            bucket_pieces(grads.len(), g.members.len(), &bucket)
                .into_iter()
                .map(|(m, r)| (m, grads.ptr_at(r.start), r.len()))
                .collect()
        } else {
            Vec::new()
        };
        let base = grads.ptr_at(bucket.start);
        debug_assert_eq!(base + bucket.len() as u64 * es, grads.ptr_at(bucket.end));
        let grad = self.grad.clone();
        // The gradient buffer lives for the run and is written again only after the
        // optimizer step has joined: no fence.
        let done = self.on_stream_async(&grad, &[], |s| {
            if sharded {
                nccl.reduce_to_roots(&pieces, dt, s.cu_stream())
            } else {
                nccl.all_reduce(base, base, bucket.len(), dt, ReduceOp::Sum, s.cu_stream())
            }
        })?;
        self.joins.push_step(done);
        Ok(())
    }

    /// A bucket among ranks sharing a GPU: in order on the collective stream, as the
    /// shared-GPU collectives run (ZeRO 1: the sum of this member's piece staged, then copied
    /// back over it).
    fn grad_bucket_in_place(
        &self,
        g: &CudaGroup,
        grads: &CudaTensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), CudaError> {
        let dt = grads.dtype();
        let base = grads.ptr_at(bucket.start);
        if !sharded {
            return self.all_reduce_raw(g, base, bucket.len(), dt, ReduceOp::Sum);
        }
        let shard = flat_shard(grads.len(), g.members.len(), g.index);
        let kept = overlap(&shard, &bucket);
        let out = self.stage(dt, kept.len(), Some(&self.compute))?;
        let dst = out.ptr_at(0);
        self.reduce_range_raw(g, bucket, base, dt, kept.clone(), dst, dt, None)?;
        let c = self.compute.clone();
        self.dtod(&c, grads.ptr_at(kept.start), dst, kept.len(), dt)
    }

    /// Makes the compute stream wait for every gradient bucket issued (the optimizer step).
    pub(super) fn join_step(&self) -> Result<(), CudaError> {
        for e in self.joins.drain_step() {
            self.compute.wait(&e).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_pieces_split_a_bucket_at_the_shard_boundaries() {
        // 10 elements over 3 members: shards 0..4, 4..8, 8..10.
        assert_eq!(
            bucket_pieces(10, 3, &(2..9)),
            vec![(0, 2..4), (1, 4..8), (2, 8..9)]
        );
        // Inside one shard: one piece, on its holder.
        assert_eq!(bucket_pieces(10, 3, &(5..7)), vec![(1, 5..7)]);
        // 2 elements over 4 members: shards of 1, the last two empty, never a piece.
        assert_eq!(bucket_pieces(2, 4, &(0..2)), vec![(0, 0..1), (1, 1..2)]);
    }

    #[test]
    fn bucket_pieces_of_consecutive_buckets_tile_the_buffer_once() {
        // Every element of the buffer lies in exactly one piece of exactly one bucket, held
        // by the member whose shard contains it.
        let (total, size) = (1003, 4);
        let cuts = [0, 17, 250, 251, 700, 1003];
        let mut seen = vec![0u32; total];
        for w in cuts.windows(2) {
            for (m, r) in bucket_pieces(total, size, &(w[0]..w[1])) {
                assert!(r.start >= w[0] && r.end <= w[1]);
                let s = flat_shard(total, size, m);
                assert!(r.start >= s.start && r.end <= s.end, "{r:?} outside {s:?}");
                for i in r {
                    seen[i] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
    }
}
