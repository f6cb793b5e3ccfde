//! The reductions and gathers on raw device ranges that the collectives are built from, the
//! pair groups of point-to-point messages and the buffered NCCL sends.

use super::*;

impl CudaComm {
    /// In-place reduction of `n` elements at `ptr` over the group.
    pub(super) fn all_reduce_raw(
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
    pub(super) fn host_max(
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
    pub(super) fn gather_raw(
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
    pub(super) fn reduce_range_raw(
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
    pub(super) fn sum_pieces(
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
    pub(super) fn pair_group(&self, a: u32, b: u32) -> Result<CudaGroup, CudaError> {
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
    pub(super) fn nccl_peer(&self, peer: u32) -> Result<(&NcclComm, usize), CudaError> {
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
