//! Pipeline messages: a chunk's output (or input gradient) sent straight from its tensor,
//! and a received one copied out of the receive buffer into the mailbox.

use super::state::tag;
use super::state::Rank;
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceCollectives, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::op_timing::CollectiveKind;

impl<'a, B: Backend> Rank<'a, B> {
    /// Sends a chunk's output (or input gradient) straight from its tensor, which is the
    /// pipeline send buffer until then, and frees it.
    pub(super) fn send(
        &mut self,
        to: u32,
        stage: u32,
        mb: u32,
        grad: bool,
    ) -> Result<(), ExecError> {
        let t = self
            .mailbox
            .remove(&(stage, mb, grad))
            .ok_or_else(|| self.missing("tensor to send", stage, mb))?;
        // Pipeline messages are actions of the trace, not collectives; profiled, they are
        // point-to-point messages.
        let (comm, me) = (self.ctx.comm, self.rp.rank);
        self.ctx.ops.timed_collective(
            comm.inner(),
            CollectiveKind::SendRecv,
            t.size_bytes(),
            &[me, to],
            || comm.inner().send(to, tag(stage, mb, grad), View::all(&t)),
        )
    }

    pub(super) fn recv(
        &mut self,
        from: u32,
        stage: u32,
        mb: u32,
        grad: bool,
    ) -> Result<(), ExecError> {
        let buf = self.recv_buf.as_mut().expect("pp buffers");
        // Profiled, a receive's wait for the sender is recorded apart (OpKey::Wait) where the
        // backend sees it.
        let (comm, me) = (self.ctx.comm, self.rp.rank);
        self.ctx.ops.timed_collective(
            comm.inner(),
            CollectiveKind::SendRecv,
            buf.size_bytes(),
            &[from, me],
            || {
                comm.inner()
                    .recv(from, tag(stage, mb, grad), ViewMut::all(buf))
            },
        )?;
        self.recv_arrived_s = self.clock.map(|c| c.now_s());
        let cat = if grad {
            Category::Buffers
        } else {
            Category::Activations
        };
        let mut t = self.ctx.zeros(cat, buf.shape())?;
        self.ctx.ops.copy(View::all(buf), ViewMut::all(&mut t))?;
        self.mailbox.insert((stage, mb, grad), t);
        Ok(())
    }
}
