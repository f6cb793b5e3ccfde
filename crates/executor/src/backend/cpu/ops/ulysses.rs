//! DeepSpeed-Ulysses' all-to-all layouts (Jacobs et al. 2023): packing sequence shards into
//! per-head-group send chunks and head shards into per-rank chunks, and unpacking the received
//! buffers. Row walks shared by pack and unpack, so the two are exact inverses.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::{UlyssesGeo, UlyssesLayout, UlyssesOps, UlyssesPart};
use crate::error::ExecError;

/// Walks the sequence-shard side [b, s_loc, H, e]: for chunk j (head group j), each part and
/// row, `f(part, offset in the shard, offset in the chunk buffer, width)`.
fn walk_seq(g: &UlyssesGeo, parts: &[UlyssesPart], mut f: impl FnMut(usize, usize, usize, usize)) {
    let (_, chunk) = g.part_offsets(parts);
    for j in 0..g.cp {
        let mut off = j * chunk;
        for (t, p) in parts.iter().enumerate() {
            let w = p.heads / g.cp * p.e;
            for row in 0..g.b * g.s_loc {
                f(t, row * p.heads * p.e + j * w, off, w);
                off += w;
            }
        }
    }
}

/// Walks the head-shard side [b, s, Hl, e]: for chunk j (rank j's rows), each part and row,
/// `f(part, offset in the head shard, offset in the chunk buffer, width)`.
fn walk_head(g: &UlyssesGeo, parts: &[UlyssesPart], mut f: impl FnMut(usize, usize, usize, usize)) {
    let (_, chunk) = g.part_offsets(parts);
    let s = g.s_loc * g.cp;
    for j in 0..g.cp {
        let mut off = j * chunk;
        for (t, p) in parts.iter().enumerate() {
            let w = p.heads / g.cp * p.e;
            for bi in 0..g.b {
                for il in 0..g.s_loc {
                    f(t, (bi * s + j * g.s_loc + il) * w, off, w);
                    off += w;
                }
            }
        }
    }
}

fn walk(
    g: &UlyssesGeo,
    layout: UlyssesLayout,
    parts: &[UlyssesPart],
    f: impl FnMut(usize, usize, usize, usize),
) {
    match layout {
        UlyssesLayout::Seq => walk_seq(g, parts, f),
        UlyssesLayout::Head => walk_head(g, parts, f),
    }
}

/// Tensors on side `from` -> send chunks.
pub fn pack(g: &UlyssesGeo, from: UlyssesLayout, xs: &[(&[f32], UlyssesPart)], out: &mut [f32]) {
    let parts: Vec<UlyssesPart> = xs.iter().map(|x| x.1).collect();
    walk(g, from, &parts, |t, x, c, w| {
        out[c..c + w].copy_from_slice(&xs[t].0[x..x + w])
    });
}

/// Received chunks -> tensors on side `to`.
pub fn unpack(
    g: &UlyssesGeo,
    to: UlyssesLayout,
    recv: &[f32],
    parts: &[UlyssesPart],
    outs: &mut [&mut [f32]],
) {
    walk(g, to, parts, |t, x, c, w| {
        outs[t][x..x + w].copy_from_slice(&recv[c..c + w])
    });
}

impl UlyssesOps<Cpu> for CpuOps {
    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&Tensor, UlyssesPart)],
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let hx: Vec<(&[f32], UlyssesPart)> = xs.iter().map(|(t, p)| (t.data(), *p)).collect();
        pack(geo, from, &hx, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &Tensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut Tensor],
    ) -> Result<(), ExecError> {
        {
            let mut ho: Vec<&mut [f32]> = outs.iter_mut().map(|t| t.data_mut()).collect();
            unpack(geo, to, recv.data(), parts, &mut ho);
        }
        for t in outs.iter_mut() {
            store_all(t);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_on_the_same_side_is_the_identity() {
        let g = UlyssesGeo {
            b: 2,
            s_loc: 3,
            cp: 2,
        };
        let parts = [
            UlyssesPart { heads: 4, e: 2 },
            UlyssesPart { heads: 2, e: 1 },
        ];
        let a: Vec<f32> = (0..2 * 3 * 4 * 2).map(|x| x as f32).collect();
        let b: Vec<f32> = (0..2 * 3 * 2).map(|x| -(x as f32)).collect();
        for layout in [UlyssesLayout::Seq, UlyssesLayout::Head] {
            let mut buf = vec![0.0; a.len() + b.len()];
            pack(&g, layout, &[(&a, parts[0]), (&b, parts[1])], &mut buf);
            let (mut a2, mut b2) = (vec![0.0; a.len()], vec![0.0; b.len()]);
            unpack(&g, layout, &buf, &parts, &mut [&mut a2, &mut b2]);
            assert_eq!((a2, b2), (a.clone(), b.clone()));
        }
    }
}
