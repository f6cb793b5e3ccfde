//! [`DeviceCollectives`] on the CUDA backend. Each process group of the Plan has a transport (see
//! [`crate::backend::cuda::comm::groups`]): NCCL for members on distinct GPUs, the shared-GPU
//! device copies of [`crate::backend::cuda::comm::local`] through the process's [`Hub`] for members
//! on one GPU, nothing for a single member. The reductions (all-reduce, reduce-scatter) are
//! transport-specific; every data movement (all-gather, all-to-all, the flat-range gathers of ZeRO)
//! is built from one grouped point-to-point primitive ([`CudaComm::p2p`]), and a reduce over ranges
//! from it plus the axpy kernel. Collectives run on the rank's collective stream, ordered after the
//! compute stream's current point and before its next op by events; pipeline messages on the
//! pipeline stream; the CP ring's posted exchanges on the ring stream, which the compute stream
//! waits for only at the exchange's wait (schedule in [`crate::backend::cuda::comm::overlap`]).

use crate::backend::cuda::comm::exchange::{plan, ranges};
use crate::backend::cuda::comm::groups::{GroupSpec, Transport};
use crate::backend::cuda::comm::hub::{Hub, Meeting, Posted};
use crate::backend::cuda::comm::local::{self, chunk};
use crate::backend::cuda::comm::local_device::DeviceMover;
use crate::backend::cuda::comm::nccl::NcclComm;
use crate::backend::cuda::comm::overlap::{self, Step};
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::device::context::{drv, RankGpu};
use crate::backend::cuda::device::pool::PoolError;
use crate::backend::cuda::device::tensor::{from_device_bytes, to_device_bytes, CudaTensor};
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::Library;
use crate::backend::cuda::ops::elementwise::kernel as elementwise;
use crate::backend::cuda::Cuda;
use crate::backend::{
    DeviceCollectives, DeviceTensor, Pending, ProcessGroup, RecvInto, ReduceOp, SendFrom, View,
    ViewMut,
};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use cudarc::driver::{result as dr, sys, CudaEvent, CudaStream};
use parsim_plan::DType;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

mod grad_bucket;
mod raw;
mod ring;
mod streams;

/// A process group as one member sees it, with its transport.
#[derive(Debug, Clone)]
pub struct CudaGroup {
    members: Vec<u32>,
    index: usize,
    transport: Transport,
}

impl ProcessGroup for CudaGroup {
    fn size(&self) -> usize {
        self.members.len()
    }
    fn index(&self) -> usize {
        self.index
    }
    fn members(&self) -> &[u32] {
        &self.members
    }
}

/// Collective work the compute stream has not waited for yet (overlapped reduce-scatters):
/// shared by a rank's collectives, which push, and its device, which makes the compute
/// stream wait for all of them at the next action boundary ([`crate::backend::Device::record`]).
/// The ZeRO 0/1 gradient buckets wait apart, for the optimizer step
/// ([`DeviceCollectives::join_grad_buckets`]).
pub struct Joins<E> {
    pending: std::sync::Mutex<Vec<Arc<E>>>,
    step: std::sync::Mutex<Vec<Arc<E>>>,
}

impl<E> Default for Joins<E> {
    fn default() -> Self {
        Joins {
            pending: std::sync::Mutex::new(Vec::new()),
            step: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl<E> Joins<E> {
    pub fn push(&self, e: Arc<E>) {
        push_to(&self.pending, e);
    }

    /// Every pending event, oldest first; none left pending (the step's own stay).
    pub fn drain(&self) -> Vec<Arc<E>> {
        take_all(&self.pending)
    }

    /// An event the optimizer step waits for (a gradient bucket's reduction).
    pub fn push_step(&self, e: Arc<E>) {
        push_to(&self.step, e);
    }

    /// Every event pushed with [`Joins::push_step`], oldest first; none left.
    pub fn drain_step(&self) -> Vec<Arc<E>> {
        take_all(&self.step)
    }
}

/// Appends to a list behind a lock (a poisoned lock drops the event: the failed thread's
/// error ends the run anyway).
fn push_to<E>(list: &std::sync::Mutex<Vec<Arc<E>>>, e: Arc<E>) {
    if let Ok(mut p) = list.lock() {
        p.push(e);
    }
}

/// Empties a list behind a lock, handing back what it held in order.
fn take_all<E>(list: &std::sync::Mutex<Vec<Arc<E>>>) -> Vec<Arc<E>> {
    list.lock()
        .map(|mut p| std::mem::take(&mut *p))
        .unwrap_or_default()
}

/// Whether a gradient-bucket reduce-scatter over `t` runs overlapped with the computation
/// that follows (NCCL, on the collective stream); the shared-GPU copies meet other threads
/// on the host and so run in place.
pub fn overlapped(t: Transport) -> bool {
    t == Transport::Nccl
}

/// One rank's collectives.
pub struct CudaComm {
    rank: u32,
    compute: Arc<CudaStream>,
    comm: Arc<CudaStream>,
    pipe: Arc<CudaStream>,
    ring: Arc<CudaStream>,
    /// The ZeRO 0/1 gradient buckets' stream.
    grad: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    pool: Arc<
        std::sync::Mutex<
            crate::backend::cuda::device::pool::Pool<
                crate::backend::cuda::device::context::DriverMemory,
            >,
        >,
    >,
    /// Staging buffers are NCCL's own in the accounting: not in the rank's categories.
    staging: MemoryTracker,
    specs: Vec<GroupSpec>,
    nccl: HashMap<Vec<u32>, NcclComm>,
    /// A launched job's world communicator (pipeline messages by global rank).
    world: Option<NcclComm>,
    hub: Arc<Hub>,
    joins: Arc<Joins<CudaEvent>>,
    /// NCCL sends not issued yet (global peer, a copy of the data).
    pending_sends: std::cell::RefCell<Vec<(u32, CudaTensor)>>,
}

/// (member index, device address, elements) of one grouped send or receive.
type P2p = (usize, u64, usize);

fn mismatch(what: &str, a: DType, b: DType) -> CudaError {
    CudaError::call(
        Library::Nccl,
        "collective",
        format!("{what}: input {a:?} and output {b:?} differ; a collective moves one dtype"),
    )
}

impl CudaComm {
    /// Rank `rank`'s collectives on its GPU, with its NCCL communicators (by members) and,
    /// in a launched job, the world communicator.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: u32,
        gpu: &RankGpu,
        kernels: Arc<Kernels>,
        specs: Vec<GroupSpec>,
        nccl: HashMap<Vec<u32>, NcclComm>,
        world: Option<NcclComm>,
        hub: Arc<Hub>,
        joins: Arc<Joins<CudaEvent>>,
    ) -> CudaComm {
        CudaComm {
            rank,
            compute: gpu.streams.compute.clone(),
            comm: gpu.streams.comm.clone(),
            pipe: gpu.streams.pipe.clone(),
            ring: gpu.streams.ring.clone(),
            grad: gpu.streams.grad.clone(),
            kernels,
            pool: gpu.pool.clone(),
            staging: MemoryTracker::new(),
            specs,
            nccl,
            world,
            hub,
            joins,
            pending_sends: std::cell::RefCell::new(Vec::new()),
        }
    }
}

fn ex(e: CudaError) -> ExecError {
    e.into()
}

impl DeviceCollectives<Cuda> for CudaComm {
    fn group(&self, members: &[u32]) -> Result<CudaGroup, ExecError> {
        let index = crate::backend::member_index(self.rank, members)?;
        let transport = if members.len() == 1 {
            Transport::Solo
        } else {
            self.specs
                .iter()
                .find(|s| s.members == members)
                .map(|s| s.transport)
                .ok_or_else(|| {
                    ex(CudaError::call(
                        Library::Nccl,
                        "group",
                        format!("group {members:?} is not one of the Plan's groups"),
                    ))
                })?
        };
        Ok(CudaGroup {
            members: members.to_vec(),
            index,
            transport,
        })
    }

    fn reduce_scatter_in_place(
        &self,
        g: &CudaGroup,
        buf: &mut CudaTensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        let dt = buf.dtype();
        let out = self.stage(dt, mine.len(), Some(&self.compute))?;
        let all = 0..buf.len();
        let (src, dst) = (buf.ptr_at(0), out.ptr_at(0));
        self.reduce_range_raw(g, all, src, dt, mine.clone(), dst, dt, None)?;
        let c = self.compute.clone();
        Ok(self.dtod(&c, buf.ptr_at(mine.start), out.ptr_at(0), mine.len(), dt)?)
    }

    fn all_gather_in_place(
        &self,
        g: &CudaGroup,
        buf: &mut CudaTensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        let (src, dst) = (buf.ptr_at(mine.start), buf.ptr_at(0));
        Ok(self.gather_raw(g, mine, src, 0..buf.len(), dst, buf.dtype())?)
    }

    fn all_reduce(
        &self,
        g: &CudaGroup,
        buf: ViewMut<'_, CudaTensor>,
        op: ReduceOp,
    ) -> Result<(), ExecError> {
        let ptr = buf.tensor.ptr_at(buf.range.start);
        Ok(self.all_reduce_raw(g, ptr, buf.len(), buf.tensor.dtype(), op)?)
    }

    fn all_gather(
        &self,
        g: &CudaGroup,
        input: View<'_, CudaTensor>,
        out: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let dt = input.tensor.dtype();
        if dt != out.tensor.dtype() {
            return Err(ex(mismatch("all_gather", dt, out.tensor.dtype())));
        }
        let per = input.len();
        let src = input.tensor.ptr_at(input.range.start);
        let dst = out.tensor.ptr_at(out.range.start);
        let size = g.members.len();
        let sends: Vec<P2p> = (0..size).map(|j| (j, src, per)).collect();
        let recvs: Vec<P2p> = (0..size)
            .map(|j| (j, dst + (j * per) as u64 * dt.size_bytes(), per))
            .collect();
        Ok(self.p2p(g, &sends, &recvs, dt)?)
    }

    fn reduce_scatter(
        &self,
        g: &CudaGroup,
        input: View<'_, CudaTensor>,
        out: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let dt = input.tensor.dtype();
        if dt != out.tensor.dtype() {
            return Err(ex(mismatch("reduce_scatter", dt, out.tensor.dtype())));
        }
        let (src, dst) = (
            input.tensor.ptr_at(input.range.start),
            out.tensor.ptr_at(out.range.start),
        );
        let (size, per, len) = (g.members.len(), out.len(), input.len());
        Ok(self.on(&self.comm.clone(), |s| match g.transport {
            Transport::Solo => self.dtod(s, dst, src, per, dt),
            Transport::Nccl => self
                .nccl_of(g)?
                .reduce_scatter(src, dst, per, dt, s.cu_stream()),
            Transport::Local => self.with_mover(g, s, (src, dst), dt, per, |m, meet| {
                local::reduce_scatter(m, meet, g.index, size, len)
            }),
        })?)
    }

    fn all_to_all(
        &self,
        g: &CudaGroup,
        input: View<'_, CudaTensor>,
        out: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let size = g.members.len();
        let per = input.len() / size.max(1);
        let counts = vec![per; size];
        self.all_to_all_v(g, input, &counts, out, &counts)
    }

    fn all_to_all_counts(&self, g: &CudaGroup, send: &[usize]) -> Result<Vec<usize>, ExecError> {
        let size = g.members.len();
        let c = send.len() / size.max(1);
        let vals: Vec<u64> = send.iter().map(|&x| x as u64).collect();
        let all = self.host_all_gather(g, &vals)?;
        let me = g.index;
        Ok(all
            .iter()
            .flat_map(|v| v[me * c..(me + 1) * c].iter().map(|&x| x as usize))
            .collect())
    }

    fn all_to_all_v(
        &self,
        g: &CudaGroup,
        input: View<'_, CudaTensor>,
        send_counts: &[usize],
        out: ViewMut<'_, CudaTensor>,
        recv_counts: &[usize],
    ) -> Result<(), ExecError> {
        let dt = input.tensor.dtype();
        if dt != out.tensor.dtype() {
            return Err(ex(mismatch("all_to_all_v", dt, out.tensor.dtype())));
        }
        let es = dt.size_bytes();
        let parts = |base: u64, counts: &[usize]| -> Vec<P2p> {
            crate::backend::cuda::comm::nccl::displacements(counts)
                .into_iter()
                .zip(counts)
                .enumerate()
                .filter(|(_, (_, &c))| c > 0)
                .map(|(j, (at, &c))| (j, base + at as u64 * es, c))
                .collect()
        };
        let sends = parts(input.tensor.ptr_at(input.range.start), send_counts);
        let recvs = parts(out.tensor.ptr_at(out.range.start), recv_counts);
        Ok(self.p2p(g, &sends, &recvs, dt)?)
    }

    fn send(&self, to: u32, tag: u64, data: View<'_, CudaTensor>) -> Result<(), ExecError> {
        let dt = data.tensor.dtype();
        let src = data.tensor.ptr_at(data.range.start);
        let g = self.pair_group(self.rank, to)?;
        if g.transport == Transport::Local {
            // Buffered, as the CPU's send: a device copy left in the mailbox.
            let copy = self.stage(dt, data.len(), None)?;
            let c = self.compute.clone();
            self.dtod(&c, copy.ptr_at(0), src, data.len(), dt)?;
            c.synchronize().map_err(drv("cuStreamSynchronize"))?;
            return Ok(self.hub.put(self.rank, to, tag, copy)?);
        }
        // Buffered: a copy taken now, sent with this rank's next receive (or collective).
        let copy = self.stage(dt, data.len(), None)?;
        let c = self.compute.clone();
        self.dtod(&c, copy.ptr_at(0), src, data.len(), dt)?;
        self.pending_sends.borrow_mut().push((to, copy));
        Ok(())
    }

    fn recv(&self, from: u32, tag: u64, out: ViewMut<'_, CudaTensor>) -> Result<(), ExecError> {
        let dt = out.tensor.dtype();
        let dst = out.tensor.ptr_at(out.range.start);
        let g = self.pair_group(self.rank, from)?;
        if g.transport == Transport::Local {
            let msg = self.hub.take(from, self.rank, tag)?;
            if msg.len() != out.len() || msg.dtype() != dt {
                return Err(ex(CudaError::call(
                    Library::Driver,
                    "recv",
                    format!(
                        "message from rank {from} (tag {tag}) has {} {:?} elements, {} {:?} expected",
                        msg.len(),
                        msg.dtype(),
                        out.len(),
                        dt
                    ),
                )));
            }
            let c = self.compute.clone();
            self.dtod(&c, dst, msg.ptr_at(0), out.len(), dt)?;
            // The sender's block goes back to its pool once the copy is done.
            c.synchronize().map_err(drv("cuStreamSynchronize"))?;
            return Ok(());
        }
        Ok(self.flush_sends(Some((from, dst, out.len(), dt)))?)
    }

    fn p2p_start(
        &self,
        sends: &[SendFrom<'_, CudaTensor>],
        recvs: Vec<RecvInto<CudaTensor>>,
    ) -> Result<Pending<Cuda>, ExecError> {
        Ok(self.ring_post(sends, recvs)?)
    }

    fn wait(&self, p: Pending<Cuda>) -> Result<Vec<CudaTensor>, ExecError> {
        Ok(self.ring_wait(p)?)
    }

    fn gather_range(
        &self,
        g: &CudaGroup,
        mine_lo: usize,
        mine: View<'_, CudaTensor>,
        want: Range<usize>,
        out: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let dt = mine.tensor.dtype();
        if dt != out.tensor.dtype() {
            return Err(ex(mismatch("gather_range", dt, out.tensor.dtype())));
        }
        let have = mine_lo..mine_lo + mine.len();
        let (src, dst) = (
            mine.tensor.ptr_at(mine.range.start),
            out.tensor.ptr_at(out.range.start),
        );
        Ok(self.gather_raw(g, have, src, want, dst, dt)?)
    }

    fn reduce_scatter_range(
        &self,
        g: &CudaGroup,
        input_lo: usize,
        input: View<'_, CudaTensor>,
        mine: Range<usize>,
        out: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let have = input_lo..input_lo + input.len();
        let src = input.tensor.ptr_at(input.range.start);
        let dst = out.tensor.ptr_at(out.range.start);
        Ok(self.reduce_range_raw(
            g,
            have,
            src,
            input.tensor.dtype(),
            mine,
            dst,
            out.tensor.dtype(),
            Some(input.tensor),
        )?)
    }

    fn reduce_grad_bucket(
        &self,
        g: &CudaGroup,
        grads: &mut CudaTensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), ExecError> {
        Ok(self.grad_bucket(g, grads, bucket, sharded)?)
    }

    fn join_grad_buckets(&self) -> Result<(), ExecError> {
        Ok(self.join_step()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_hand_back_every_pending_event_once_in_order() {
        let j: Joins<u32> = Joins::default();
        for e in [3, 1, 2] {
            j.push(Arc::new(e));
        }
        let got: Vec<u32> = j.drain().iter().map(|e| **e).collect();
        assert_eq!(got, vec![3, 1, 2]);
        assert!(j.drain().is_empty());
    }

    #[test]
    fn only_nccl_bucket_reductions_overlap() {
        // The shared-GPU copies synchronise with the peers' threads on the host: nothing
        // left to overlap; a single member has no collective.
        let got: Vec<bool> = [Transport::Nccl, Transport::Local, Transport::Solo]
            .into_iter()
            .map(overlapped)
            .collect();
        assert_eq!(got, vec![true, false, false]);
    }
}
