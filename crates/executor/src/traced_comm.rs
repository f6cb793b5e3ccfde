//! A recording layer over a rank's [`DeviceCollectives`]: every collective the model or the
//! optimizer calls (TP/SP all-gather and reduce-scatter, TP all-reduce, the CP ring's K/V
//! sends and receives, CP all-gather and Ulysses all-to-all, the MoE all-to-all(-v), the
//! data-parallel reductions) passes through it, so that `execute --trace` shows each with its
//! group and bytes without a hook at any call site. Backend-neutral: it wraps `B::Comm`.
//! A posted exchange ([`DeviceCollectives::p2p_start`]) records its sends when posted and
//! each receive from its post to its wait, so the trace shows what was in flight meanwhile;
//! [`TracedComm::kernel`] records the device work between them (the CP ring's blocks).
//! With op profiling on, each collective is also timed by class through the rank's
//! [`TracedOps`] (a posted exchange at its post and at its wait: the time the step waits).

use crate::backend::{Backend, DeviceCollectives, DeviceTensor, ProcessGroup, ReduceOp};
use crate::backend::{Pending, RecvInto, SendFrom, View, ViewMut};
use crate::error::ExecError;
use crate::trace::Clock;
use crate::traced_ops::TracedOps;
use parsim_plan::op_timing::CollectiveKind;
use parsim_plan::trace::Stream;
use std::cell::RefCell;
use std::ops::Range;

/// One recorded collective: operation, group members (global ranks), bytes, start and end
/// (seconds on the run's clock); or, on [`Stream::Kernels`], a named piece of device work
/// (group empty, no bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct CommRecord {
    pub stream: Stream,
    pub op: &'static str,
    pub group: Vec<u32>,
    pub bytes: u64,
    pub start_s: f64,
    pub end_s: f64,
}

/// A rank's collectives, recording each call when tracing is on. Bytes count the whole
/// buffer a collective moves or fills: a reduce-scatter's input, an all-gather's output, an
/// all-reduce's buffer, an all-to-all's input, a message. A group of one member moves
/// nothing and is not recorded.
pub struct TracedComm<'a, B: Backend> {
    inner: &'a B::Comm,
    /// This rank (the other end of a point-to-point message makes the pair).
    me: u32,
    clock: Option<Clock>,
    log: RefCell<Vec<CommRecord>>,
    /// The rank's device, whose events time each collective when profiling ops.
    ops: &'a TracedOps<B>,
}

impl<'a, B: Backend> TracedComm<'a, B> {
    /// Records on `clock` when it is set; times on `ops`' events when it profiles.
    pub fn new(inner: &'a B::Comm, me: u32, clock: Option<Clock>, ops: &'a TracedOps<B>) -> Self {
        TracedComm {
            inner,
            me,
            clock,
            log: RefCell::new(Vec::new()),
            ops,
        }
    }

    /// The rank's device with its op timing.
    pub fn ops(&self) -> &'a TracedOps<B> {
        self.ops
    }

    /// The wrapped collectives, for calls that are not collectives of the step (pipeline
    /// messages, which the trace records as actions).
    pub fn inner(&self) -> &'a B::Comm {
        self.inner
    }

    /// Hands over (and forgets) what was recorded since the last call.
    pub fn take(&self) -> Vec<CommRecord> {
        std::mem::take(&mut *self.log.borrow_mut())
    }

    /// Records a span of `op` on `stream` (group members, bytes, start and end seconds).
    fn log_span(
        &self,
        stream: Stream,
        op: &'static str,
        group: Vec<u32>,
        bytes: u64,
        span: (f64, f64),
    ) {
        let (start_s, end_s) = span;
        self.log.borrow_mut().push(CommRecord {
            stream,
            op,
            group,
            bytes,
            start_s,
            end_s,
        });
    }

    /// Runs `f`, recording it as `op` on `group` with `bytes` when tracing, and timing it as
    /// a `kind` collective when profiling ops.
    fn timed<T>(
        &self,
        kind: CollectiveKind,
        op: &'static str,
        group: &[u32],
        bytes: u64,
        f: impl FnOnce() -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let f = || self.ops.timed_collective(self.inner, kind, bytes, group, f);
        let Some(clock) = self.clock.filter(|_| group.len() > 1) else {
            return f();
        };
        let start_s = clock.now_s();
        let r = f()?;
        let span = (start_s, clock.now_s());
        self.log_span(Stream::Collectives, op, group.to_vec(), bytes, span);
        Ok(r)
    }
}

impl<B: Backend> TracedComm<'_, B> {
    /// Runs the device work `f` (named `name`), recording its span on [`Stream::Kernels`]
    /// when tracing.
    pub fn kernel<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let Some(clock) = self.clock else {
            return f();
        };
        let start_s = clock.now_s();
        let r = f();
        self.log_span(
            Stream::Kernels,
            name,
            Vec::new(),
            0,
            (start_s, clock.now_s()),
        );
        r
    }
}

fn view_bytes<T: DeviceTensor>(tensor: &T, range: &Range<usize>) -> u64 {
    range.len() as u64 * tensor.dtype().size_bytes()
}

impl<B: Backend> DeviceCollectives<B> for TracedComm<'_, B> {
    fn group(&self, members: &[u32]) -> Result<B::Group, ExecError> {
        self.inner.group(members)
    }

    fn reduce_scatter_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        let bytes = buf.size_bytes();
        self.timed(
            CollectiveKind::ReduceScatter,
            "reduce_scatter",
            g.members(),
            bytes,
            || self.inner.reduce_scatter_in_place(g, buf, mine),
        )
    }

    /// Recorded as the all-reduce or reduce-scatter of the bucket, inside the action that
    /// issued it (on a device that overlaps it, its span is the issue).
    fn reduce_grad_bucket(
        &self,
        g: &B::Group,
        grads: &mut B::Tensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(&*grads, &bucket);
        let (kind, op) = if sharded {
            (CollectiveKind::ReduceScatter, "reduce_scatter")
        } else {
            (CollectiveKind::AllReduce, "all_reduce")
        };
        self.timed(kind, op, g.members(), bytes, || {
            self.inner.reduce_grad_bucket(g, grads, bucket, sharded)
        })
    }

    fn join_grad_buckets(&self) -> Result<(), ExecError> {
        self.inner.join_grad_buckets()
    }

    fn all_gather_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError> {
        let bytes = buf.size_bytes();
        self.timed(
            CollectiveKind::AllGather,
            "all_gather",
            g.members(),
            bytes,
            || self.inner.all_gather_in_place(g, buf, mine),
        )
    }

    fn all_reduce(
        &self,
        g: &B::Group,
        buf: ViewMut<'_, B::Tensor>,
        op: ReduceOp,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(&*buf.tensor, &buf.range);
        self.timed(
            CollectiveKind::AllReduce,
            "all_reduce",
            g.members(),
            bytes,
            || self.inner.all_reduce(g, buf, op),
        )
    }

    fn all_gather(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(&*out.tensor, &out.range);
        self.timed(
            CollectiveKind::AllGather,
            "all_gather",
            g.members(),
            bytes,
            || self.inner.all_gather(g, input, out),
        )
    }

    fn reduce_scatter(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(input.tensor, &input.range);
        self.timed(
            CollectiveKind::ReduceScatter,
            "reduce_scatter",
            g.members(),
            bytes,
            || self.inner.reduce_scatter(g, input, out),
        )
    }

    fn all_to_all(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(input.tensor, &input.range);
        self.timed(
            CollectiveKind::AllToAll,
            "all_to_all",
            g.members(),
            bytes,
            || self.inner.all_to_all(g, input, out),
        )
    }

    /// Counts travel as 8-byte integers.
    fn all_to_all_counts(&self, g: &B::Group, send: &[usize]) -> Result<Vec<usize>, ExecError> {
        let bytes = (send.len() * 8) as u64;
        self.timed(
            CollectiveKind::AllToAll,
            "all_to_all_counts",
            g.members(),
            bytes,
            || self.inner.all_to_all_counts(g, send),
        )
    }

    /// Bytes: the elements this rank sends.
    fn all_to_all_v(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        send_counts: &[usize],
        out: ViewMut<'_, B::Tensor>,
        recv_counts: &[usize],
    ) -> Result<(), ExecError> {
        let bytes = send_counts.iter().sum::<usize>() as u64 * input.tensor.dtype().size_bytes();
        self.timed(
            CollectiveKind::AllToAll,
            "all_to_all_v",
            g.members(),
            bytes,
            || {
                self.inner
                    .all_to_all_v(g, input, send_counts, out, recv_counts)
            },
        )
    }

    fn send(&self, to: u32, tag: u64, data: View<'_, B::Tensor>) -> Result<(), ExecError> {
        let bytes = view_bytes(data.tensor, &data.range);
        self.timed(
            CollectiveKind::SendRecv,
            "p2p_send",
            &[self.me, to],
            bytes,
            || self.inner.send(to, tag, data),
        )
    }

    fn recv(&self, from: u32, tag: u64, out: ViewMut<'_, B::Tensor>) -> Result<(), ExecError> {
        let bytes = view_bytes(&*out.tensor, &out.range);
        self.timed(
            CollectiveKind::SendRecv,
            "p2p_recv",
            &[from, self.me],
            bytes,
            || self.inner.recv(from, tag, out),
        )
    }

    /// Each send is recorded as a `p2p_send` span over the posting of the whole exchange
    /// (one grouped call); the receives are recorded at [`DeviceCollectives::wait`].
    fn p2p_start(
        &self,
        sends: &[SendFrom<'_, B::Tensor>],
        recvs: Vec<RecvInto<B::Tensor>>,
    ) -> Result<Pending<B>, ExecError> {
        let posted_s = self.clock.map(|c| c.now_s());
        let bytes = sends
            .iter()
            .map(|s| view_bytes(s.data.tensor, &s.data.range))
            .sum();
        let pair = [self.me, sends.first().map_or(self.me, |s| s.to)];
        let mut p = self.ops.timed_collective(
            self.inner,
            CollectiveKind::SendRecv,
            bytes,
            &pair,
            || self.inner.p2p_start(sends, recvs),
        )?;
        p.posted_s = posted_s;
        if let (Some(clock), Some(start_s)) = (self.clock, posted_s) {
            let end_s = clock.now_s();
            for s in sends {
                let bytes = view_bytes(s.data.tensor, &s.data.range);
                let group = vec![self.me, s.to];
                self.log_span(
                    Stream::Collectives,
                    "p2p_send",
                    group,
                    bytes,
                    (start_s, end_s),
                );
            }
        }
        Ok(p)
    }

    /// Each receive is recorded as a `p2p_recv` span from the exchange's post to now.
    fn wait(&self, p: Pending<B>) -> Result<Vec<B::Tensor>, ExecError> {
        let posted_s = p.posted_s;
        let recs: Vec<(u32, u64)> = p
            .recvs
            .iter()
            .map(|r| (r.from, r.buf.size_bytes()))
            .collect();
        let bytes = recs.iter().map(|r| r.1).sum();
        let pair = [recs.first().map_or(self.me, |r| r.0), self.me];
        let got = self.ops.timed_collective(
            self.inner,
            CollectiveKind::SendRecv,
            bytes,
            &pair,
            || self.inner.wait(p),
        )?;
        if let (Some(clock), Some(start_s)) = (self.clock, posted_s) {
            let end_s = clock.now_s();
            for (from, bytes) in recs {
                let group = vec![from, self.me];
                self.log_span(
                    Stream::Collectives,
                    "p2p_recv",
                    group,
                    bytes,
                    (start_s, end_s),
                );
            }
        }
        Ok(got)
    }

    /// Bytes: the gathered range.
    fn gather_range(
        &self,
        g: &B::Group,
        mine_lo: usize,
        mine: View<'_, B::Tensor>,
        want: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let bytes = want.len() as u64 * out.tensor.dtype().size_bytes();
        self.timed(
            CollectiveKind::AllGather,
            "all_gather",
            g.members(),
            bytes,
            || self.inner.gather_range(g, mine_lo, mine, want, out),
        )
    }

    /// Bytes: the input reduced.
    fn reduce_scatter_range(
        &self,
        g: &B::Group,
        input_lo: usize,
        input: View<'_, B::Tensor>,
        mine: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let bytes = view_bytes(input.tensor, &input.range);
        self.timed(
            CollectiveKind::ReduceScatter,
            "reduce_scatter",
            g.members(),
            bytes,
            || {
                self.inner
                    .reduce_scatter_range(g, input_lo, input, mine, out)
            },
        )
    }
}
