//! The flash kernels' MLA widths and dropout; its own binary, run by scripts/gpu-proof.sh under compute-sanitizer.
//!
//! backend/cuda/ops/flash/flash.cu's scalar kernels with MLA's value heads narrower than its query/key heads
//! (dv < d) and with attention dropout drawn inside the kernels, against the CPU twin
//! (executor/src/backend/cpu/ops/flash.rs) on fresh random inputs, the statistics poisoned
//! (NaN) first: relative error below 1e-5 in fp32; and the dropout mask the kernels apply equal
//! to rng/attention.rs's, element for element. Needs a GPU, its driver and NVRTC: prints why
//! it skips otherwise.

#[path = "../common/mod.rs"]
mod common;

use common::{check, gpu, rand, Gpu};
use parsim_executor::backend::cpu::ops::flash;
use parsim_executor::backend::cuda::ops;
use parsim_executor::backend::ops::{BlockQuery, BlockShape, BlockStats, Side};
use parsim_executor::rng::AttnDropout;
use parsim_plan::DType;

/// One case's inputs and the outputs of forward (o, lse) and backward (dq, dk, dv).
struct Run {
    o: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

struct Inputs<'a> {
    sh: &'a BlockShape,
    qpos: &'a [u32],
    kpos: &'a [u32],
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
}

/// The CPU twin: one forward block, finish, delta, one backward block.
fn cpu(x: &Inputs) -> Run {
    let (sh, sq) = (x.sh, x.qpos.len());
    let nst = sh.b * sh.hq * sq;
    let gc = parsim_executor::backend::cpu::gemm_counter::GemmCounter::new();
    let (qs, ks) = (
        Side {
            pos: x.qpos,
            tile: 8,
        },
        Side {
            pos: x.kpos,
            tile: 8,
        },
    );
    let mut o = vec![0.0; x.dout.len()];
    let (mut mx, mut sm, mut lse) = (vec![f32::NEG_INFINITY; nst], vec![0.0; nst], vec![0.0; nst]);
    let mut tile = vec![0.0; 64];
    flash::forward_block(
        &gc,
        sh,
        BlockQuery { q: &x.q, side: qs },
        (&x.k, &x.v, ks),
        &mut o,
        &mut flash::Online {
            max: &mut mx,
            sum: &mut sm,
        },
        &mut tile,
    );
    flash::finish(sh, sq, &mut o, &mx, &sm, &mut lse);
    let mut delta = vec![0.0; sh.b * sq * sh.hq];
    flash::delta(sh, sq, &x.dout, &o, &mut delta);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; x.q.len()],
        vec![0.0; x.k.len()],
        vec![0.0; x.v.len()],
    );
    let (mut pt, mut dpt) = (vec![0.0; 64], vec![0.0; 64]);
    flash::backward_block(
        &gc,
        sh,
        BlockQuery { q: &x.q, side: qs },
        (&x.k, &x.v, ks),
        BlockStats {
            dout: &x.dout,
            lse: &lse,
            delta: &delta,
        },
        (&mut dq, &mut dk, &mut dv),
        (&mut pt, &mut dpt),
    );
    Run { o, lse, dq, dk, dv }
}

/// The same on the GPU's scalar kernels (fp32), the log-sum-exp and delta poisoned first.
fn device(g: &Gpu, x: &Inputs) -> Run {
    let (sh, sq, sk) = (x.sh, x.qpos.len(), x.kpos.len());
    let nst = sh.b * sh.hq * sq;
    let (pq, pk, pv, pdo) = (g.up(&x.q), g.up(&x.k), g.up(&x.v), g.up(&x.dout));
    let (pqp, pkp) = (g.up(x.qpos), g.up(x.kpos));
    let pacc = g.up(&vec![0.0f32; x.dout.len()]);
    let (pmx, psm, plse, pdl) = (
        g.up(&vec![f32::NEG_INFINITY; nst]),
        g.up(&vec![0.0f32; nst]),
        g.poisoned(nst),
        g.poisoned(sh.b * sq * sh.hq),
    );
    let (pdq, pdk, pdv) = (
        g.up(&vec![0.0f32; x.q.len()]),
        g.up(&vec![0.0f32; x.k.len()]),
        g.up(&vec![0.0f32; x.v.len()]),
    );
    let qr = ops::flash::kernel::Rows {
        pos: g.p(&pqp),
        len: sq,
    };
    let kr = ops::flash::kernel::Rows {
        pos: g.p(&pkp),
        len: sk,
    };
    let (s, k, f) = (&g.s, &g.k, DType::F32);
    // SAFETY: every buffer holds the shape its wrapper documents.
    unsafe {
        ops::flash::kernel::forward_block(
            s,
            k,
            f,
            sh,
            g.p(&pq),
            qr,
            g.p(&pk),
            g.p(&pv),
            kr,
            g.p(&pacc),
            g.p(&pmx),
            g.p(&psm),
        )
        .unwrap();
        ops::flash::kernel::finish(s, k, sh, sq, g.p(&pacc), g.p(&pmx), g.p(&psm), g.p(&plse))
            .unwrap();
        ops::flash::kernel::delta(s, k, f, sh, sq, g.p(&pdo), g.p(&pacc), g.p(&pdl)).unwrap();
        ops::flash::kernel::backward_block(
            s,
            k,
            f,
            sh,
            g.p(&pq),
            qr,
            g.p(&pk),
            g.p(&pv),
            kr,
            g.p(&pdo),
            g.p(&plse),
            g.p(&pdl),
            g.p(&pdq),
            g.p(&pdk),
            g.p(&pdv),
        )
        .unwrap();
    }
    Run {
        o: g.down(&pacc),
        lse: g.down(&plse),
        dq: g.down(&pdq),
        dk: g.down(&pdk),
        dv: g.down(&pdv),
    }
}

fn dropout(p: f32) -> AttnDropout {
    AttnDropout {
        seed: 0x5EED_0000_0000_0017,
        step: 2,
        layer: 5,
        p,
        head0: 4,
        sample0: 3,
        seq: 64,
    }
}

/// GQA (4 query heads on 2 K/V heads), two sequences, the zigzag CP shard of a 64-row sequence
/// over cp 2 as queries and every key: value heads as wide as the query/key heads and
/// narrower (MLA: d = 24 of 16 no-rotary + 8 rotary, dv = 16; d = 192, dv = 128 as
/// DeepSeek-V3), each without and with attention dropout (p = 0.2, heads and samples shifted as
/// on TP rank 1 of a later microbatch).
#[test]
fn flash_kernels_match_the_cpu_with_narrower_values_and_attention_dropout() {
    let Some(g) = gpu() else { return };
    let qpos: Vec<u32> = (0..16).chain(48..64).collect();
    let kpos: Vec<u32> = (0..64).collect();
    let mut seed = 100;
    for (d, dv) in [(72, 72), (24, 16), (192, 128)] {
        for drop in [None, Some(dropout(0.2))] {
            let sh = BlockShape {
                b: 2,
                hq: 4,
                hk: 2,
                d,
                dv,
                dropout: drop,
                span: parsim_plan::plan::AttnSpan::Full,
            };
            let (sq, sk) = (qpos.len(), kpos.len());
            seed += 4;
            let x = Inputs {
                sh: &sh,
                qpos: &qpos,
                kpos: &kpos,
                q: rand(sh.b * sq * sh.hq * d, seed),
                k: rand(sh.b * sk * sh.hk * d, seed + 1),
                v: rand(sh.b * sk * sh.hk * dv, seed + 2),
                dout: rand(sh.b * sq * sh.hq * dv, seed + 3),
            };
            let (want, got) = (cpu(&x), device(&g, &x));
            let label = format!("d {d} dv {dv} dropout {}", drop.is_some());
            check(&format!("{label} o"), &got.o, &want.o, 1e-5);
            check(&format!("{label} lse"), &got.lse, &want.lse, 1e-5);
            check(&format!("{label} dq"), &got.dq, &want.dq, 1e-5);
            check(&format!("{label} dk"), &got.dk, &want.dk, 1e-5);
            check(&format!("{label} dv"), &got.dv, &want.dv, 1e-5);
        }
    }
}

/// The mask itself: with one-hot values (v of key c is the unit vector e_c, dv = 64 keys) the
/// output of query row r is its probabilities times the mask, so output j is zero exactly
/// where key j is in the future or dropped. The kernels' zeros are rng/attention.rs's drops,
/// element for element, over 2 sequences x 4 heads x 32 rows x every visible key at p = 0.3
/// (and about 30% of them are dropped).
#[test]
fn flash_dropout_mask_equals_the_cpus_exactly() {
    let Some(g) = gpu() else { return };
    let dr = dropout(0.3);
    let sh = BlockShape {
        b: 2,
        hq: 4,
        hk: 2,
        d: 16,
        dv: 64,
        dropout: Some(dr),
        span: parsim_plan::plan::AttnSpan::Full,
    };
    let qpos: Vec<u32> = (0..16).chain(48..64).collect();
    let kpos: Vec<u32> = (0..64).collect();
    let (sq, sk) = (qpos.len(), kpos.len());
    let mut v = vec![0.0f32; sh.b * sk * sh.hk * sh.dv];
    for bi in 0..sh.b {
        for c in 0..sk {
            for kh in 0..sh.hk {
                v[((bi * sk + c) * sh.hk + kh) * sh.dv + c] = 1.0;
            }
        }
    }
    let x = Inputs {
        sh: &sh,
        qpos: &qpos,
        kpos: &kpos,
        q: rand(sh.b * sq * sh.hq * sh.d, 7),
        k: rand(sh.b * sk * sh.hk * sh.d, 8),
        v,
        dout: rand(sh.b * sq * sh.hq * sh.dv, 9),
    };
    let got = device(&g, &x);
    let (mut visible, mut dropped) = (0usize, 0usize);
    for bi in 0..sh.b {
        for (r, &qp) in qpos.iter().enumerate() {
            for h in 0..sh.hq {
                let row = &got.o[((bi * sq + r) * sh.hq + h) * sh.dv..][..sh.dv];
                for (j, &oj) in row.iter().enumerate() {
                    let kp = j as u32;
                    if kp > qp {
                        assert_eq!(oj, 0.0, "future key {kp} of query {qp}");
                        continue;
                    }
                    visible += 1;
                    let keep = dr.keep(bi, h, qp, kp);
                    dropped += usize::from(!keep);
                    assert_eq!(
                        oj != 0.0,
                        keep,
                        "sequence {bi} head {h} query {qp} key {kp}: output {oj}"
                    );
                }
            }
        }
    }
    let frac = dropped as f64 / visible as f64;
    let sigma = (0.3 * 0.7 / visible as f64).sqrt();
    assert!((frac - 0.3).abs() < 5.0 * sigma, "dropped {frac}");
    check("one-hot o", &got.o, &cpu(&x).o, 1e-5);
}
