//! The MLP's activations (CPU twin: `cpu/ops/activation.rs`; CUDA: `cuda/ops/activation/`).

use super::family::op_list;

op_list! { $ activation_ops:
    /// The MLP's activation (SwiGLU halves its input) and its gradient.
    ActivationOps {
        /// out[n, f] = act(u[n, f or 2f]).
        fn act_fwd(
            kind: parsim_plan::plan::Activation,
            u: &B::Tensor,
            out: &mut B::Tensor,
        ) -> () = memory(tb(u) + tb(out));
        /// The activation's input gradient, overwriting its input `u`.
        fn act_bwd_inplace(
            kind: parsim_plan::plan::Activation,
            u: &mut B::Tensor,
            dout: &B::Tensor,
        ) -> () = memory(2 * tb(u) + tb(dout));
    }
}
