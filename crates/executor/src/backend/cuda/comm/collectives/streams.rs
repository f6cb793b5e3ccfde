//! The stream plumbing of [`CudaComm`]: staging buffers, running work on a collective
//! stream ordered against the compute stream, device copies, the NCCL communicator of a group,
//! host gathers and the grouped point-to-point primitive every data movement is built from.

use super::*;

impl CudaComm {
    /// A staging buffer of `n` elements (zeroed on `s` when asked).
    pub(super) fn stage(
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
    pub(super) fn on<R>(
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
    pub(super) fn on_async(
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
    pub(super) fn on_stream_async(
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

    pub(super) fn dtod(
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

    pub(super) fn nccl_of(&self, g: &CudaGroup) -> Result<&NcclComm, CudaError> {
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
    pub(super) fn host_all_gather(
        &self,
        g: &CudaGroup,
        vals: &[u64],
    ) -> Result<Vec<Vec<u64>>, CudaError> {
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
    pub(super) fn p2p(
        &self,
        g: &CudaGroup,
        sends: &[P2p],
        recvs: &[P2p],
        dt: DType,
    ) -> Result<(), CudaError> {
        self.on(&self.comm.clone(), |s| self.p2p_on(g, s, sends, recvs, dt))
    }

    /// [`CudaComm::p2p`] on stream `s`, already ordered after the compute stream.
    pub(super) fn p2p_on(
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
    pub(super) fn with_mover<R>(
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
}
