//! The context-parallel ring's posted exchanges (schedule in
//! [`crate::backend::cuda::comm::overlap`]).

use super::*;

impl CudaComm {
    /// The transport to global rank `peer`.
    pub(super) fn transport_to(&self, peer: u32) -> Result<Transport, CudaError> {
        Ok(self.pair_group(self.rank, peer)?.transport)
    }

    /// Posts an exchange by the schedule of [`overlap::post_steps`].
    pub(super) fn ring_post(
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
    pub(super) fn ring_group(
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
    pub(super) fn ring_wait(&self, p: Pending<Cuda>) -> Result<Vec<CudaTensor>, CudaError> {
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
