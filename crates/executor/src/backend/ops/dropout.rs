//! Dropout by Philox 4x32-10 on the elements' global coordinates (CPU twin:
//! `cpu/ops/dropout.rs`; CUDA: `cuda/ops/dropout/`).

use super::family::op_list;
use crate::backend::tensor::ViewMut;

op_list! { $ dropout_ops:
    /// Inverted dropout, with or without its saved mask, and a saved mask applied.
    DropoutOps {
        /// Inverted dropout in place: x[i, j] *= mask(tokens[i], col_offset + j), the
        /// mask being 0 or 1 / (1 - p) drawn by Philox 4x32-10 from `key` and the
        /// element's global coordinates ([`crate::rng`]). The backward is the same call
        /// on the output gradient.
        fn dropout_inplace(
            key: &crate::rng::DropoutKey,
            tokens: &[u64],
            col_offset: u64,
            x: ViewMut<'_, B::Tensor>,
        ) -> () = memory(2 * vmb(&x));
        /// `dropout_inplace` that also returns the keep mask (0 or 1, one byte per
        /// element, an activation) for the backward, as Megatron saves it.
        fn dropout_save(
            key: &crate::rng::DropoutKey,
            tokens: &[u64],
            col_offset: u64,
            x: ViewMut<'_, B::Tensor>,
        ) -> B::Tensor = memory(2 * vmb(&x) + x.len() as u64);
        /// x *= mask x `scale`: a saved dropout mask applied to the output gradient.
        fn dropout_apply(mask: &B::Tensor, scale: f32, x: ViewMut<'_, B::Tensor>) -> ()
            = memory(tb(mask) + 2 * vmb(&x));
    }
}
