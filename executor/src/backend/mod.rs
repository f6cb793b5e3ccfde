//! The two traits a backend implements: tensor ops and collectives. The `cpu` backend is the
//! reference; the `cuda` backend (a later issue) implements the same traits on device buffers.

pub mod cpu;

use crate::error::ExecError;
use crate::plan::{Activation, AdamConfig, Norm};
use std::ops::Range;

/// Reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Collectives with NCCL's semantics within a group, plus point-to-point messages, and the
/// flat-range variants that ZeRO uses on the parameter and gradient buffers (Megatron's
/// distributed optimizer shards one flat buffer into contiguous ranges).
pub trait Collectives {
    type Group;
    /// In place; every member ends with the same reduction.
    fn all_reduce(&self, g: &Self::Group, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError>;
    /// `out` = concatenation of every member's `input` in member order.
    fn all_gather(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// `out` = this member's slice of the element-wise sum of every member's `input`.
    fn reduce_scatter(
        &self,
        g: &Self::Group,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Member i's j-th slice goes to member j's i-th slice.
    fn all_to_all(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// Variable-size all-to-all (as NCCL users build it from grouped send/recv, with the counts
    /// exchanged first): member i's `input` is `send_counts[j]` elements for each member j in
    /// member order; `out` receives, in member order, what each member j sent to i, and
    /// `recv_counts[j]` must equal member j's `send_counts[i]` (exchange the counts with
    /// [`Collectives::all_to_all`] beforehand).
    fn all_to_all_v(
        &self,
        g: &Self::Group,
        input: &[f32],
        send_counts: &[usize],
        out: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), ExecError>;
    /// Member `root`'s buffer to every member.
    fn broadcast(&self, g: &Self::Group, buf: &mut [f32], root: usize) -> Result<(), ExecError>;
    /// Buffered: returns at once.
    fn send(&self, to: u32, tag: u64, data: &[f32]) -> Result<(), ExecError>;
    /// Blocks until the message (from, tag) arrives.
    fn recv(&self, from: u32, tag: u64, out: &mut [f32]) -> Result<(), ExecError>;
    /// All-gather of a flat buffer held in contiguous shards (`mine` starts at `mine_lo`):
    /// `out` receives the elements `want` of the whole buffer.
    fn gather_range(
        &self,
        g: &Self::Group,
        mine_lo: usize,
        mine: &[f32],
        want: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Reduce-scatter of a flat range (every member passes the same `input_lo` and length):
    /// the sum over members of the part of `input` inside `mine` is *added* to `out`.
    fn reduce_scatter_range(
        &self,
        g: &Self::Group,
        input_lo: usize,
        input: &[f32],
        mine: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
}

/// The tensor ops of a training step, each with its backward; row-major fp32 slices.
pub trait TensorOps {
    /// y[n, o] = x[n, i] . w[o, i]^T.
    fn linear_fwd(&self, x: &[f32], w: &[f32], n: usize, i: usize, o: usize, y: &mut [f32]);
    /// dx[n, i] (+)= dy[n, o] . w[o, i].
    #[allow(clippy::too_many_arguments)]
    fn linear_dgrad(
        &self,
        dy: &[f32],
        w: &[f32],
        n: usize,
        i: usize,
        o: usize,
        dx: &mut [f32],
        acc: bool,
    );
    /// dw[o, i] += dy^T . x.
    fn linear_wgrad(&self, dy: &[f32], x: &[f32], n: usize, i: usize, o: usize, dw: &mut [f32]);
    fn norm_fwd(&self, kind: Norm, x: &[f32], p: &[f32], h: usize, eps: f32, y: &mut [f32]);
    #[allow(clippy::too_many_arguments)]
    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &[f32],
        p: &[f32],
        dy: &[f32],
        h: usize,
        eps: f32,
        dx: &mut [f32],
    );
    /// As `norm_dgrad`, adding into `dx`.
    #[allow(clippy::too_many_arguments)]
    fn norm_dgrad_acc(
        &self,
        kind: Norm,
        x: &[f32],
        p: &[f32],
        dy: &[f32],
        h: usize,
        eps: f32,
        dx: &mut [f32],
    );
    fn norm_wgrad(&self, kind: Norm, x: &[f32], dy: &[f32], h: usize, eps: f32, dp: &mut [f32]);
    /// Rotary embedding in place; row r of a sequence sits at `positions[r % positions.len()]`.
    #[allow(clippy::too_many_arguments)]
    fn rotary(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        d: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    );
    fn act_fwd(&self, kind: Activation, u: &[f32], n: usize, f: usize, out: &mut [f32]);
    fn act_bwd(
        &self,
        kind: Activation,
        u: &[f32],
        dout: &[f32],
        n: usize,
        f: usize,
        du: &mut [f32],
    );
    /// As `act_bwd`, overwriting the input `u` with its gradient.
    fn act_bwd_inplace(&self, kind: Activation, u: &mut [f32], dout: &[f32], n: usize, f: usize);
    fn adam(&self, c: &AdamConfig, t: u32, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]);
}
