//! Rotary position embedding (CPU twin: `cpu/ops/rotary.rs`; CUDA: `cuda/ops/rotary/`).

use super::family::op_family;

/// The rotary op, listed once (see `backend::ops`).
macro_rules! rotary_ops {
    ($make:ident) => {
        $make! {
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
    };
}
pub(crate) use rotary_ops;

rotary_ops!(op_family);
