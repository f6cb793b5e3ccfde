//! Sliding-window and chunked attention and attention sinks against a naive reference built
//! here from their definitions (f64, every (query, key) pair): the softmax over the keys a
//! query sees plus the sink's logit (GPT-OSS: `softmax([scores, sink])`, the sink's column
//! dropped), for the whole-sequence kernel and for the block kernel with K/V blocks visited
//! out of order at zigzag positions; the gradients against central finite differences.

use super::attention::{attn_bwd, attn_fwd, AttnSaved};
use super::flash::{backward_block, delta, finish, forward_block, sink_fwd, sink_grad, Online};
use crate::backend::cpu::device::CpuOps;
use crate::backend::cpu::tensor::Tensor;
use crate::backend::ops::{
    AttnShape, BlockQuery, BlockShape, BlockStats, Keep, Qkv, QkvGrads, Side,
};
use parsim_plan::plan::AttnSpan;
use parsim_plan::DType;

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Shapes: 2 sequences of 12 positions, 4 query heads over 2 K/V heads of 4 features.
const B: usize = 2;
const S: usize = 12;
const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 4;

fn whole(span: AttnSpan) -> AttnShape {
    AttnShape {
        b: B,
        s: S,
        heads: HQ,
        kv_heads: HK,
        d: D,
        dv: D,
        dropout: None,
        span,
    }
}

fn block(span: AttnSpan) -> BlockShape {
    BlockShape {
        b: B,
        hq: HQ,
        hk: HK,
        d: D,
        dv: D,
        dropout: None,
        span,
    }
}

/// Whether query position i sees key position j, from the definitions: causal, within the
/// last w positions (window), or in the same chunk of c.
fn sees(span: AttnSpan, i: usize, j: usize) -> bool {
    j <= i
        && match span {
            AttnSpan::Full => true,
            AttnSpan::Window(w) => i - j < w,
            AttnSpan::Chunk(c) => i / c == j / c,
        }
}

/// The naive attention output [b, s, hq, d] (f64), with the sink logits when given.
fn naive(span: AttnSpan, q: &[f32], k: &[f32], v: &[f32], sinks: Option<&[f32]>) -> Vec<f64> {
    let mut o = vec![0.0f64; B * S * HQ * D];
    let scale = 1.0 / (D as f64).sqrt();
    for bi in 0..B {
        for h in 0..HQ {
            let g = h / (HQ / HK);
            for i in 0..S {
                let qi = &q[((bi * S + i) * HQ + h) * D..][..D];
                let mut logits: Vec<(usize, f64)> = (0..S)
                    .filter(|&j| sees(span, i, j))
                    .map(|j| {
                        let kj = &k[((bi * S + j) * HK + g) * D..][..D];
                        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| (a * b) as f64).sum();
                        (j, dot * scale)
                    })
                    .collect();
                let sink = sinks.map(|z| f64::from(z[h]));
                let max = logits
                    .iter()
                    .map(|x| x.1)
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = logits.iter().map(|x| (x.1 - max).exp()).sum::<f64>()
                    + sink.map_or(0.0, |z| (z - max).exp());
                for (j, l) in logits.iter_mut() {
                    let p = (*l - max).exp() / denom;
                    let vj = &v[((bi * S + *j) * HK + g) * D..][..D];
                    let oi = &mut o[((bi * S + i) * HQ + h) * D..][..D];
                    oi.iter_mut().zip(vj).for_each(|(x, y)| *x += p * *y as f64);
                }
            }
        }
    }
    o
}

fn worst(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
}

const SPANS: [AttnSpan; 4] = [
    AttnSpan::Full,
    AttnSpan::Window(3),
    AttnSpan::Window(5),
    AttnSpan::Chunk(4),
];

/// Whole-sequence kernel, then the sinks folded in, equals the naive attention.
fn whole_fwd(
    dev: &CpuOps,
    span: AttnSpan,
    x: &[Vec<f32>; 3],
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0.0; B * S * HQ * D];
    let saved = attn_fwd(
        dev,
        &whole(span),
        Qkv {
            q: &x[0],
            k: &x[1],
            v: &x[2],
        },
        &mut o,
        Keep::Lse,
        DType::F32,
    );
    let AttnSaved::Lse(l) = saved else {
        panic!("no lse")
    };
    let mut lse = l.data().to_vec();
    if let Some(z) = sinks {
        sink_fwd(&block(span), S, &mut o, &mut lse, z);
    }
    (o, lse)
}

#[test]
fn windows_chunks_and_sinks_match_the_naive_softmax() {
    let dev = CpuOps::new();
    let x = [
        rand(B * S * HQ * D, 1),
        rand(B * S * HK * D, 2),
        rand(B * S * HK * D, 3),
    ];
    // Sinks of either sign, one larger than most scores (a head attending mostly to nothing).
    let sinks = [0.3f32, -1.0, 2.5, 0.0];
    for span in SPANS {
        for z in [None, Some(&sinks[..])] {
            let want = naive(span, &x[0], &x[1], &x[2], z);
            let (o, _) = whole_fwd(&dev, span, &x, z);
            let e = worst(&o, &want);
            assert!(e < 1e-5, "{span:?} sinks {}: {e}", z.is_some());
        }
    }
    // The sinks change the output (they are not a no-op).
    let (a, _) = whole_fwd(&dev, AttnSpan::Window(3), &x, None);
    let (b, _) = whole_fwd(&dev, AttnSpan::Window(3), &x, Some(&sinks));
    assert!(worst(&a, &b.iter().map(|&v| v as f64).collect::<Vec<_>>()) > 1e-2);
}

/// K/V cut into blocks of 3 positions visited in the order 2, 0, 3, 1 against queries at
/// zigzag positions (rows 0..3 and 9..12 first, then 3..9): output, log-sum-exp and the
/// computed (unmasked) pairs equal the naive ones.
#[test]
fn block_kernel_with_spans_and_sinks_matches_the_naive_softmax() {
    let dev = CpuOps::new();
    let x = [
        rand(B * S * HQ * D, 4),
        rand(B * S * HK * D, 5),
        rand(B * S * HK * D, 6),
    ];
    let sinks = [1.0f32, -0.5, 0.25, 2.0];
    let qpos: Vec<u32> = (0..3).chain(9..12).chain(3..9).collect();
    let perm = |t: &[f32], heads: usize, pos: &[u32]| -> Vec<f32> {
        let mut out = Vec::new();
        for bi in 0..B {
            for &p in pos {
                let lo = (bi * S + p as usize) * heads * D;
                out.extend_from_slice(&t[lo..lo + heads * D]);
            }
        }
        out
    };
    let q = perm(&x[0], HQ, &qpos);
    for span in SPANS {
        let sh = block(span);
        let mut acc = vec![0.0; q.len()];
        let (mut mx, mut sm) = (vec![f32::NEG_INFINITY; B * HQ * S], vec![0.0; B * HQ * S]);
        let mut tile = vec![0.0; S * 3];
        let mut work = 0;
        for j in [2u32, 0, 3, 1] {
            let kp: Vec<u32> = (3 * j..3 * j + 3).collect();
            let mut st = Online {
                max: &mut mx,
                sum: &mut sm,
            };
            let (kb, vb) = (perm(&x[1], HK, &kp), perm(&x[2], HK, &kp));
            let (qs, ks) = (
                Side {
                    pos: &qpos,
                    tile: 4,
                },
                Side { pos: &kp, tile: 3 },
            );
            let g = dev.gemm_counter();
            work += forward_block(
                g,
                &sh,
                BlockQuery { q: &q, side: qs },
                (&kb, &vb, ks),
                &mut acc,
                &mut st,
                &mut tile,
            );
        }
        let pairs = (0..S)
            .map(|i| (0..S).filter(|&j| sees(span, i, j)).count())
            .sum::<usize>();
        assert_eq!(work as usize, B * HQ * pairs, "{span:?}: computed pairs");
        let mut lse = vec![0.0; B * HQ * S];
        finish(&sh, S, &mut acc, &mx, &sm, &mut lse);
        sink_fwd(&sh, S, &mut acc, &mut lse, &sinks);
        let want = naive(span, &x[0], &x[1], &x[2], Some(&sinks));
        let want: Vec<f64> = perm(
            &want.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            HQ,
            &qpos,
        )
        .into_iter()
        .map(f64::from)
        .collect();
        let e = worst(&acc, &want);
        assert!(e < 1e-5, "{span:?}: block output off by {e}");
    }
}

/// L = sum(r * O): the analytic gradients of Q, K, V (whole-sequence kernel on the final
/// log-sum-exp) and of the sinks ([`sink_grad`]) against central differences of the naive
/// attention, for a window and a chunk; the block kernel's gradients equal the whole one's.
#[test]
fn span_and_sink_gradients_match_finite_differences() {
    let dev = CpuOps::new();
    let r = rand(B * S * HQ * D, 9);
    for span in [AttnSpan::Window(3), AttnSpan::Chunk(4)] {
        let mut x = [
            rand(B * S * HQ * D, 7),
            rand(B * S * HK * D, 8),
            rand(B * S * HK * D, 10),
        ];
        let mut z = vec![0.5f32, -0.3, 1.2, 0.0];
        let (o, lse) = whole_fwd(&dev, span, &x, Some(&z));
        let cat = crate::tracker::Category::Activations;
        let lse_t = Tensor::new(dev.memory(), cat, &[B, HQ, S], lse.clone());
        let saved = AttnSaved::Lse(lse_t);
        let mut g = [
            vec![0.0; x[0].len()],
            vec![0.0; x[1].len()],
            vec![0.0; x[2].len()],
        ];
        let [g0, g1, g2] = &mut g;
        attn_bwd(
            &dev,
            &whole(span),
            Qkv {
                q: &x[0],
                k: &x[1],
                v: &x[2],
            },
            &saved,
            &r,
            QkvGrads {
                dq: g0,
                dk: g1,
                dv: g2,
            },
        );
        let mut dl = vec![0.0; B * S * HQ];
        delta(&block(span), S, &r, &o, &mut dl);
        let mut gz = vec![0.0; HQ];
        sink_grad(&block(span), S, &lse, &dl, &z, &mut gz);
        let loss = |x: &[Vec<f32>; 3], z: &[f32]| -> f64 {
            let o = naive(span, &x[0], &x[1], &x[2], Some(z));
            o.iter().zip(&r).map(|(a, b)| a * f64::from(*b)).sum()
        };
        let eps = 1e-3f32;
        let mut worst_e = 0.0f64;
        for t in 0..3 {
            for i in (0..x[t].len()).step_by(7) {
                let keep = x[t][i];
                x[t][i] = keep + eps;
                let up = loss(&x, &z);
                x[t][i] = keep - eps;
                let down = loss(&x, &z);
                x[t][i] = keep;
                let fd = (up - down) / (2.0 * f64::from(eps));
                worst_e = worst_e.max((fd - f64::from(g[t][i])).abs());
            }
        }
        for h in 0..HQ {
            let keep = z[h];
            z[h] = keep + eps;
            let up = loss(&x, &z);
            z[h] = keep - eps;
            let down = loss(&x, &z);
            z[h] = keep;
            let fd = (up - down) / (2.0 * f64::from(eps));
            worst_e = worst_e.max((fd - f64::from(gz[h])).abs());
            assert!(gz[h].abs() > 1e-4, "{span:?}: sink {h} has no gradient");
        }
        assert!(
            worst_e < 2e-3,
            "{span:?}: worst |fd - analytic| = {worst_e}"
        );

        // The block kernel (one block of the whole sequence) gives the same dQ, dK, dV.
        let sh = block(span);
        let pos: Vec<u32> = (0..S as u32).collect();
        let side = Side { pos: &pos, tile: 5 };
        let mut dq = vec![0.0; x[0].len()];
        let (mut dk, mut dv) = (vec![0.0; x[1].len()], vec![0.0; x[2].len()]);
        let (mut pt, mut dpt) = (vec![0.0; 25], vec![0.0; 25]);
        backward_block(
            dev.gemm_counter(),
            &sh,
            BlockQuery { q: &x[0], side },
            (&x[1], &x[2], side),
            BlockStats {
                dout: &r,
                lse: &lse,
                delta: &dl,
            },
            (&mut dq, &mut dk, &mut dv),
            (&mut pt, &mut dpt),
        );
        for (a, b) in [(&dq, &g[0]), (&dk, &g[1]), (&dv, &g[2])] {
            let e = worst(a, &b.iter().map(|&v| v as f64).collect::<Vec<_>>());
            assert!(e < 1e-5, "{span:?}: block gradient off by {e}");
        }
    }
}

/// The span's first key, by hand: a window of 1 or a chunk of 1 is the query alone; a window
/// of 3 reaches two back; chunks of 4 start at multiples of 4; a span wider than the u32
/// positions (a hand-made plan) covers every earlier key rather than wrapping or dividing by 0.
#[test]
fn first_keys_by_hand() {
    for qp in [0u32, 5, 1 << 20] {
        assert_eq!(AttnSpan::Window(1).first_key(qp), qp);
        assert_eq!(AttnSpan::Chunk(1).first_key(qp), qp);
        assert_eq!(AttnSpan::Full.first_key(qp), 0);
        assert_eq!(AttnSpan::Window(usize::MAX).first_key(qp), 0);
        assert_eq!(AttnSpan::Chunk(usize::MAX).first_key(qp), 0);
    }
    assert_eq!(AttnSpan::Window(3).first_key(5), 3);
    assert_eq!(AttnSpan::Window(3).first_key(1), 0);
    assert_eq!(AttnSpan::Chunk(4).first_key(7), 4);
    assert_eq!(AttnSpan::Chunk(4).first_key(8), 8);
}
