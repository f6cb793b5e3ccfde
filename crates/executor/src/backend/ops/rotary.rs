//! Rotary position embedding (CPU twin: `cpu/ops/rotary.rs`; CUDA: `cuda/ops/rotary/`).

use super::family::op_list;

op_list! { $ rotary_ops:
    /// Rotary embedding (RoFormer, Su et al. 2021).
    RotaryOps {
        /// Rotary embedding in place on [rows, heads * d]; row r of a sequence sits at
        /// `positions[r % positions.len()]`; `inverse` rotates back (the backward).
        fn rotary(
            x: &mut B::Tensor,
            heads: usize,
            positions: &[u32],
            theta: f32,
            inverse: bool,
        ) -> () = memory(2 * tb(x));
    }
}
