//! The point-to-point pieces of a flat-range exchange: every member j holds the elements
//! `have[j]` of a flat buffer and wants `want[j]`; member i sends j the intersection of
//! `have[i]` and `want[j]`. The ZeRO gathers and reduce-scatters over uneven shards, and the
//! in-place collectives, are built from these as grouped sends and receives (as Megatron's
//! distributed optimizer moves contiguous ranges of one flat buffer). Host logic only.

use std::ops::Range;

/// One piece: with `peer`, `len` elements from offset `src_off` of the sender's held range to
/// offset `dst_off` of the receiver's wanted range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub peer: usize,
    pub src_off: usize,
    pub dst_off: usize,
    pub len: usize,
}

fn meet(a: &Range<usize>, b: &Range<usize>) -> Option<Range<usize>> {
    let r = a.start.max(b.start)..a.end.min(b.end);
    (r.start < r.end).then_some(r)
}

/// The pieces member `me` sends (to each peer, in member order) and receives (from each).
pub fn plan(have: &[Range<usize>], want: &[Range<usize>], me: usize) -> (Vec<Piece>, Vec<Piece>) {
    let sends = want
        .iter()
        .enumerate()
        .filter_map(|(j, w)| {
            meet(&have[me], w).map(|r| Piece {
                peer: j,
                src_off: r.start - have[me].start,
                dst_off: r.start - w.start,
                len: r.len(),
            })
        })
        .collect();
    let recvs = have
        .iter()
        .enumerate()
        .filter_map(|(j, h)| {
            meet(h, &want[me]).map(|r| Piece {
                peer: j,
                src_off: r.start - h.start,
                dst_off: r.start - want[me].start,
                len: r.len(),
            })
        })
        .collect();
    (sends, recvs)
}

/// Ranges from the flat (start, end) pairs every member published.
pub fn ranges(pairs: &[Vec<u64>], at: usize) -> Vec<Range<usize>> {
    pairs
        .iter()
        .map(|p| p[at] as usize..p[at + 1] as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays the plan of every member on host buffers; returns what each received.
    fn simulate(global: &[f32], have: &[Range<usize>], want: &[Range<usize>]) -> Vec<Vec<f32>> {
        let n = have.len();
        let mut out: Vec<Vec<f32>> = want.iter().map(|w| vec![f32::NAN; w.len()]).collect();
        for (me, o) in out.iter_mut().enumerate() {
            let (_, recvs) = plan(have, want, me);
            for p in recvs {
                // What the peer sends me must be what it plans to send.
                let (sends, _) = plan(have, want, p.peer);
                assert!(sends
                    .iter()
                    .any(|s| s.peer == me && s.len == p.len && s.src_off == p.src_off));
                let src = &global[have[p.peer].clone()][p.src_off..p.src_off + p.len];
                o[p.dst_off..p.dst_off + p.len].copy_from_slice(src);
            }
        }
        assert_eq!(out.len(), n);
        out
    }

    #[test]
    fn uneven_shards_gather_into_every_wanted_range() {
        // ZeRO's shards of 10 elements over 3 members: ceil(10/3) = 4 per member, the last
        // one short.
        let global: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let have = vec![0..4, 4..8, 8..10];
        for want in [vec![0..10, 0..10, 0..10], vec![3..9, 0..2, 5..10]] {
            let got = simulate(&global, &have, &want);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.as_slice(), &global[w.clone()]);
            }
        }
    }

    #[test]
    fn pieces_cover_a_wanted_range_exactly_once() {
        let have = vec![0..5, 5..5, 3..12];
        let want = vec![2..11, 0..12, 4..6];
        for me in 0..3 {
            let (_, recvs) = plan(&have, &want, me);
            let mut hits = vec![0u32; want[me].len()];
            for p in recvs {
                hits[p.dst_off..p.dst_off + p.len]
                    .iter_mut()
                    .for_each(|h| *h += 1);
            }
            // Overlapping holders (0..5 and 3..12) both send the overlap: a reduction sums
            // every holder's part; a gather needs disjoint holders, as ZeRO's shards are.
            for (i, h) in hits.iter().enumerate() {
                let x = want[me].start + i;
                let holders = have.iter().filter(|r| r.contains(&x)).count() as u32;
                assert_eq!(*h, holders, "member {me} element {x}");
            }
        }
        assert_eq!(
            ranges(&[vec![1, 2, 3, 4], vec![5, 6, 7, 8]], 2),
            vec![3..4, 7..8]
        );
    }
}
