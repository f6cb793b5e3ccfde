//! [`DeviceCollectives`] on the CUDA backend. Each process group of the Plan has a transport
//! (see [`crate::backend::cuda::comm::groups`]): NCCL for members on distinct GPUs, the shared-GPU device copies of
//! [`crate::backend::cuda::comm::local`] through the process's [`Hub`] for members on one GPU, nothing for a
//! single member. The reductions (all-reduce, reduce-scatter) are transport-specific; every
//! data movement (all-gather, all-to-all, the flat-range gathers of ZeRO) is built from one
//! grouped point-to-point primitive ([`CudaComm::p2p`]), and a reduce over ranges from it plus
//! the axpy kernel. Collectives run on the rank's collective stream, ordered after the
//! compute stream's current point and before its next op by events; pipeline messages on the
//! pipeline stream; the CP ring's posted exchanges on the ring stream, which the compute
//! stream waits for only at the exchange's wait (schedule in [`crate::backend::cuda::comm::overlap`]).

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
    DType, DeviceCollectives, DeviceTensor, Pending, ProcessGroup, RecvInto, ReduceOp, SendFrom,
    View, ViewMut,
};
use crate::error::ExecError;
use crate::tracker::{Category, MemoryTracker};
use cudarc::driver::{result as dr, sys, CudaEvent, CudaStream};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

mod grad_bucket;

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
        if let Ok(mut p) = self.pending.lock() {
            p.push(e);
        }
    }

    /// Every pending event, oldest first; none left pending (the step's own stay).
    pub fn drain(&self) -> Vec<Arc<E>> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// An event the optimizer step waits for (a gradient bucket's reduction).
    pub fn push_step(&self, e: Arc<E>) {
        if let Ok(mut p) = self.step.lock() {
            p.push(e);
        }
    }

    /// Every event pushed with [`Joins::push_step`], oldest first; none left.
    pub fn drain_step(&self) -> Vec<Arc<E>> {
        self.step
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }
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

    /// A staging buffer of `n` elements (zeroed on `s` when asked).
    fn stage(
        &self,
        dt: DType,
        n: usize,
        zero: Option<&CudaStream>,
    ) -> Result<CudaTensor, CudaError> {
        let bytes = n as u64 * dt.size_bytes();
        let block = self
            .pool
            .lock()
            .map_err(|_| CudaError::call(Library::Driver, "cuMemAlloc", "pool lock poisoned"))?
            .alloc(bytes)
            .map_err(|e| match e {
                PoolError::Cuda(c) => c,
                oom @ PoolError::OutOfMemory { .. } => {
                    CudaError::call(Library::Driver, "cuMemAlloc", oom.to_string())
                }
            })?;
        let t = CudaTensor::new(
            block,
            self.pool.clone(),
            &self.staging,
            Category::Buffers,
            dt,
            &[n],
        );
        if let Some(s) = zero {
            // SAFETY: the block holds `bytes`.
            unsafe { dr::memset_d8_async(t.ptr_at(0), 0, bytes as usize, s.cu_stream()) }
                .map_err(drv("cuMemsetD8Async"))?;
        }
        Ok(t)
    }

    /// Runs `f` on stream `s` ordered after the compute stream's queued work, and orders the
    /// compute stream's next work after it.
    fn on<R>(
        &self,
        s: &CudaStream,
        f: impl FnOnce(&CudaStream) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        self.flush_sends(None)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ready = self
            .compute
            .record_event(flags)
            .map_err(drv("cuEventRecord"))?;
        s.wait(&ready).map_err(drv("cuStreamWaitEvent"))?;
        let r = f(s)?;
        let done = s.record_event(flags).map_err(drv("cuEventRecord"))?;
        self.compute.wait(&done).map_err(drv("cuStreamWaitEvent"))?;
        Ok(r)
    }

    /// Runs `f` on stream `s` after the compute stream's queued work without making the
    /// compute stream wait for it: `uses` (the tensors it reads or writes) go back to the
    /// pool only after it, and the compute stream joins it at the next action boundary.
    fn on_async(
        &self,
        s: &CudaStream,
        uses: &[&CudaTensor],
        f: impl FnOnce(&CudaStream) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let done = self.on_stream_async(s, uses, f)?;
        self.joins.push(done);
        Ok(())
    }

    /// [`CudaComm::on_async`] without the join: the event that marks `f`'s end, for the
    /// caller to have waited for.
    fn on_stream_async(
        &self,
        s: &CudaStream,
        uses: &[&CudaTensor],
        f: impl FnOnce(&CudaStream) -> Result<(), CudaError>,
    ) -> Result<Arc<CudaEvent>, CudaError> {
        self.flush_sends(None)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ready = self
            .compute
            .record_event(flags)
            .map_err(drv("cuEventRecord"))?;
        s.wait(&ready).map_err(drv("cuStreamWaitEvent"))?;
        f(s)?;
        let done = Arc::new(s.record_event(flags).map_err(drv("cuEventRecord"))?);
        for t in uses {
            t.fence(done.clone());
        }
        Ok(done)
    }

    fn dtod(
        &self,
        s: &CudaStream,
        dst: u64,
        src: u64,
        n: usize,
        dt: DType,
    ) -> Result<(), CudaError> {
        if n == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both ranges lie in live buffers of `n` elements of `dt`.
        unsafe { dr::memcpy_dtod_async(dst, src, n * dt.size_bytes() as usize, s.cu_stream()) }
            .map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn nccl_of(&self, g: &CudaGroup) -> Result<&NcclComm, CudaError> {
        self.nccl.get(&g.members).ok_or_else(|| {
            CudaError::call(
                Library::Nccl,
                "ncclCommInitRank",
                format!(
                    "rank {} has no communicator for group {:?}",
                    self.rank, g.members
                ),
            )
        })
    }

    /// Host values of every member (each member passes as many), in member order.
    fn host_all_gather(&self, g: &CudaGroup, vals: &[u64]) -> Result<Vec<Vec<u64>>, CudaError> {
        if vals.is_empty() {
            return Ok(vec![Vec::new(); g.members.len()]);
        }
        match g.transport {
            Transport::Solo => Ok(vec![vals.to_vec()]),
            Transport::Local => {
                let p = Posted {
                    meta: vals.to_vec(),
                    ..Posted::default()
                };
                self.hub.exchange(&g.members, g.index, p, |all, _| {
                    Ok(all.iter().map(|p| p.meta.clone()).collect())
                })
            }
            Transport::Nccl => self.on(&self.comm.clone(), |s| {
                // u64 values as pairs of u32 in 4-byte slots: a gather copies bits.
                let words: Vec<u32> = vals
                    .iter()
                    .flat_map(|&v| [v as u32, (v >> 32) as u32])
                    .collect();
                let n = words.len();
                let send = self.stage(DType::F32, n, None)?;
                let recv = self.stage(DType::F32, n * g.members.len(), None)?;
                // SAFETY: the staging buffers hold n and n x size slots.
                unsafe { dr::memcpy_htod_async(send.ptr_at(0), &words, s.cu_stream()) }
                    .map_err(drv("cuMemcpyHtoDAsync"))?;
                let c = self.nccl_of(g)?;
                c.all_gather(send.ptr_at(0), recv.ptr_at(0), n, DType::F32, s.cu_stream())?;
                let mut back = vec![0u32; n * g.members.len()];
                // SAFETY: synchronised before `back` is read.
                unsafe { dr::memcpy_dtoh_async(&mut back, recv.ptr_at(0), s.cu_stream()) }
                    .map_err(drv("cuMemcpyDtoHAsync"))?;
                s.synchronize().map_err(drv("cuStreamSynchronize"))?;
                Ok(back
                    .chunks(n.max(1))
                    .take(g.members.len())
                    .map(|c| {
                        c.chunks(2)
                            .map(|w| w[0] as u64 | ((w[1] as u64) << 32))
                            .collect()
                    })
                    .collect())
            }),
        }
    }

    /// Grouped sends and receives among the members (every member calls it): pieces to and
    /// from oneself are copies; the k-th receive from a member matches its k-th send here.
    fn p2p(&self, g: &CudaGroup, sends: &[P2p], recvs: &[P2p], dt: DType) -> Result<(), CudaError> {
        self.on(&self.comm.clone(), |s| self.p2p_on(g, s, sends, recvs, dt))
    }

    /// [`CudaComm::p2p`] on stream `s`, already ordered after the compute stream.
    fn p2p_on(
        &self,
        g: &CudaGroup,
        s: &CudaStream,
        sends: &[P2p],
        recvs: &[P2p],
        dt: DType,
    ) -> Result<(), CudaError> {
        let me = g.index;
        {
            let own_s = sends.iter().filter(|p| p.0 == me);
            let own_r = recvs.iter().filter(|p| p.0 == me);
            for (a, b) in own_s.zip(own_r) {
                self.dtod(s, b.1, a.1, b.2.min(a.2), dt)?;
            }
            let other_s: Vec<P2p> = sends.iter().filter(|p| p.0 != me).copied().collect();
            let other_r: Vec<P2p> = recvs.iter().filter(|p| p.0 != me).copied().collect();
            match g.transport {
                Transport::Solo => Ok(()),
                Transport::Nccl => {
                    self.nccl_of(g)?
                        .send_recv(&other_s, &other_r, dt, s.cu_stream())
                }
                Transport::Local => {
                    // Our inputs must be on the device before the peers read them.
                    s.synchronize().map_err(drv("cuStreamSynchronize"))?;
                    let p = Posted {
                        sends: other_s,
                        ..Posted::default()
                    };
                    self.hub.exchange(&g.members, me, p, |all, _| {
                        let mut taken = vec![0usize; all.len()];
                        for &(j, dst, n) in &other_r {
                            let offer = all[j]
                                .sends
                                .iter()
                                .filter(|o| o.0 == me)
                                .nth(taken[j])
                                .ok_or_else(|| {
                                    CudaError::call(
                                        Library::Driver,
                                        "shared-GPU collective",
                                        format!("member {j} sends member {me} fewer pieces"),
                                    )
                                })?;
                            taken[j] += 1;
                            self.dtod(s, dst, offer.1, n.min(offer.2), dt)?;
                        }
                        s.synchronize().map_err(drv("cuStreamSynchronize"))
                    })
                }
            }
        }
    }

    /// The shared-GPU mover of this member over every member's posted addresses.
    fn with_mover<R>(
        &self,
        g: &CudaGroup,
        s: &CudaStream,
        addr: (u64, u64),
        dt: DType,
        scratch_len: usize,
        f: impl FnOnce(&DeviceMover<'_>, &Meeting) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        s.synchronize().map_err(drv("cuStreamSynchronize"))?;
        let scratch = self.stage(dt, scratch_len, None)?;
        let k = self.kernels.clone();
        let add = move |st: &CudaStream, d: DType, a: u64, b: u64, o: u64, n: usize| {
            // SAFETY: the mover passes buffers of n elements of d.
            unsafe { elementwise::add(st, &k, d, a, b, o, n) }
        };
        let p = Posted {
            addr,
            ..Posted::default()
        };
        self.hub.exchange(&g.members, g.index, p, |all, meeting| {
            let posted: Vec<(u64, u64)> = all.iter().map(|p| p.addr).collect();
            let m = DeviceMover {
                posted: &posted,
                me: g.index,
                dtype: dt,
                stream: s,
                scratch: scratch.ptr_at(0),
                scratch_len,
                add_kernel: &add,
            };
            f(&m, meeting)
        })
    }

    /// In-place reduction of `n` elements at `ptr` over the group.
    fn all_reduce_raw(
        &self,
        g: &CudaGroup,
        ptr: u64,
        n: usize,
        dt: DType,
        op: ReduceOp,
    ) -> Result<(), CudaError> {
        let size = g.members.len();
        self.on(&self.comm.clone(), |s| match (g.transport, op) {
            (Transport::Solo, _) => Ok(()),
            (Transport::Nccl, _) => self
                .nccl_of(g)?
                .all_reduce(ptr, ptr, n, dt, op, s.cu_stream()),
            (Transport::Local, ReduceOp::Sum) => {
                let longest = chunk(n, size, 0).len();
                self.with_mover(g, s, (0, ptr), dt, longest, |m, meet| {
                    local::all_reduce(m, meet, g.index, size, n)
                })
            }
            (Transport::Local, ReduceOp::Max) => self.host_max(g, s, ptr, n, dt),
        })
    }

    /// Max all-reduce among ranks sharing a GPU through the host (there is no max kernel;
    /// the only max reduction is the cross-entropy's row maximum, one value per row).
    fn host_max(
        &self,
        g: &CudaGroup,
        s: &CudaStream,
        ptr: u64,
        n: usize,
        dt: DType,
    ) -> Result<(), CudaError> {
        let mut bytes = vec![0u8; n * dt.size_bytes() as usize];
        s.synchronize().map_err(drv("cuStreamSynchronize"))?;
        // SAFETY: `ptr` holds n elements of dt; synchronised before `bytes` is read.
        unsafe { dr::memcpy_dtoh_async(&mut bytes, ptr, s.cu_stream()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        s.synchronize().map_err(drv("cuStreamSynchronize"))?;
        let mine = from_device_bytes(dt, &bytes);
        let bits: Vec<u64> = mine.iter().map(|x| x.to_bits() as u64).collect();
        let all = self.host_all_gather(g, &bits)?;
        let max: Vec<f32> = (0..n)
            .map(|i| {
                all.iter()
                    .map(|m| f32::from_bits(m[i] as u32))
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .collect();
        let out = to_device_bytes(dt, &max);
        // SAFETY: as above; a pageable copy has read `out` when it returns.
        unsafe { dr::memcpy_htod_async(ptr, &out, s.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        s.synchronize().map_err(drv("cuStreamSynchronize"))
    }

    /// Gathers the flat buffer's elements `want` into `dst` from every member's held range
    /// (`have` at `src`).
    #[allow(clippy::too_many_arguments)]
    fn gather_raw(
        &self,
        g: &CudaGroup,
        have: Range<usize>,
        src: u64,
        want: Range<usize>,
        dst: u64,
        dt: DType,
    ) -> Result<(), CudaError> {
        let mine = [have.start, have.end, want.start, want.end].map(|x| x as u64);
        let all = self.host_all_gather(g, &mine)?;
        let (sends, recvs) = plan(&ranges(&all, 0), &ranges(&all, 2), g.index);
        let es = dt.size_bytes();
        let s: Vec<P2p> = sends
            .iter()
            .map(|p| (p.peer, src + p.src_off as u64 * es, p.len))
            .collect();
        let r: Vec<P2p> = recvs
            .iter()
            .map(|p| (p.peer, dst + p.dst_off as u64 * es, p.len))
            .collect();
        self.p2p(g, &s, &r, dt)
    }

    /// Adds to `out` (elements `mine` of the flat buffer, of `out_dt`) the sum over members
    /// of their `input` (elements `have`, of `dt`) inside `mine`. With `bucket` (the input
    /// tensor, a gradient bucket) over NCCL it runs overlapped: the compute stream goes on
    /// with backward and joins at the next action boundary.
    #[allow(clippy::too_many_arguments)]
    fn reduce_range_raw(
        &self,
        g: &CudaGroup,
        have: Range<usize>,
        src: u64,
        dt: DType,
        mine: Range<usize>,
        out: u64,
        out_dt: DType,
        bucket: Option<&CudaTensor>,
    ) -> Result<(), CudaError> {
        let meta = [have.start, have.end, mine.start, mine.end].map(|x| x as u64);
        let all = self.host_all_gather(g, &meta)?;
        let (sends, recvs) = plan(&ranges(&all, 0), &ranges(&all, 2), g.index);
        let es = dt.size_bytes();
        let total: usize = recvs.iter().map(|p| p.len).sum();
        let seg = self.stage(dt, total, None)?;
        let mut at = 0;
        let mut r = Vec::with_capacity(recvs.len());
        for p in &recvs {
            r.push((p.peer, seg.ptr_at(at), p.len));
            at += p.len;
        }
        let s: Vec<P2p> = sends
            .iter()
            .map(|p| (p.peer, src + p.src_off as u64 * es, p.len))
            .collect();
        let wide = if dt == out_dt {
            None
        } else {
            Some(self.stage(out_dt, total, None)?)
        };
        let pieces: Vec<(usize, usize)> = recvs.iter().map(|p| (p.dst_off, p.len)).collect();
        let body = |st: &CudaStream| -> Result<(), CudaError> {
            self.p2p_on(g, st, &s, &r, dt)?;
            self.sum_pieces(st, &seg, wide.as_ref(), dt, &pieces, out, out_dt)
        };
        let comm = self.comm.clone();
        match bucket {
            Some(b) if overlapped(g.transport) => {
                let mut uses = vec![b, &seg];
                uses.extend(wide.as_ref());
                self.on_async(&comm, &uses, body)
            }
            _ => self.on(&comm, body),
        }
    }

    /// out[dst_off..+len] += the received pieces, consecutive in `seg` (of `dt`), converted
    /// to `out_dt` through `wide` where the dtypes differ.
    #[allow(clippy::too_many_arguments)]
    fn sum_pieces(
        &self,
        st: &CudaStream,
        seg: &CudaTensor,
        wide: Option<&CudaTensor>,
        dt: DType,
        pieces: &[(usize, usize)],
        out: u64,
        out_dt: DType,
    ) -> Result<(), CudaError> {
        let k = &self.kernels;
        let total: usize = pieces.iter().map(|p| p.1).sum();
        let base = match wide {
            Some(w) => {
                let (a, b) = (seg.ptr_at(0), w.ptr_at(0));
                // SAFETY: both staging buffers hold `total` elements.
                unsafe {
                    match dt {
                        DType::F32 => elementwise::cast_f32_to_bf16(st, k, a, b, total),
                        DType::Bf16 => elementwise::cast_bf16_to_f32(st, k, a, b, total),
                        // Masks are never reduced: a u8 reduction is a caller's bug.
                        DType::U8 => Err(CudaError::call(
                            crate::backend::cuda::diag::probe::Library::Nccl,
                            "sum_pieces",
                            "u8 tensors (dropout masks) are not reduced",
                        )),
                    }
                }?;
                b
            }
            None => seg.ptr_at(0),
        };
        let oes = out_dt.size_bytes();
        let mut at = 0u64;
        for &(dst_off, len) in pieces {
            // SAFETY: the piece lies inside `out` (its offset within `mine`).
            unsafe {
                elementwise::axpy(
                    st,
                    k,
                    out_dt,
                    1.0,
                    base + at * oes,
                    out + dst_off as u64 * oes,
                    len,
                )
            }?;
            at += len as u64;
        }
        Ok(())
    }

    /// The group whose transport carries messages between global ranks `a` and `b` (the
    /// smallest group holding both, the pipeline's).
    fn pair_group(&self, a: u32, b: u32) -> Result<CudaGroup, CudaError> {
        self.specs
            .iter()
            .filter(|s| s.members.contains(&a) && s.members.contains(&b))
            .min_by_key(|s| s.members.len())
            .map(|s| CudaGroup {
                members: s.members.clone(),
                index: s.members.iter().position(|&m| m == self.rank).unwrap_or(0),
                transport: s.transport,
            })
            .ok_or_else(|| {
                CudaError::call(
                    Library::Nccl,
                    "ncclSend",
                    format!("no process group holds ranks {a} and {b}"),
                )
            })
    }

    /// The element-wise sum over the group of host values, added in member order so that
    /// every member gets the same bits (a launched rank's loss sums, made global).
    pub fn sum_f64(&self, g: &CudaGroup, vals: &[f64]) -> Result<Vec<f64>, CudaError> {
        let bits: Vec<u64> = vals.iter().map(|x| x.to_bits()).collect();
        let all = self.host_all_gather(g, &bits)?;
        Ok((0..vals.len())
            .map(|i| all.iter().map(|m| f64::from_bits(m[i])).sum())
            .collect())
    }

    /// Issues the buffered sends and waits for the collective and pipeline streams, before
    /// the communicators are destroyed at the end of the run.
    pub fn finish(&self) -> Result<(), CudaError> {
        self.flush_sends(None)?;
        for s in [&self.pipe, &self.comm, &self.grad] {
            s.synchronize().map_err(drv("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// The communicator and peer index that carry messages to global rank `peer`: the
    /// launched job's world communicator by global rank, else the pair's group.
    fn nccl_peer(&self, peer: u32) -> Result<(&NcclComm, usize), CudaError> {
        match &self.world {
            Some(w) => Ok((w, peer as usize)),
            None => {
                let g = self.pair_group(self.rank, peer)?;
                let idx = g.members.iter().position(|&m| m == peer).unwrap_or(0);
                Ok((self.nccl_of(&g)?, idx))
            }
        }
    }

    /// Issues the buffered NCCL sends, with the receive `recv` (peer, address, elements,
    /// dtype) in the same NCCL group: a ring step's send to the next rank and receive from
    /// the previous, or a pipeline stage's send forward and receive backward, pair up on
    /// every rank and cannot deadlock (as Megatron's `batch_isend_irecv`). The compute stream
    /// waits only for a receive; the send buffers go back to the pool after the sends.
    pub fn flush_sends(&self, recv: Option<(u32, u64, usize, DType)>) -> Result<(), CudaError> {
        let sends = std::mem::take(&mut *self.pending_sends.borrow_mut());
        if sends.is_empty() && recv.is_none() {
            return Ok(());
        }
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let pipe = self.pipe.clone();
        let ready = self
            .compute
            .record_event(flags)
            .map_err(drv("cuEventRecord"))?;
        pipe.wait(&ready).map_err(drv("cuStreamWaitEvent"))?;
        let group = |e| CudaError::call(Library::Nccl, "ncclGroupStart", format!("{e:?}"));
        cudarc::nccl::result::group_start().map_err(group)?;
        let mut first_err = None;
        for (peer, t) in &sends {
            let r = self.nccl_peer(*peer).and_then(|(c, idx)| {
                c.send_recv(
                    &[(idx, t.ptr_at(0), t.len())],
                    &[],
                    t.dtype(),
                    pipe.cu_stream(),
                )
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        if let Some((peer, ptr, n, dt)) = recv {
            let r = self
                .nccl_peer(peer)
                .and_then(|(c, idx)| c.send_recv(&[], &[(idx, ptr, n)], dt, pipe.cu_stream()));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // The group is always closed, even after a failed call inside it.
        let end = cudarc::nccl::result::group_end()
            .map_err(|e| CudaError::call(Library::Nccl, "ncclGroupEnd", format!("{e:?}")));
        if let Some(e) = first_err {
            return Err(e);
        }
        end?;
        let done = Arc::new(pipe.record_event(flags).map_err(drv("cuEventRecord"))?);
        for (_, t) in &sends {
            t.fence(done.clone());
        }
        if recv.is_some() {
            self.compute.wait(&done).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }
}

impl CudaComm {
    /// The transport to global rank `peer`.
    fn transport_to(&self, peer: u32) -> Result<Transport, CudaError> {
        Ok(self.pair_group(self.rank, peer)?.transport)
    }

    /// Posts an exchange by the schedule of [`overlap::post_steps`].
    fn ring_post(
        &self,
        sends: &[SendFrom<'_, CudaTensor>],
        recvs: Vec<RecvInto<CudaTensor>>,
    ) -> Result<Pending<Cuda>, CudaError> {
        // Buffered pipeline sends go first: NCCL matches messages in issue order.
        self.flush_sends(None)?;
        let st: Vec<Transport> = sends
            .iter()
            .map(|s| self.transport_to(s.to))
            .collect::<Result<_, _>>()?;
        let rt: Vec<Transport> = recvs
            .iter()
            .map(|r| self.transport_to(r.from))
            .collect::<Result<_, _>>()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ring = self.ring.clone();
        let (mut ready, mut done) = (None, None);
        for step in overlap::post_steps(&st, &rt) {
            match step {
                Step::RecordReady => {
                    let e = self.compute.record_event(flags);
                    ready = Some(e.map_err(drv("cuEventRecord"))?);
                }
                Step::RingWaitsReady => {
                    if let Some(e) = &ready {
                        ring.wait(e).map_err(drv("cuStreamWaitEvent"))?;
                    }
                }
                Step::HubPut { send } => {
                    let s = &sends[send];
                    let dt = s.data.tensor.dtype();
                    let copy = self.stage(dt, s.data.len(), None)?;
                    let src = s.data.tensor.ptr_at(s.data.range.start);
                    self.dtod(&ring, copy.ptr_at(0), src, s.data.len(), dt)?;
                    // The peer reads it from its own thread once it is in the mailbox.
                    ring.synchronize().map_err(drv("cuStreamSynchronize"))?;
                    self.hub.put(self.rank, s.to, s.tag, copy)?;
                }
                Step::NcclGroup {
                    sends: si,
                    recvs: ri,
                } => self.ring_group(&ring, sends, &si, &recvs, &ri)?,
                Step::RecordDone => {
                    let e = Arc::new(ring.record_event(flags).map_err(drv("cuEventRecord"))?);
                    for s in sends {
                        s.data.tensor.fence(e.clone());
                    }
                    for r in &recvs {
                        r.buf.fence(e.clone());
                    }
                    done = Some(e);
                }
                Step::HubTake { .. } | Step::ComputeWaitsDone => {}
            }
        }
        Ok(Pending {
            recvs,
            done,
            posted_s: None,
        })
    }

    /// One grouped NCCL send/recv on `s` of the pieces `si` of `sends` and `ri` of `recvs`.
    fn ring_group(
        &self,
        s: &CudaStream,
        sends: &[SendFrom<'_, CudaTensor>],
        si: &[usize],
        recvs: &[RecvInto<CudaTensor>],
        ri: &[usize],
    ) -> Result<(), CudaError> {
        let group = |e| CudaError::call(Library::Nccl, "ncclGroupStart", format!("{e:?}"));
        cudarc::nccl::result::group_start().map_err(group)?;
        let mut first_err = None;
        for &i in si {
            let d = &sends[i].data;
            let piece = (d.tensor.ptr_at(d.range.start), d.len());
            let r = self.nccl_peer(sends[i].to).and_then(|(c, idx)| {
                c.send_recv(
                    &[(idx, piece.0, piece.1)],
                    &[],
                    d.tensor.dtype(),
                    s.cu_stream(),
                )
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        for &i in ri {
            let b = &recvs[i].buf;
            let r = self.nccl_peer(recvs[i].from).and_then(|(c, idx)| {
                c.send_recv(
                    &[],
                    &[(idx, b.ptr_at(0), b.len())],
                    b.dtype(),
                    s.cu_stream(),
                )
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // The group is always closed, even after a failed call inside it.
        let end = cudarc::nccl::result::group_end()
            .map_err(|e| CudaError::call(Library::Nccl, "ncclGroupEnd", format!("{e:?}")));
        if let Some(e) = first_err {
            return Err(e);
        }
        end.map(|_| ())
    }

    /// Completes an exchange by the schedule of [`overlap::wait_steps`].
    fn ring_wait(&self, p: Pending<Cuda>) -> Result<Vec<CudaTensor>, CudaError> {
        let rt: Vec<Transport> = p
            .recvs
            .iter()
            .map(|r| self.transport_to(r.from))
            .collect::<Result<_, _>>()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ring = self.ring.clone();
        let mut done = p.done;
        let mut taken = Vec::new();
        for step in overlap::wait_steps(&rt, done.is_some()) {
            match step {
                Step::HubTake { recv } => {
                    let r = &p.recvs[recv];
                    let msg = self.hub.take(r.from, self.rank, r.tag)?;
                    if msg.len() != r.buf.len() || msg.dtype() != r.buf.dtype() {
                        return Err(CudaError::call(
                            Library::Driver,
                            "recv",
                            format!(
                                "message from rank {} (tag {}) has {} {:?} elements, {} {:?} expected",
                                r.from,
                                r.tag,
                                msg.len(),
                                msg.dtype(),
                                r.buf.len(),
                                r.buf.dtype()
                            ),
                        ));
                    }
                    self.dtod(
                        &ring,
                        r.buf.ptr_at(0),
                        msg.ptr_at(0),
                        msg.len(),
                        msg.dtype(),
                    )?;
                    taken.push(msg);
                }
                Step::RecordDone => {
                    let e = Arc::new(ring.record_event(flags).map_err(drv("cuEventRecord"))?);
                    // The senders' blocks go back to their pools after the copies.
                    for m in &taken {
                        m.fence(e.clone());
                    }
                    for r in &p.recvs {
                        r.buf.fence(e.clone());
                    }
                    done = Some(e);
                }
                Step::ComputeWaitsDone => {
                    if let Some(e) = &done {
                        self.compute.wait(e).map_err(drv("cuStreamWaitEvent"))?;
                    }
                }
                _ => {}
            }
        }
        Ok(p.recvs.into_iter().map(|r| r.buf).collect())
    }
}

fn ex(e: CudaError) -> ExecError {
    e.into()
}

impl DeviceCollectives<Cuda> for CudaComm {
    fn group(&self, members: &[u32]) -> Result<CudaGroup, ExecError> {
        let index = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| {
                ex(CudaError::call(
                    Library::Nccl,
                    "group",
                    format!("rank {} is not in group {members:?}", self.rank),
                ))
            })?;
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
