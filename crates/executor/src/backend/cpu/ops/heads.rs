//! Multi-head latent attention's head layout (DeepSeek-V2, section 2.1.3, decoupled rotary):
//! each query/key head is its no-rotary part then its rotary part, the key's rotary part one
//! vector shared by all heads. `heads_concat` builds [n, heads (da + db)] from the two parts;
//! `heads_split` is its backward (a shared part's gradient is the sum over the heads).

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::HeadsOps;
use crate::error::ExecError;

/// out[r, h, :] = [a[r, h, :], b[r, h or 0, :]]: `a` [n, heads da]; `b` [n, heads db], or
/// [n, db] shared by every head.
pub fn heads_concat(a: &[f32], b: &[f32], out: &mut [f32], n: usize, heads: usize) {
    let (da, w) = widths(a, out, n, heads);
    let db = w - da;
    let shared = b.len() == n * db;
    let bw = b.len() / n.max(1);
    for r in 0..n {
        for h in 0..heads {
            let o = &mut out[(r * heads + h) * w..(r * heads + h + 1) * w];
            o[..da].copy_from_slice(&a[(r * heads + h) * da..(r * heads + h + 1) * da]);
            let bo = if shared { r * bw } else { r * bw + h * db };
            o[da..].copy_from_slice(&b[bo..bo + db]);
        }
    }
}

/// The backward of [`heads_concat`]: `da` and `db` written from `dout`; a shared `db`
/// ([n, db]) sums its heads' gradients.
pub fn heads_split(dout: &[f32], da: &mut [f32], db: &mut [f32], n: usize, heads: usize) {
    let (wa, w) = widths(da, dout, n, heads);
    let wb = w - wa;
    let shared = db.len() == n * wb;
    let bw = db.len() / n.max(1);
    db.fill(0.0);
    for r in 0..n {
        for h in 0..heads {
            let g = &dout[(r * heads + h) * w..(r * heads + h + 1) * w];
            da[(r * heads + h) * wa..(r * heads + h + 1) * wa].copy_from_slice(&g[..wa]);
            let bo = if shared { r * bw } else { r * bw + h * wb };
            for (x, y) in db[bo..bo + wb].iter_mut().zip(&g[wa..]) {
                *x += y;
            }
        }
    }
}

/// (per-head width of the first part, per-head width of the whole).
fn widths(a: &[f32], out: &[f32], n: usize, heads: usize) -> (usize, usize) {
    let per = (n * heads).max(1);
    (a.len() / per, out.len() / per)
}

impl HeadsOps<Cpu> for CpuOps {
    fn heads_concat(
        &self,
        a: &Tensor,
        b: &Tensor,
        heads: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = out.rows();
        heads_concat(a.data(), b.data(), out.data_mut(), n, heads);
        store_all(out);
        Ok(())
    }

    fn heads_split(
        &self,
        dout: &Tensor,
        heads: usize,
        da: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = dout.rows();
        heads_split(dout.data(), da.data_mut(), db.data_mut(), n, heads);
        store_all(da);
        store_all(db);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// heads_split is the adjoint of heads_concat: <concat(a, b), g> = <a, da> + <b, db>
    /// for (da, db) = split(g), with per-head and shared second parts.
    #[test]
    fn split_is_the_adjoint_of_concat() {
        let (n, heads, wa, wb) = (3, 4, 2, 3);
        let val = |i: usize, s: f32| ((i as f32 * 0.37 + s).sin() * 10.0).round() / 4.0;
        for shared in [false, true] {
            let hb = if shared { 1 } else { heads };
            let a: Vec<f32> = (0..n * heads * wa).map(|i| val(i, 1.0)).collect();
            let b: Vec<f32> = (0..n * hb * wb).map(|i| val(i, 2.0)).collect();
            let g: Vec<f32> = (0..n * heads * (wa + wb)).map(|i| val(i, 3.0)).collect();
            let mut out = vec![0.0; g.len()];
            heads_concat(&a, &b, &mut out, n, heads);
            let (mut da, mut db) = (vec![0.0; a.len()], vec![9.0; b.len()]);
            heads_split(&g, &mut da, &mut db, n, heads);
            let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
            assert_eq!(dot(&out, &g), dot(&a, &da) + dot(&b, &db));
            // Head 1 of row 2 holds a's head then b's (b's only head when shared).
            let o = (2 * heads + 1) * (wa + wb);
            assert_eq!(
                out[o..o + wa],
                a[(2 * heads + 1) * wa..(2 * heads + 2) * wa]
            );
            let bo = if shared { 2 * wb } else { (2 * heads + 1) * wb };
            assert_eq!(out[o + wa..o + wa + wb], b[bo..bo + wb]);
        }
    }
}
