//! Row re-layouts and row lookups: the fused QKV projection split into Q, K and V and merged
//! back, and the vocab-parallel embedding's row gather and its gradient's scatter-add.

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
