//! The fused QKV projection split into Q, K and V and merged back, and [`LayoutOps`] for the
//! CPU.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::LayoutOps;
use crate::error::ExecError;

/// Splits each row of `qkv` [n, qw + kw + vw] into q [n, qw], k [n, kw], v [n, vw].
pub fn qkv_split(qkv: &[f32], q: &mut [f32], k: &mut [f32], v: &mut [f32], n: usize) {
    let (qw, kw, vw) = (q.len() / n.max(1), k.len() / n.max(1), v.len() / n.max(1));
    let w = qw + kw + vw;
    for r in 0..n {
        let row = &qkv[r * w..(r + 1) * w];
        q[r * qw..(r + 1) * qw].copy_from_slice(&row[..qw]);
        k[r * kw..(r + 1) * kw].copy_from_slice(&row[qw..qw + kw]);
        v[r * vw..(r + 1) * vw].copy_from_slice(&row[qw + kw..]);
    }
}

/// The inverse of [`qkv_split`].
pub fn qkv_merge(q: &[f32], k: &[f32], v: &[f32], qkv: &mut [f32], n: usize) {
    let (qw, kw, vw) = (q.len() / n.max(1), k.len() / n.max(1), v.len() / n.max(1));
    let w = qw + kw + vw;
    for r in 0..n {
        let row = &mut qkv[r * w..(r + 1) * w];
        row[..qw].copy_from_slice(&q[r * qw..(r + 1) * qw]);
        row[qw..qw + kw].copy_from_slice(&k[r * kw..(r + 1) * kw]);
        row[qw + kw..].copy_from_slice(&v[r * vw..(r + 1) * vw]);
    }
}

impl LayoutOps<Cpu> for CpuOps {
    fn qkv_split(
        &self,
        qkv: &Tensor,
        q: &mut Tensor,
        k: &mut Tensor,
        v: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = qkv.rows();
        qkv_split(qkv.data(), q.data_mut(), k.data_mut(), v.data_mut(), n);
        for t in [q, k, v] {
            store_all(t);
        }
        Ok(())
    }

    fn qkv_merge(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        qkv: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = qkv.rows();
        qkv_merge(q.data(), k.data(), v.data(), qkv.data_mut(), n);
        store_all(qkv);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_split_and_merge_are_inverse() {
        let n = 3;
        let qkv: Vec<f32> = (0..n * 7).map(|x| x as f32).collect();
        let (mut q, mut k, mut v) = (vec![0.0; n * 4], vec![0.0; n * 2], vec![0.0; n]);
        qkv_split(&qkv, &mut q, &mut k, &mut v, n);
        assert_eq!(&q[4..8], &[7.0, 8.0, 9.0, 10.0]);
        assert_eq!(&k[2..4], &[11.0, 12.0]);
        assert_eq!(v, vec![6.0, 13.0, 20.0]);
        let mut back = vec![0.0; n * 7];
        qkv_merge(&q, &k, &v, &mut back, n);
        assert_eq!(back, qkv);
    }
}
