//! The Mamba-2 mixer (Dao and Gu 2024, "Transformers are SSMs", sec. 6-7; Megatron-Core's
//! MambaMixer; CPU twin: `cpu/ops/mamba.rs`; no CUDA kernels: the CUDA backend refuses hybrid
//! plans before it runs).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

/// One rank's Mamba-2 mixer on one microbatch: `b` sequences of `s` tokens (rows sequence by
/// sequence), this rank's `heads` heads of `p` channels and `groups` B/C groups of state `n`
/// (heads split evenly over the groups), the causal convolution's width `k`, the SSD's chunk
/// `q` and the gated norm's epsilon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MambaGeo {
    pub b: usize,
    pub s: usize,
    pub heads: usize,
    pub p: usize,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub q: usize,
    pub eps: f32,
}

impl MambaGeo {
    /// The inner width: heads x p.
    pub fn inner(&self) -> usize {
        self.heads * self.p
    }

    /// The convolution's channels: x, B and C.
    pub fn conv(&self) -> usize {
        self.inner() + 2 * self.groups * self.n
    }

    /// in_proj's outputs: z, x, B, C and dt.
    pub fn proj(&self) -> usize {
        2 * self.inner() + 2 * self.groups * self.n + self.heads
    }

    /// Tokens: b x s.
    pub fn tokens(&self) -> usize {
        self.b * self.s
    }

    /// Elements of the chunk states (fp32), every sequence, chunk and head: P x N each.
    pub fn states_len(&self) -> usize {
        self.b * self.s.div_ceil(self.q.max(1)) * self.heads * self.p * self.n
    }
}

/// What the SSD scan reads: x/B/C [n, conv], dt [n, heads] (its raw projection in the
/// forward, after the softplus in the backward) and the `ssm` parameters [3, heads]: A_log, D
/// and dt's bias.
#[derive(Debug)]
pub struct SsdInputs<'a, T> {
    pub xbc: &'a T,
    pub dt: &'a T,
    pub ssm: View<'a, T>,
}

/// What the SSD scan's forward writes: y [n, inner], and dt (after the softplus) and dt x A
/// [n, heads] for the backward.
#[derive(Debug)]
pub struct SsdOutputs<'a, T> {
    pub y: &'a mut T,
    pub dt: &'a mut T,
    pub da: &'a mut T,
}

/// The SSD scan's gradients: x/B/C's and dt's raw projection's written, the parameters'
/// accumulated.
#[derive(Debug)]
pub struct SsdGrads<'a, T> {
    pub dxbc: &'a mut T,
    pub ddt_raw: &'a mut T,
    pub dssm: ViewMut<'a, T>,
}

/// What the gated norm reads: the scan's output y, the gate z and the norm's weight.
#[derive(Debug)]
pub struct GateInputs<'a, T> {
    pub y: &'a T,
    pub z: &'a T,
    pub w: View<'a, T>,
}

/// The gated norm's gradients: y's and z's written, the weight's accumulated.
#[derive(Debug)]
pub struct GateGrads<'a, T> {
    pub dy: &'a mut T,
    pub dz: &'a mut T,
    pub dw: ViewMut<'a, T>,
}

op_list! { $ mamba_ops:
    /// The Mamba-2 mixer's split and merge of in_proj's output, causal convolution,
    /// SSD scan and gated norm, each with its backward.
    MambaOps {
        /// Splits in_proj's output [n, proj] into z [n, inner], x/B/C [n, conv] and dt
        /// [n, heads].
        fn mamba_split(
            zxbcdt: &B::Tensor,
            z: &mut B::Tensor,
            xbc: &mut B::Tensor,
            dt: &mut B::Tensor,
        ) -> () = memory(tb(zxbcdt) + tb(z) + tb(xbc) + tb(dt));
        /// The reverse of `mamba_split`: the gradients into one [n, proj].
        fn mamba_merge(
            dz: &B::Tensor,
            dxbc: &B::Tensor,
            ddt: &B::Tensor,
            out: &mut B::Tensor,
        ) -> () = memory(tb(dz) + tb(dxbc) + tb(ddt) + tb(out));
        /// SiLU of the causal depthwise convolution over each sequence; `w` is
        /// [conv, k + 1], the k taps then the bias of each channel.
        fn mamba_conv_fwd(
            g: &MambaGeo,
            x: &B::Tensor,
            w: View<'_, B::Tensor>,
            y: &mut B::Tensor,
        ) -> () = memory(tb(x) + vb(&w) + tb(y));
        /// The convolution's input gradient `dx` (written) and its weights' `dw`
        /// (accumulated), from its input `x` and the output gradient `dy`.
        fn mamba_conv_bwd(
            g: &MambaGeo,
            x: &B::Tensor,
            w: View<'_, B::Tensor>,
            dy: &B::Tensor,
            dx: &mut B::Tensor,
            dw: ViewMut<'_, B::Tensor>,
        ) -> () = memory(tb(x) + vb(&w) + tb(dy) + tb(dx) + 2 * vmb(&dw));
        /// The SSD chunked scan with the D skip; `states` is the chunk states' scratch
        /// (`MambaGeo::states_len`).
        fn mamba_ssd_fwd(
            g: &MambaGeo,
            x: SsdInputs<'_, B::Tensor>,
            out: SsdOutputs<'_, B::Tensor>,
            states: &mut B::Tensor,
        ) -> () = memory(
            tb(x.xbc) + tb(x.dt) + vb(&x.ssm) + tb(out.y) + tb(out.dt) + tb(out.da)
                + 2 * tb(states)
        );
        /// The scan's backward from the saved inputs (dt after the softplus) and the
        /// output gradient `dy`; the chunk states are recomputed in `states`.
        fn mamba_ssd_bwd(
            g: &MambaGeo,
            x: SsdInputs<'_, B::Tensor>,
            dy: &B::Tensor,
            grads: SsdGrads<'_, B::Tensor>,
            states: &mut B::Tensor,
        ) -> () = memory(
            tb(x.xbc) + tb(x.dt) + vb(&x.ssm) + tb(dy) + tb(grads.dxbc)
                + tb(grads.ddt_raw) + 2 * vmb(&grads.dssm) + 2 * tb(states)
        );
        /// The gated RMSNorm: out = rmsnorm(y x SiLU(z)) x w, normalised over each B/C
        /// group's heads (Megatron-Core's RMSNormGated, norm_before_gate = False).
        fn mamba_gate_fwd(
            g: &MambaGeo,
            x: GateInputs<'_, B::Tensor>,
            out: &mut B::Tensor,
        ) -> () = memory(tb(x.y) + tb(x.z) + vb(&x.w) + tb(out));
        /// The gated norm's gradients from the output gradient `dout`.
        fn mamba_gate_bwd(
            g: &MambaGeo,
            x: GateInputs<'_, B::Tensor>,
            dout: &B::Tensor,
            grads: GateGrads<'_, B::Tensor>,
        ) -> () = memory(
            tb(x.y) + tb(x.z) + vb(&x.w) + tb(dout) + tb(grads.dy) + tb(grads.dz)
                + 2 * vmb(&grads.dw)
        );
    }
}
