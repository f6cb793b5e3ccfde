//! The CPU's [`DeviceCollectives`]: the host-slice [`Collectives`] of [`CpuComm`] run on the
//! tensors' storage.

use super::tensor::{dst, src, store, store_all, store_view};
use super::{Collectives, Cpu, CpuComm, Group, Tensor};
use crate::backend::{
    flat_shard, member_index, overlap, DeviceCollectives, Pending, ProcessGroup, RecvInto,
    ReduceOp, SendFrom, View, ViewMut,
};
use crate::error::ExecError;
use std::ops::Range;

/// Runs a host collective from `input`'s elements into `out`'s, then rounds `out` to its
/// dtype: the glue of every collective from one view into another.
fn into_view(
    input: &View<'_, Tensor>,
    mut out: ViewMut<'_, Tensor>,
    run: impl FnOnce(&[f32], &mut [f32]) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    run(src(input), dst(&mut out))?;
    store_view(&mut out);
    Ok(())
}

/// [`into_view`] for a collective that writes `buf` in place.
fn in_view(
    buf: &mut ViewMut<'_, Tensor>,
    run: impl FnOnce(&mut [f32]) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    run(dst(buf))?;
    store_view(buf);
    Ok(())
}

/// Collectives on tensors run the host-slice collectives on their storage; a bf16 result is
/// rounded once, after the fp32 reduction (NCCL's bf16 reductions also round per hop).
impl DeviceCollectives<Cpu> for CpuComm {
    fn blocked_s(&self) -> f64 {
        CpuComm::blocked_s(self)
    }

    fn group(&self, members: &[u32]) -> Result<Group, ExecError> {
        member_index(self.rank, members)?;
        Ok(CpuComm::group(self, members))
    }

    fn reduce_scatter_in_place(
        &self,
        g: &Group,
        buf: &mut Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        // Staging copy of the send side (NCCL's buffers, untracked).
        let all = buf.data().to_vec();
        buf.data_mut()[mine.clone()].fill(0.0);
        Collectives::reduce_scatter_range(
            self,
            g,
            0,
            &all,
            mine.clone(),
            &mut buf.data_mut()[mine.clone()],
        )?;
        store(buf, mine);
        Ok(())
    }

    fn all_gather_in_place(
        &self,
        g: &Group,
        buf: &mut Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        // Staging copy of this member's shard (NCCL's buffers, untracked).
        let shard = buf.data()[mine.clone()].to_vec();
        let total = buf.len();
        Collectives::gather_range(self, g, mine.start, &shard, 0..total, buf.data_mut())?;
        store_all(buf);
        Ok(())
    }

    fn all_reduce(
        &self,
        g: &Group,
        mut buf: ViewMut<'_, Tensor>,
        op: ReduceOp,
    ) -> Result<(), ExecError> {
        in_view(&mut buf, |b| Collectives::all_reduce(self, g, b, op))
    }

    fn all_gather(
        &self,
        g: &Group,
        input: View<'_, Tensor>,
        out: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        into_view(&input, out, |i, o| Collectives::all_gather(self, g, i, o))
    }

    fn reduce_scatter(
        &self,
        g: &Group,
        input: View<'_, Tensor>,
        out: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        into_view(&input, out, |i, o| {
            Collectives::reduce_scatter(self, g, i, o)
        })
    }

    fn all_to_all(
        &self,
        g: &Group,
        input: View<'_, Tensor>,
        out: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        into_view(&input, out, |i, o| Collectives::all_to_all(self, g, i, o))
    }

    fn all_to_all_counts(&self, g: &Group, send: &[usize]) -> Result<Vec<usize>, ExecError> {
        // Counts travel as exact f32 bit patterns.
        let bits: Vec<f32> = send.iter().map(|&x| f32::from_bits(x as u32)).collect();
        let mut got = vec![0.0f32; send.len()];
        Collectives::all_to_all(self, g, &bits, &mut got)?;
        Ok(got.iter().map(|x| x.to_bits() as usize).collect())
    }

    fn all_to_all_v(
        &self,
        g: &Group,
        input: View<'_, Tensor>,
        send_counts: &[usize],
        out: ViewMut<'_, Tensor>,
        recv_counts: &[usize],
    ) -> Result<(), ExecError> {
        into_view(&input, out, |i, o| {
            Collectives::all_to_all_v(self, g, i, send_counts, o, recv_counts)
        })
    }

    fn send(&self, to: u32, tag: u64, data: View<'_, Tensor>) -> Result<(), ExecError> {
        Collectives::send(self, to, tag, src(&data))
    }

    fn recv(&self, from: u32, tag: u64, mut out: ViewMut<'_, Tensor>) -> Result<(), ExecError> {
        in_view(&mut out, |o| Collectives::recv(self, from, tag, o))
    }

    /// The sends are posted to the peers' mailboxes now (a copy, as NCCL's send buffers);
    /// each receive blocks at [`DeviceCollectives::wait`] until its message is there.
    fn p2p_start(
        &self,
        sends: &[SendFrom<'_, Tensor>],
        recvs: Vec<RecvInto<Tensor>>,
    ) -> Result<Pending<Cpu>, ExecError> {
        for s in sends {
            Collectives::send(self, s.to, s.tag, src(&s.data))?;
        }
        Ok(Pending {
            recvs,
            done: None,
            posted_s: None,
        })
    }

    fn wait(&self, p: Pending<Cpu>) -> Result<Vec<Tensor>, ExecError> {
        let mut out = Vec::with_capacity(p.recvs.len());
        for mut r in p.recvs {
            in_view(&mut ViewMut::all(&mut r.buf), |o| {
                Collectives::recv(self, r.from, r.tag, o)
            })?;
            out.push(r.buf);
        }
        Ok(out)
    }

    fn gather_range(
        &self,
        g: &Group,
        mine_lo: usize,
        mine: View<'_, Tensor>,
        want: Range<usize>,
        out: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        into_view(&mine, out, |m, o| {
            Collectives::gather_range(self, g, mine_lo, m, want, o)
        })
    }

    fn reduce_scatter_range(
        &self,
        g: &Group,
        input_lo: usize,
        input: View<'_, Tensor>,
        mine: Range<usize>,
        out: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        into_view(&input, out, |i, o| {
            Collectives::reduce_scatter_range(self, g, input_lo, i, mine, o)
        })
    }

    /// Done at the call: the threads' work is synchronous.
    fn reduce_grad_bucket(
        &self,
        g: &Group,
        grads: &mut Tensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), ExecError> {
        if !sharded {
            let v = ViewMut {
                tensor: grads,
                range: bucket,
            };
            return DeviceCollectives::all_reduce(self, g, v, ReduceOp::Sum);
        }
        let mine = flat_shard(grads.len(), g.size(), g.index());
        // Staging copy of the send side (NCCL's buffers, untracked); the part of the bucket
        // in this member's shard is zeroed and receives the sum.
        let all = grads.data()[bucket.clone()].to_vec();
        let kept = overlap(&mine, &bucket);
        if !kept.is_empty() {
            grads.data_mut()[kept.clone()].fill(0.0);
        }
        Collectives::reduce_scatter_range(
            self,
            g,
            bucket.start,
            &all,
            mine.clone(),
            &mut grads.data_mut()[mine],
        )?;
        if !kept.is_empty() {
            store(grads, kept);
        }
        Ok(())
    }

    fn join_grad_buckets(&self) -> Result<(), ExecError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::World;
    use super::*;

    #[test]
    fn a_group_without_this_rank_is_an_error_not_a_panic() {
        let comm = CpuComm::new(0, World::new(3));
        let e = DeviceCollectives::group(&comm, &[1, 2])
            .err()
            .map(|e| e.to_string());
        let want = "group: rank 0 is not a member of group [1, 2]";
        assert_eq!(e.as_deref(), Some(want));
        let Ok(g) = DeviceCollectives::group(&comm, &[2, 0]) else {
            panic!("rank 0 is a member of [2, 0]");
        };
        // The CPU's member order is ascending global rank: rank 0 is member 0 of {0, 2}.
        assert_eq!((g.size(), ProcessGroup::index(&g)), (2, 0));
    }
}
