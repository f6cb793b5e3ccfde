//! Rotary position embedding (Su et al. 2021, RoFormer), in the rotate-half layout of GPT-NeoX
//! and Llama: feature j pairs with j + d/2 within each head. Row r of a sequence sits at
//! position `positions[r mod positions.len()]` (context parallelism holds non-contiguous rows).

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::RotaryOps;
use crate::error::ExecError;

/// Rotates `heads` heads of `d` features per row, in place; `inverse` applies the transpose
/// (the backward of the rotation).
pub fn rotary(
    x: &mut [f32],
    rows: usize,
    heads: usize,
    d: usize,
    positions: &[u32],
    theta: f32,
    inverse: bool,
) {
    let half = d / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|j| 1.0 / theta.powf(2.0 * j as f32 / d as f32))
        .collect();
    let sign = if inverse { -1.0 } else { 1.0 };
    for r in 0..rows {
        let pos = positions[r % positions.len()] as f32;
        for hd in 0..heads {
            let base = (r * heads + hd) * d;
            for j in 0..half {
                let (s, c) = (pos * inv_freq[j]).sin_cos();
                let s = sign * s;
                let x1 = x[base + j];
                let x2 = x[base + j + half];
                x[base + j] = x1 * c - x2 * s;
                x[base + j + half] = x1 * s + x2 * c;
            }
        }
    }
}

impl RotaryOps<Cpu> for CpuOps {
    fn rotary(
        &self,
        x: &mut Tensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError> {
        let (rows, d) = (x.rows(), x.cols() / heads.max(1));
        rotary(x.data_mut(), rows, heads, d, positions, theta, inverse);
        store_all(x);
        Ok(())
    }
}
