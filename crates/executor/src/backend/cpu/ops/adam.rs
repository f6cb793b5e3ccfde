//! Adam (Kingma and Ba 2015) with decoupled weight decay (Loshchilov and Hutter 2019), on a
//! contiguous shard of the flat parameter buffer: element-wise, so sharding (ZeRO) does not
//! change the result.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_view, Tensor};
use crate::backend::ops::{AdamOps, AdamState};
use crate::error::ExecError;
use parsim_plan::plan::AdamConfig;

/// One update at step `t` (1-based).
pub fn adam_step(c: &AdamConfig, t: u32, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let bc1 = 1.0 - c.beta1.powi(t as i32);
    let bc2 = 1.0 - c.beta2.powi(t as i32);
    for i in 0..p.len() {
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g[i] * g[i];
        let mhat = m[i] / bc1;
        let vhat = v[i] / bc2;
        p[i] -= c.lr * (mhat / (vhat.sqrt() + c.eps) + c.weight_decay * p[i]);
    }
}

impl AdamOps<Cpu> for CpuOps {
    fn adam(&self, c: &AdamConfig, t: u32, s: AdamState<'_, Tensor>) -> Result<(), ExecError> {
        let AdamState {
            mut p,
            g,
            m,
            v,
            weight_copy,
        } = s;
        adam_step(c, t, dst(&mut p), src(&g), m.data_mut(), v.data_mut());
        if let Some(mut w) = weight_copy {
            dst(&mut w).copy_from_slice(&p.tensor.data()[p.range.clone()]);
            store_view(&mut w);
        }
        Ok(())
    }
}
