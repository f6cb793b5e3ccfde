//! Collectives on device tensors ([`DeviceCollectives`]), the point-to-point exchange they
//! post ([`SendFrom`], [`RecvInto`], [`Pending`]) and ZeRO's flat sharding ([`flat_shard`]).

use super::tensor::{View, ViewMut};
use super::types::BackendTypes;
use crate::error::{CollectiveError, ExecError};
use std::ops::Range;

/// Reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Collectives on device tensors, with NCCL's semantics within a group (see the CPU's
/// host-slice [`Collectives`](super::cpu::Collectives) for each one's contract), plus
/// point-to-point messages.
pub trait DeviceCollectives<B: BackendTypes> {
    /// Seconds this rank has spent blocked waiting for its peers so far (a collective's
    /// members to arrive, a message to come), where the backend can tell; op profiling keeps
    /// it apart from the collectives' own time. Zero where it cannot (the CUDA backend: NCCL
    /// waits inside its kernels).
    fn blocked_s(&self) -> f64 {
        0.0
    }
    /// This rank's handle on the group of `members` (global ranks, in member order).
    fn group(&self, members: &[u32]) -> Result<B::Group, ExecError>;
    /// In-place reduce-scatter of a flat buffer held whole by every member: afterwards
    /// `buf[mine]` is the sum over members of their `buf[mine]` (ZeRO-1's gradient step).
    fn reduce_scatter_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError>;
    /// In-place all-gather of a flat buffer whose shard `mine` is this member's: afterwards
    /// every member holds every member's shard (the updated parameters of ZeRO 1/2).
    fn all_gather_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError>;
    fn all_reduce(
        &self,
        g: &B::Group,
        buf: ViewMut<'_, B::Tensor>,
        op: ReduceOp,
    ) -> Result<(), ExecError>;
    fn all_gather(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    fn reduce_scatter(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    fn all_to_all(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// All-to-all of host counts (split sizes of a following [`DeviceCollectives::all_to_all_v`]):
    /// `send` holds `send.len() / size` counts per member; returns what each member sent this
    /// one, in member order.
    fn all_to_all_counts(&self, g: &B::Group, send: &[usize]) -> Result<Vec<usize>, ExecError>;
    /// See [`Collectives::all_to_all_v`](super::cpu::Collectives::all_to_all_v) (counts in elements).
    fn all_to_all_v(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        send_counts: &[usize],
        out: ViewMut<'_, B::Tensor>,
        recv_counts: &[usize],
    ) -> Result<(), ExecError>;
    fn send(&self, to: u32, tag: u64, data: View<'_, B::Tensor>) -> Result<(), ExecError>;
    fn recv(&self, from: u32, tag: u64, out: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;
    /// Posts point-to-point `sends` and `recvs` as one exchange without waiting for the
    /// receives (TransformerEngine's ring attention posts step i+1's exchange before it
    /// computes step i): the data of `sends` is taken at the call; the receive buffers move
    /// into the returned [`Pending`] and come back, holding their messages, from
    /// [`DeviceCollectives::wait`].
    fn p2p_start(
        &self,
        sends: &[SendFrom<'_, B::Tensor>],
        recvs: Vec<RecvInto<B::Tensor>>,
    ) -> Result<Pending<B>, ExecError>;
    /// Completes a [`DeviceCollectives::p2p_start`]: the receive buffers in posting order;
    /// the device's next work sees their messages (CPU: the receives happen here; CUDA: the
    /// compute stream waits for the exchange's event).
    fn wait(&self, p: Pending<B>) -> Result<Vec<B::Tensor>, ExecError>;
    /// See [`Collectives::gather_range`](super::cpu::Collectives::gather_range).
    fn gather_range(
        &self,
        g: &B::Group,
        mine_lo: usize,
        mine: View<'_, B::Tensor>,
        want: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// See [`Collectives::reduce_scatter_range`](super::cpu::Collectives::reduce_scatter_range).
    fn reduce_scatter_range(
        &self,
        g: &B::Group,
        input_lo: usize,
        input: View<'_, B::Tensor>,
        mine: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// A data-parallel gradient bucket reduced during backward (Megatron-Core's
    /// `overlap_grad_reduce`): elements `bucket` of `grads`, a flat buffer held whole by every
    /// member (all passing the same range), become the sum over members, all of them (ZeRO
    /// 0's all-reduce) or, `sharded`, those inside this member's [`flat_shard`] (ZeRO 1's
    /// reduce-scatter; the others keep this member's values). A device may run it after the
    /// call returns, overlapped with the work that follows: its result is there after
    /// [`DeviceCollectives::join_grad_buckets`], and nothing may write `bucket` before.
    fn reduce_grad_bucket(
        &self,
        g: &B::Group,
        grads: &mut B::Tensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), ExecError>;
    /// Makes the device's next work wait for every gradient bucket issued so far (the
    /// optimizer step; the CPU's reductions are done at the call).
    fn join_grad_buckets(&self) -> Result<(), ExecError>;
}

/// Member `index`'s shard of a flat buffer of `total` elements split over `size` members:
/// contiguous ranges of ceil(total / size) elements, the last ones shorter or empty (ZeRO's
/// sharding of the parameter, gradient and optimizer buffers, as Megatron's distributed
/// optimizer does).
pub fn flat_shard(total: usize, size: usize, index: usize) -> Range<usize> {
    let per = total.div_ceil(size.max(1));
    (index * per).min(total)..((index + 1) * per).min(total)
}

/// `rank`'s index among a group's `members` (in the order given), or an error naming both:
/// every backend's check that a rank asks only for groups it belongs to.
pub fn member_index(rank: u32, members: &[u32]) -> Result<usize, ExecError> {
    members
        .iter()
        .position(|&m| m == rank)
        .ok_or_else(|| ExecError::Collective {
            op: "group",
            reason: CollectiveError::NotAMember {
                rank,
                members: members.to_vec(),
            },
        })
}

/// The elements two flat ranges share; empty, at the later start, where they do not meet (a
/// gradient bucket's piece inside a member's [`flat_shard`]).
pub fn overlap(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
    let lo = a.start.max(b.start);
    lo..a.end.min(b.end).max(lo)
}

/// One send of a [`DeviceCollectives::p2p_start`]: `data` to global rank `to` as message `tag`.
pub struct SendFrom<'a, T> {
    pub to: u32,
    pub tag: u64,
    pub data: View<'a, T>,
}

/// One receive of a [`DeviceCollectives::p2p_start`]: message `tag` from global rank `from`
/// into the whole of `buf`.
pub struct RecvInto<T> {
    pub from: u32,
    pub tag: u64,
    pub buf: T,
}

/// A posted point-to-point exchange: it owns its receive buffers until
/// [`DeviceCollectives::wait`] hands them back, so nothing reads them before their data
/// lands (on CUDA a dropped one frees them only after the exchange's event).
pub struct Pending<B: BackendTypes> {
    pub recvs: Vec<RecvInto<B::Tensor>>,
    /// The backend's mark of the exchange's end (CUDA: an event on the collective stream
    /// after the grouped NCCL send/recv); `None` where the receives happen at the wait.
    pub done: Option<std::sync::Arc<B::Event>>,
    /// When the exchange was posted, on the trace clock (set by the recording layer, so
    /// that a receive's span runs from its post to its wait).
    pub posted_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_shards_of_ceil_size_tile_the_buffer_and_overlap_cuts_a_bucket_at_their_bounds() {
        // 10 elements over 3 members: ceil(10 / 3) = 4, so 0..4, 4..8, 8..10.
        let shards: Vec<_> = (0..3).map(|i| flat_shard(10, 3, i)).collect();
        assert_eq!(shards, vec![0..4, 4..8, 8..10]);
        // Bucket 2..9 meets each shard in the part both contain.
        let pieces: Vec<_> = shards.iter().map(|s| overlap(s, &(2..9))).collect();
        assert_eq!(pieces, vec![2..4, 4..8, 8..9]);
        // Disjoint ranges share nothing, in either order, and the result is never reversed.
        assert_eq!(overlap(&(0..4), &(6..9)), 6..6);
        assert_eq!(overlap(&(6..9), &(0..4)), 6..6);
    }

    #[test]
    fn a_rank_outside_a_group_has_no_index_and_the_error_names_both() {
        assert_eq!(member_index(5, &[1, 5, 9]).unwrap(), 1);
        let e = member_index(2, &[1, 5]).unwrap_err().to_string();
        assert_eq!(e, "group: rank 2 is not a member of group [1, 5]");
    }
}
