//! The vocab-parallel embedding's row gather and its gradient's scatter-add, and
//! [`EmbeddingOps`] for the CPU.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::EmbeddingOps;
use crate::backend::{View, ViewMut};
use crate::error::ExecError;

/// out[r] = table[tokens[r] - lo] (rows of `h`) where the token lies in the table's
/// `table.len() / h` rows from `lo`; other rows of `out` are left as they are.
pub fn embedding_gather(table: &[f32], tokens: &[u32], lo: usize, h: usize, out: &mut [f32]) {
    let rows = table.len() / h.max(1);
    for (r, &id) in tokens.iter().enumerate() {
        let id = id as usize;
        if id >= lo && id < lo + rows {
            out[r * h..(r + 1) * h].copy_from_slice(&table[(id - lo) * h..(id - lo + 1) * h]);
        }
    }
}

/// grad[tokens[r] - lo] += dy[r] for the tokens in the gradient's rows from `lo`.
pub fn embedding_scatter_add(dy: &[f32], tokens: &[u32], lo: usize, h: usize, grad: &mut [f32]) {
    let rows = grad.len() / h.max(1);
    for (r, &id) in tokens.iter().enumerate() {
        let id = id as usize;
        if id >= lo && id < lo + rows {
            let dst = &mut grad[(id - lo) * h..(id - lo + 1) * h];
            for (d, s) in dst.iter_mut().zip(&dy[r * h..(r + 1) * h]) {
                *d += s;
            }
        }
    }
}

impl EmbeddingOps<Cpu> for CpuOps {
    fn embedding_gather(
        &self,
        table: View<'_, Tensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let h = out.cols();
        embedding_gather(src(&table), tokens, lo, h, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn embedding_scatter_add(
        &self,
        dy: &Tensor,
        tokens: &[u32],
        lo: usize,
        mut grad: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let h = dy.cols();
        embedding_scatter_add(dy.data(), tokens, lo, h, dst(&mut grad));
        store_view(&mut grad);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_rows_outside_the_shard_are_skipped() {
        // Shard of rows 2..4 of a vocabulary, h = 2.
        let table = [1.0, 2.0, 3.0, 4.0];
        let mut out = vec![0.0; 6];
        embedding_gather(&table, &[3, 0, 2], 2, 2, &mut out);
        assert_eq!(out, vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
        let mut grad = vec![0.0; 4];
        embedding_scatter_add(&[1.0, 1.0, 5.0, 5.0, 2.0, 2.0], &[3, 0, 3], 2, 2, &mut grad);
        assert_eq!(grad, vec![0.0, 0.0, 3.0, 3.0]);
    }
}
