//! Each CUDA kernel against its CPU twin; its own binary, run by scripts/gpu-proof.sh under compute-sanitizer.
//!
//! Each kernel against its CPU twin (executor/src/backend/cpu/ops) on fresh random inputs with
//! the outputs poisoned (NaN) first: relative error (max |gpu - cpu| / max |cpu|) below 1e-5
//! in fp32 and 1e-2 in bf16. Needs a GPU, its driver and NVRTC: prints why it skips otherwise.

#[path = "../common/mod.rs"]
mod common;

use common::{check, gpu, p, rand, Gpu};
use cudarc::driver::CudaSlice;
use parsim_executor::backend::cpu::ops::{
    activation, adam, cross_entropy, elementwise, flash, norm, rotary,
};
use parsim_executor::backend::cuda::ops;
use parsim_executor::backend::ops::{BlockQuery, BlockShape, BlockStats, Side};
use parsim_plan::plan::{Activation, AdamConfig, Norm};
use parsim_plan::DType;

/// The outputs of the cross-entropy's three readers of the logits.
struct CeReaders {
    max: CudaSlice<f32>,
    probs: CudaSlice<f32>,
    sum: CudaSlice<f32>,
    target: CudaSlice<f32>,
}

/// Row max, exponentials with their row sums and the target logit of `logits` (n x v of
/// `dt` at that address, the shard starting at column `lo`) into NaN-poisoned outputs.
fn ce_readers(
    g: &Gpu,
    dt: DType,
    logits: u64,
    (n, v, lo): (usize, usize, usize),
    targets: u64,
) -> CeReaders {
    let r = CeReaders {
        max: g.poisoned(n),
        probs: g.poisoned(n * v),
        sum: g.poisoned(n),
        target: g.poisoned(n),
    };
    // SAFETY: logits n*v of dt and targets n u32 (the caller's), the rest allocated here.
    unsafe {
        ops::cross_entropy::kernel::ce_row_max(&g.s, &g.k, dt, logits, n, v, g.p(&r.max)).unwrap();
        ops::cross_entropy::kernel::ce_exp_rows(
            &g.s,
            &g.k,
            dt,
            logits,
            n,
            v,
            g.p(&r.max),
            g.p(&r.probs),
            g.p(&r.sum),
        )
        .unwrap();
        ops::cross_entropy::kernel::ce_target_logit(
            &g.s,
            &g.k,
            dt,
            logits,
            n,
            v,
            targets,
            lo,
            g.p(&r.target),
        )
        .unwrap();
    }
    r
}

#[test]
fn elementwise_norm_activation_rotary_adam_and_cross_entropy_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let (rows, h) = (37, 300); // not multiples of the block or the warp
    let x = rand(rows * h, 1);
    let y = rand(rows * h, 2);
    // axpy
    let mut want = y.clone();
    elementwise::axpy(0.5, &x, &mut want);
    let (dx, dy) = (g.up(&x), g.up(&y));
    // SAFETY: both buffers hold rows*h f32.
    unsafe {
        ops::elementwise::kernel::axpy(
            &g.s,
            &g.k,
            DType::F32,
            0.5,
            p(&g, &dx),
            p(&g, &dy),
            rows * h,
        )
    }
    .unwrap();
    check("axpy_f32", &g.down(&dy), &want, 1e-6);
    // norms, forward and both gradients
    for kind in [Norm::RmsNorm, Norm::LayerNorm] {
        let params = rand(2 * h, 3).iter().map(|v| v + 1.0).collect::<Vec<_>>();
        let dyv = rand(rows * h, 4);
        let (mut yw, mut dxw, mut dpw) =
            (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; 2 * h]);
        norm::norm_fwd(kind, &x, &params, h, 1e-5, &mut yw);
        norm::norm_dgrad(kind, &x, &params, &dyv, h, 1e-5, &mut dxw);
        norm::norm_wgrad(kind, &x, &dyv, h, 1e-5, &mut dpw);
        let (px, pp, pdy) = (g.up(&x), g.up(&params), g.up(&dyv));
        let (py, pdx) = (g.poisoned(rows * h), g.poisoned(rows * h));
        let pdp = g.up(&vec![0.0f32; 2 * h]);
        let ln = kind == Norm::LayerNorm;
        // SAFETY: buffers sized as the wrappers require.
        unsafe {
            ops::norm::kernel::norm_fwd(
                &g.s,
                &g.k,
                DType::F32,
                ln,
                p(&g, &px),
                p(&g, &pp),
                p(&g, &py),
                rows,
                h,
                1e-5,
            )
            .unwrap();
            ops::norm::kernel::norm_dgrad(
                &g.s,
                &g.k,
                DType::F32,
                ln,
                p(&g, &px),
                p(&g, &pp),
                p(&g, &pdy),
                p(&g, &pdx),
                rows,
                h,
                1e-5,
                false,
            )
            .unwrap();
            ops::norm::kernel::norm_wgrad(
                &g.s,
                &g.k,
                DType::F32,
                ln,
                p(&g, &px),
                p(&g, &pdy),
                p(&g, &pdp),
                rows,
                h,
                1e-5,
            )
            .unwrap();
        }
        check("norm_fwd_f32", &g.down(&py), &yw, 1e-5);
        check("norm_dgrad_f32", &g.down(&pdx), &dxw, 1e-5);
        let wlen = if ln { 2 * h } else { h };
        check("norm_wgrad_f32", &g.down(&pdp)[..wlen], &dpw[..wlen], 1e-5);
    }
    // activations
    for kind in [Activation::Swiglu, Activation::Gelu] {
        let f = 129;
        let w = if kind == Activation::Swiglu { 2 * f } else { f };
        let u = rand(rows * w, 5);
        let d = rand(rows * f, 6);
        let (mut ow, mut duw) = (vec![0.0; rows * f], vec![0.0; rows * w]);
        activation::act_fwd(kind, &u, rows, f, &mut ow);
        activation::act_bwd(kind, &u, &d, rows, f, &mut duw);
        let (pu, pd, po, pdu) = (
            g.up(&u),
            g.up(&d),
            g.poisoned(rows * f),
            g.poisoned(rows * w),
        );
        // SAFETY: buffers sized as the wrappers require.
        unsafe {
            ops::activation::kernel::act_fwd(
                &g.s,
                &g.k,
                DType::F32,
                kind,
                p(&g, &pu),
                p(&g, &po),
                rows,
                f,
            )
            .unwrap();
            ops::activation::kernel::act_bwd(
                &g.s,
                &g.k,
                DType::F32,
                kind,
                p(&g, &pu),
                p(&g, &pd),
                p(&g, &pdu),
                rows,
                f,
            )
            .unwrap();
        }
        check("act_fwd_f32", &g.down(&po), &ow, 1e-5);
        check("act_bwd_f32", &g.down(&pdu), &duw, 1e-5);
    }
    // rotary with zigzag positions
    let (heads, d) = (3, 64);
    let pos: Vec<u32> = (0..rows as u32)
        .map(|i| if i % 2 == 0 { i } else { 500 - i })
        .collect();
    let xr = rand(rows * heads * d, 7);
    let mut want = xr.clone();
    rotary::rotary(&mut want, rows, heads, d, &pos, 10000.0, false);
    let (px, ppos) = (g.up(&xr), g.up(&pos));
    // SAFETY: x holds rows*heads*d f32, positions rows u32.
    unsafe {
        ops::rotary::kernel::rotary(
            &g.s,
            &g.k,
            DType::F32,
            p(&g, &px),
            rows,
            heads,
            d,
            p(&g, &ppos),
            rows,
            10000.0,
            false,
        )
    }
    .unwrap();
    check("rotary_f32", &g.down(&px), &want, 1e-5);
    // Adam, step 3, with the bf16 copy
    let c = AdamConfig::default();
    let (mut pw, gr, mut mw, mut vw) = (
        rand(1000, 8),
        rand(1000, 9),
        rand(1000, 10),
        rand(1000, 11).iter().map(|v| v.abs()).collect::<Vec<_>>(),
    );
    let (pp, pg, pm, pv) = (g.up(&pw), g.up(&gr), g.up(&mw), g.up(&vw));
    adam::adam_step(&c, 3, &mut pw, &gr, &mut mw, &mut vw);
    // SAFETY: four buffers of 1000 f32; no copy.
    unsafe {
        ops::adam::kernel::adam_step(
            &g.s,
            &g.k,
            &c,
            3,
            p(&g, &pp),
            p(&g, &pg),
            p(&g, &pm),
            p(&g, &pv),
            1000,
            0,
        )
    }
    .unwrap();
    check("adam_step_f32 p", &g.down(&pp), &pw, 1e-5);
    check("adam_step_f32 v", &g.down(&pv), &vw, 1e-5);
    // cross-entropy pieces on one shard of 333 columns starting at 1000
    let (n, v, lo) = (rows, 333, 1000);
    let logits: Vec<f32> = rand(n * v, 12).iter().map(|x| x * 8.0).collect();
    let targets: Vec<u32> = (0..n as u32).map(|r| 990 + r * 17 % 360).collect();
    let (mut mx, mut probs, mut sum, mut tl) =
        (vec![0.0; n], vec![0.0; n * v], vec![0.0; n], vec![0.0; n]);
    cross_entropy::row_max(&logits, v, &mut mx);
    cross_entropy::exp_rows(&logits, v, &mx, &mut probs, &mut sum);
    cross_entropy::target_logit(&logits, v, &targets, lo, &mut tl);
    let loss = cross_entropy::loss(&mut probs, v, &sum, &mx, &tl);
    cross_entropy::grad(&mut probs, v, &targets, lo, 0.25);
    let (pl, pt) = (g.up(&logits), g.up(&targets));
    let CeReaders {
        max: pmx,
        probs: ppr,
        sum: psum,
        target: ptl,
    } = ce_readers(&g, DType::F32, p(&g, &pl), (n, v, lo), p(&g, &pt));
    let prl = g.poisoned(n);
    // SAFETY: buffers sized as the wrappers require.
    unsafe {
        ops::cross_entropy::kernel::ce_loss(
            &g.s,
            &g.k,
            p(&g, &ppr),
            n,
            v,
            p(&g, &psum),
            p(&g, &pmx),
            p(&g, &ptl),
            p(&g, &prl),
        )
        .unwrap();
        ops::cross_entropy::kernel::ce_grad(&g.s, &g.k, p(&g, &ppr), n, v, p(&g, &pt), lo, 0.25)
            .unwrap();
    }
    let gpu_loss: f64 = g.down(&prl).iter().map(|&x| f64::from(x)).sum();
    check("ce_loss_f32", &[gpu_loss as f32], &[loss as f32], 1e-5);
    check("ce_grad_f32", &g.down(&ppr), &probs, 1e-5);
}

#[test]
fn flash_attention_matches_the_cpu_on_a_zigzag_layout_with_gqa() {
    let Some(g) = gpu() else { return };
    let sh = BlockShape {
        b: 2,
        hq: 4,
        hk: 2,
        d: 72,
        dv: 72,
        dropout: None,
        span: parsim_plan::plan::AttnSpan::Full,
    };
    // Zigzag CP shard of a 64-row sequence over cp 2: chunks 0 and 3 (queries), all keys.
    let qpos: Vec<u32> = (0..16).chain(48..64).collect();
    let kpos: Vec<u32> = (0..64).collect();
    let (sq, sk) = (qpos.len(), kpos.len());
    let q = rand(sh.b * sq * sh.hq * sh.d, 21);
    let k = rand(sh.b * sk * sh.hk * sh.d, 22);
    let v = rand(sh.b * sk * sh.hk * sh.d, 23);
    let dout = rand(sh.b * sq * sh.hq * sh.d, 24);
    let nst = sh.b * sh.hq * sq;
    let gc = parsim_executor::backend::cpu::gemm_counter::GemmCounter::new();
    let (qs, ks) = (
        Side {
            pos: &qpos,
            tile: 8,
        },
        Side {
            pos: &kpos,
            tile: 8,
        },
    );
    let (mut acc, mut mx, mut sm, mut lse) = (
        vec![0.0; q.len()],
        vec![f32::NEG_INFINITY; nst],
        vec![0.0; nst],
        vec![0.0; nst],
    );
    let mut tile = vec![0.0; 64];
    flash::forward_block(
        &gc,
        &sh,
        BlockQuery { q: &q, side: qs },
        (&k, &v, ks),
        &mut acc,
        &mut flash::Online {
            max: &mut mx,
            sum: &mut sm,
        },
        &mut tile,
    );
    flash::finish(&sh, sq, &mut acc, &mx, &sm, &mut lse);
    let mut delta = vec![0.0; sh.b * sq * sh.hq];
    flash::delta(&sh, sq, &dout, &acc, &mut delta);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let (mut pt, mut dpt) = (vec![0.0; 64], vec![0.0; 64]);
    flash::backward_block(
        &gc,
        &sh,
        BlockQuery { q: &q, side: qs },
        (&k, &v, ks),
        BlockStats {
            dout: &dout,
            lse: &lse,
            delta: &delta,
        },
        (&mut dq, &mut dk, &mut dv),
        (&mut pt, &mut dpt),
    );

    let (pq, pk, pv, pdo) = (g.up(&q), g.up(&k), g.up(&v), g.up(&dout));
    let (pqp, pkp) = (g.up(&qpos), g.up(&kpos));
    let pacc = g.up(&vec![0.0f32; q.len()]);
    let (pmx, psm, plse, pdl) = (
        g.up(&vec![f32::NEG_INFINITY; nst]),
        g.up(&vec![0.0f32; nst]),
        g.poisoned(nst),
        g.poisoned(nst),
    );
    let (pdq, pdk, pdv) = (
        g.up(&vec![0.0f32; q.len()]),
        g.up(&vec![0.0f32; k.len()]),
        g.up(&vec![0.0f32; v.len()]),
    );
    let qr = ops::flash::kernel::Rows {
        pos: p(&g, &pqp),
        len: sq,
    };
    let kr = ops::flash::kernel::Rows {
        pos: p(&g, &pkp),
        len: sk,
    };
    // SAFETY: every buffer holds the shape its wrapper documents.
    unsafe {
        ops::flash::kernel::forward_block(
            &g.s,
            &g.k,
            DType::F32,
            &sh,
            p(&g, &pq),
            qr,
            p(&g, &pk),
            p(&g, &pv),
            kr,
            p(&g, &pacc),
            p(&g, &pmx),
            p(&g, &psm),
        )
        .unwrap();
        ops::flash::kernel::finish(
            &g.s,
            &g.k,
            &sh,
            sq,
            p(&g, &pacc),
            p(&g, &pmx),
            p(&g, &psm),
            p(&g, &plse),
        )
        .unwrap();
        ops::flash::kernel::delta(
            &g.s,
            &g.k,
            DType::F32,
            &sh,
            sq,
            p(&g, &pdo),
            p(&g, &pacc),
            p(&g, &pdl),
        )
        .unwrap();
        ops::flash::kernel::backward_block(
            &g.s,
            &g.k,
            DType::F32,
            &sh,
            p(&g, &pq),
            qr,
            p(&g, &pk),
            p(&g, &pv),
            kr,
            p(&g, &pdo),
            p(&g, &plse),
            p(&g, &pdl),
            p(&g, &pdq),
            p(&g, &pdk),
            p(&g, &pdv),
        )
        .unwrap();
    }
    check("flash o", &g.down(&pacc), &acc, 1e-5);
    check("flash lse", &g.down(&plse), &lse, 1e-5);
    check("flash dq", &g.down(&pdq), &dq, 1e-5);
    check("flash dk", &g.down(&pdk), &dk, 1e-5);
    check("flash dv", &g.down(&pdv), &dv, 1e-5);
}

/// A bf16 copy (raw 16-bit storage) of f32 host data, made by the cast kernel.
fn bf16_up(g: &Gpu, x: &[f32]) -> CudaSlice<u16> {
    let src = g.up(x);
    let dst = g.s.alloc_zeros::<u16>(x.len()).unwrap();
    // SAFETY: src holds n f32, dst n bf16.
    unsafe {
        ops::elementwise::kernel::cast_f32_to_bf16(&g.s, &g.k, p(g, &src), p(g, &dst), x.len())
    }
    .unwrap();
    g.s.synchronize().unwrap();
    dst
}

/// A bf16 device buffer read back as f32 through the cast kernel.
fn bf16_down(g: &Gpu, x: &CudaSlice<u16>) -> Vec<f32> {
    let dst = g.poisoned(x.len());
    // SAFETY: x holds n bf16, dst n f32.
    unsafe { ops::elementwise::kernel::cast_bf16_to_f32(&g.s, &g.k, p(g, x), p(g, &dst), x.len()) }
        .unwrap();
    g.down(&dst)
}

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| parsim_executor::backend::bf16::round_bf16(v))
        .collect()
}

#[test]
fn bf16_kernels_match_the_cpu_on_rounded_inputs() {
    let Some(g) = gpu() else { return };
    let (rows, h) = (33, 257);
    let x = rand(rows * h, 31);
    // The cast itself is exact rounding to nearest even (the CPU's round_bf16).
    let px = bf16_up(&g, &x);
    assert_eq!(
        bf16_down(&g, &px),
        rounded(&x),
        "cast_f32_to_bf16 vs round_bf16"
    );
    // RMSNorm forward in bf16: the CPU on the rounded input, output rounded.
    let params: Vec<f32> = rand(h, 32).iter().map(|v| v + 1.0).collect();
    let mut want = vec![0.0; rows * h];
    norm::norm_fwd(Norm::RmsNorm, &rounded(&x), &params, h, 1e-5, &mut want);
    let (pp, py) = (g.up(&params), bf16_up(&g, &vec![f32::NAN; rows * h]));
    // SAFETY: x and y hold rows*h bf16, params h f32.
    unsafe {
        ops::norm::kernel::norm_fwd(
            &g.s,
            &g.k,
            DType::Bf16,
            false,
            p(&g, &px),
            p(&g, &pp),
            p(&g, &py),
            rows,
            h,
            1e-5,
        )
    }
    .unwrap();
    check("norm_fwd_bf16", &bf16_down(&g, &py), &rounded(&want), 1e-2);
    // SwiGLU forward in bf16.
    let f = 100;
    let u = rand(rows * 2 * f, 33);
    let mut want = vec![0.0; rows * f];
    activation::act_fwd(Activation::Swiglu, &rounded(&u), rows, f, &mut want);
    let (pu, po) = (bf16_up(&g, &u), bf16_up(&g, &vec![f32::NAN; rows * f]));
    // SAFETY: u holds rows*2f bf16, out rows*f bf16.
    unsafe {
        ops::activation::kernel::act_fwd(
            &g.s,
            &g.k,
            DType::Bf16,
            Activation::Swiglu,
            p(&g, &pu),
            p(&g, &po),
            rows,
            f,
        )
    }
    .unwrap();
    check(
        "swiglu_fwd_bf16",
        &bf16_down(&g, &po),
        &rounded(&want),
        1e-2,
    );
    // The cross-entropy readers on bf16 logits in place (no f32 copy of the [n, v] block):
    // the CPU on the rounded logits; every output is f32.
    let (n, v, lo) = (rows, 333, 1000);
    let logits = rounded(&rand(n * v, 34).iter().map(|x| x * 8.0).collect::<Vec<_>>());
    let targets: Vec<u32> = (0..n as u32).map(|r| 990 + r * 17 % 360).collect();
    let (mut mx, mut probs, mut sum, mut tl) =
        (vec![0.0; n], vec![0.0; n * v], vec![0.0; n], vec![0.0; n]);
    cross_entropy::row_max(&logits, v, &mut mx);
    cross_entropy::exp_rows(&logits, v, &mx, &mut probs, &mut sum);
    cross_entropy::target_logit(&logits, v, &targets, lo, &mut tl);
    let (pl, pt) = (bf16_up(&g, &logits), g.up(&targets));
    let r = ce_readers(&g, DType::Bf16, p(&g, &pl), (n, v, lo), p(&g, &pt));
    check("ce_row_max_bf16", &g.down(&r.max), &mx, 1e-5);
    check("ce_exp_rows_bf16 probs", &g.down(&r.probs), &probs, 1e-5);
    check("ce_exp_rows_bf16 sum", &g.down(&r.sum), &sum, 1e-5);
    check("ce_target_logit_bf16", &g.down(&r.target), &tl, 1e-5);
}

/// backend/cuda/ops/dropout/dropout.cu, heads.cu and the scored router of moe.cu against their CPU twins
/// (cpu/ops/dropout.rs, mla.rs, router.rs): outputs poisoned first, fresh random inputs.
#[test]
fn dropout_heads_and_scored_router_match_the_cpu() {
    use parsim_executor::backend::cpu::ops::{dropout, heads, router};
    use parsim_executor::backend::cuda::ops::moe::kernel::ScoredTopk;
    use parsim_executor::rng::{DropoutKey, DropoutSite};
    use parsim_plan::plan::{MoeShape, RouterShape, ScoreFunction};
    let Some(g) = gpu() else { return };
    // Dropout: random tokens past 2^32, a column offset mid-block; exact in f32.
    let (rows, cols) = (37, 300);
    let key = DropoutKey {
        seed: 0xDEAD_BEEF_1234,
        step: 7,
        layer: 11,
        site: DropoutSite::Mlp,
        p: 0.3,
    };
    let tokens: Vec<u64> = rand(rows, 41)
        .iter()
        .map(|v| (f64::from(v.abs()) * 1e13) as u64)
        .collect();
    let x = rand(rows * cols, 42);
    let mut want = x.clone();
    dropout::dropout_inplace(&key, &tokens, 6, &mut want).unwrap();
    let (px, pt) = (g.up(&x), g.up(&tokens));
    // SAFETY: x rows*cols f32, tokens rows u64.
    unsafe {
        ops::dropout::kernel::dropout(
            &g.s,
            &g.k,
            DType::F32,
            &key,
            p(&g, &px),
            p(&g, &pt),
            rows,
            cols,
            6,
        )
    }
    .unwrap();
    let got = g.down(&px);
    assert_eq!(got, want, "dropout_f32 is the CPU's mask exactly");
    let pb = bf16_up(&g, &x);
    let mut want = rounded(&x);
    dropout::dropout_inplace(&key, &tokens, 6, &mut want).unwrap();
    // SAFETY: x rows*cols bf16, tokens rows u64.
    unsafe {
        ops::dropout::kernel::dropout(
            &g.s,
            &g.k,
            DType::Bf16,
            &key,
            p(&g, &pb),
            p(&g, &pt),
            rows,
            cols,
            6,
        )
    }
    .unwrap();
    check("dropout_bf16", &bf16_down(&g, &pb), &rounded(&want), 1e-2);

    // MLA heads: per-head and shared second parts, concat then split.
    let (n, heads, da, db) = (29, 5, 24, 8);
    for shared in [false, true] {
        let hb = if shared { 1 } else { heads };
        let a = rand(n * heads * da, 43);
        let b = rand(n * hb * db, 44);
        let w = n * heads * (da + db);
        let mut want = vec![0.0; w];
        heads::heads_concat(&a, &b, &mut want, n, heads);
        let (pa, pb, po) = (g.up(&a), g.up(&b), g.poisoned(w));
        // SAFETY: lengths as passed, f32.
        unsafe {
            ops::heads::kernel::concat(
                &g.s,
                &g.k,
                DType::F32,
                (p(&g, &pa), a.len()),
                (p(&g, &pb), b.len()),
                (p(&g, &po), w),
                n,
                heads,
            )
        }
        .unwrap();
        check("heads_concat_f32", &g.down(&po), &want, 1e-6);
        let dout = rand(w, 45);
        let (mut wa, mut wb) = (vec![0.0; a.len()], vec![0.0; b.len()]);
        heads::heads_split(&dout, &mut wa, &mut wb, n, heads);
        let (pd, pda, pdb) = (g.up(&dout), g.poisoned(a.len()), g.poisoned(b.len()));
        // SAFETY: lengths as passed, f32.
        unsafe {
            ops::heads::kernel::split(
                &g.s,
                &g.k,
                DType::F32,
                (p(&g, &pd), w),
                (p(&g, &pda), a.len()),
                (p(&g, &pdb), b.len()),
                n,
                heads,
            )
        }
        .unwrap();
        check("heads_split_f32 a", &g.down(&pda), &wa, 1e-6);
        check("heads_split_f32 b", &g.down(&pdb), &wb, 1e-5);
    }

    // The scored router: 64 experts in 8 groups, top-6 within 3 groups, with bias.
    let (n, e, k) = (53, 64, 6);
    for score in [ScoreFunction::Sigmoid, ScoreFunction::Softmax] {
        let m = MoeShape {
            num_experts: e,
            top_k: k,
            ffn: 4,
            router: RouterShape {
                score,
                renormalize: true,
                expert_bias: true,
                groups: 8,
                group_topk: 3,
                ..RouterShape::default()
            },
            ..MoeShape::default()
        };
        let logits: Vec<f32> = rand(n * e, 46).iter().map(|v| v * 4.0).collect();
        let bias: Vec<f32> = rand(e, 47).iter().map(|v| v * 0.1).collect();
        let mut s = logits.clone();
        router::scores(&mut s, e, score);
        let (r, chosen) = router::route(&s, n, Some(&bias), &m);
        let pl = g.up(&logits);
        // SAFETY: logits n*e f32.
        unsafe {
            match score {
                ScoreFunction::Sigmoid => ops::moe::kernel::sigmoid(&g.s, &g.k, p(&g, &pl), n * e),
                ScoreFunction::Softmax => {
                    ops::moe::kernel::softmax_rows(&g.s, &g.k, p(&g, &pl), n, e)
                }
            }
        }
        .unwrap();
        let gs = g.down(&pl);
        check("router scores", &gs, &s, 1e-5);
        // The choice on the CPU's own scores, so near-ties cannot differ by an ulp of exp.
        let ps = g.up(&s);
        let pbias = g.up(&bias);
        let pe = g.up(&vec![u32::MAX; n * k]);
        let pg = g.poisoned(n * k);
        let t = ScoredTopk {
            experts: e,
            top_k: k,
            groups: 8,
            group_topk: 3,
            renormalize: true,
        };
        // SAFETY: scores n*e, bias e, experts and gates n*k.
        unsafe {
            ops::moe::kernel::topk_scored(
                &g.s,
                &g.k,
                &t,
                p(&g, &ps),
                p(&g, &pbias),
                n,
                p(&g, &pe),
                p(&g, &pg),
            )
        }
        .unwrap();
        g.s.synchronize().unwrap();
        let experts: Vec<usize> =
            g.s.clone_dtoh(&pe)
                .unwrap()
                .iter()
                .map(|&x| x as usize)
                .collect();
        assert_eq!(experts, chosen, "moe_topk_scored_f32 chose other experts");
        let want_gates: Vec<f32> = chosen
            .chunks(k)
            .enumerate()
            .flat_map(|(tk, pick)| {
                let row = &s[tk * e..(tk + 1) * e];
                let sum: f32 = pick.iter().map(|&x| row[x]).sum();
                pick.iter().map(|&x| row[x] / sum).collect::<Vec<_>>()
            })
            .collect();
        check("moe_topk_scored gates", &g.down(&pg), &want_gates, 1e-6);
        // Column sums (the aux loss's score mass).
        let pc = g.poisoned(e);
        // SAFETY: scores n*e, out e.
        unsafe { ops::moe::kernel::score_colsum(&g.s, &g.k, p(&g, &ps), n, e, p(&g, &pc)) }
            .unwrap();
        let colsum: Vec<f32> = (0..e)
            .map(|x| (0..n).map(|t| f64::from(s[t * e + x])).sum::<f64>() as f32)
            .collect();
        check("moe_score_colsum", &g.down(&pc), &colsum, 1e-6);
        // Backward: gate gradients at the chosen entries, through renorm and the score.
        let dg = rand(n * e, 48);
        let mut d = vec![0.0f32; n * e];
        for (i, &x) in chosen.iter().enumerate() {
            d[(i / k) * e + x] = dg[i];
        }
        let mut want = d.clone();
        router::router_bwd(&mut want, &s, &chosen, &m, &r.fraction, 0.01);
        let pd = g.up(&d);
        let pch = g.up(&chosen.iter().map(|&x| x as u32).collect::<Vec<_>>());
        let fr: Vec<f32> = r.fraction.iter().map(|&f| f as f32).collect();
        let pf = g.up(&fr);
        let sigmoid = score == ScoreFunction::Sigmoid;
        // SAFETY: d and scores n*e, chosen n*k, fraction e.
        unsafe {
            ops::moe::kernel::scored_bwd(
                &g.s,
                &g.k,
                p(&g, &pd),
                p(&g, &ps),
                p(&g, &pch),
                n,
                e,
                k,
                true,
                sigmoid,
            )
            .unwrap();
            if !sigmoid {
                ops::moe::kernel::router_bwd(
                    &g.s,
                    &g.k,
                    p(&g, &pd),
                    p(&g, &ps),
                    p(&g, &pf),
                    n,
                    e,
                    0.01,
                )
                .unwrap();
            }
        }
        check("moe scored backward", &g.down(&pd), &want, 1e-5);
    }
}

/// One side of a tensor-core attention call on the device: positions and their group ranges.
fn mma_rows(g: &Gpu, pos: &[u32]) -> (ops::flash::mma::MmaRows, [CudaSlice<u32>; 2]) {
    let (dp, dr) = (g.up(pos), g.up(&ops::flash::mma::ranges(pos)));
    let rows = ops::flash::mma::MmaRows {
        pos: p(g, &dp),
        ranges: p(g, &dr),
        len: pos.len(),
    };
    (rows, [dp, dr])
}

/// backend/cuda/ops/flash/flash_mma.cu (bf16, tensor cores) against the CPU twin on the bf16-rounded inputs:
/// queries at `qpos` against the K/V blocks at `kblocks` merged one call each (the ring's
/// order), then finish, and the backward of every block from the final lse and delta. The
/// accumulating outputs start from random values (their += is checked too), lse from NaN.
fn mma_case(g: &Gpu, name: &str, sh: &BlockShape, qpos: &[u32], kblocks: &[Vec<u32>], seed: u64) {
    let sq = qpos.len();
    let nq = sh.b * sq * sh.hq * sh.d;
    let nst = sh.b * sh.hq * sq;
    let q = rounded(&rand(nq, seed));
    let dout = rounded(&rand(nq, seed + 1));
    let kv: Vec<(Vec<f32>, Vec<f32>)> = kblocks
        .iter()
        .enumerate()
        .map(|(i, kp)| {
            let n = sh.b * kp.len() * sh.hk * sh.d;
            let s = seed + 10 * (i as u64 + 1);
            (rounded(&rand(n, s)), rounded(&rand(n, s + 1)))
        })
        .collect();
    let gc = parsim_executor::backend::cpu::gemm_counter::GemmCounter::new();
    let side = |pos| Side { pos, tile: 16 };
    // CPU: the merge, finish, delta and each block's backward.
    let (mut acc, mut mx, mut sm, mut lse) = (
        vec![0.0; nq],
        vec![f32::NEG_INFINITY; nst],
        vec![0.0; nst],
        vec![0.0; nst],
    );
    let mut tile = vec![0.0; 256];
    for (kp, (k, v)) in kblocks.iter().zip(&kv) {
        let mut on = flash::Online {
            max: &mut mx,
            sum: &mut sm,
        };
        flash::forward_block(
            &gc,
            sh,
            BlockQuery {
                q: &q,
                side: side(qpos),
            },
            (k, v, side(kp)),
            &mut acc,
            &mut on,
            &mut tile,
        );
    }
    let mut o = acc.clone();
    flash::finish(sh, sq, &mut o, &mx, &sm, &mut lse);
    let mut delta = vec![0.0; sh.b * sq * sh.hq];
    flash::delta(sh, sq, &dout, &o, &mut delta);
    let dq0 = rand(nq, seed + 3);
    let mut dq = dq0.clone();
    let (mut pt, mut dpt) = (vec![0.0; 256], vec![0.0; 256]);
    let mut dkv = Vec::new();
    for (i, (kp, (k, v))) in kblocks.iter().zip(&kv).enumerate() {
        let (dk0, dv0) = (rand(k.len(), seed + 4 + i as u64), rand(v.len(), seed + 5));
        let (mut dk, mut dv) = (dk0.clone(), dv0.clone());
        flash::backward_block(
            &gc,
            sh,
            BlockQuery {
                q: &q,
                side: side(qpos),
            },
            (k, v, side(kp)),
            BlockStats {
                dout: &dout,
                lse: &lse,
                delta: &delta,
            },
            (&mut dq, &mut dk, &mut dv),
            (&mut pt, &mut dpt),
        );
        dkv.push((dk0, dv0, dk, dv));
    }
    // GPU: the same calls on the tensor-core kernels.
    let (pq, pdo) = (bf16_up(g, &q), bf16_up(g, &dout));
    let (qr, _qkeep) = mma_rows(g, qpos);
    let (pacc, pmx, psm, plse) = (
        g.up(&vec![0.0f32; nq]),
        g.up(&vec![f32::NEG_INFINITY; nst]),
        g.up(&vec![0.0f32; nst]),
        g.poisoned(nst),
    );
    let dev_kv: Vec<_> = kv
        .iter()
        .map(|(k, v)| (bf16_up(g, k), bf16_up(g, v)))
        .collect();
    let mut keep = Vec::new();
    for (kp, (pk, pv)) in kblocks.iter().zip(&dev_kv) {
        let (kr, kk) = mma_rows(g, kp);
        keep.push(kk);
        // SAFETY: q [b, sq, hq, d], k and v [b, sk, hk, d] bf16; acc, max, sum f32.
        unsafe {
            ops::flash::mma::forward_block(
                &g.s,
                &g.k,
                sh,
                p(g, &pq),
                qr,
                p(g, pk),
                p(g, pv),
                kr,
                p(g, &pacc),
                p(g, &pmx),
                p(g, &psm),
            )
        }
        .unwrap();
    }
    check(&format!("{name} acc"), &g.down(&pacc), &acc, 1e-2);
    // SAFETY: acc b*sq*hq*d f32, the statistics b*hq*sq f32.
    unsafe {
        ops::flash::kernel::finish(
            &g.s,
            &g.k,
            sh,
            sq,
            p(g, &pacc),
            p(g, &pmx),
            p(g, &psm),
            p(g, &plse),
        )
    }
    .unwrap();
    check(&format!("{name} o"), &g.down(&pacc), &o, 1e-2);
    check(&format!("{name} lse"), &g.down(&plse), &lse, 1e-2);
    let (dlse, ddl, pdq) = (g.up(&lse), g.up(&delta), g.up(&dq0));
    for (i, (kp, (pk, pv))) in kblocks.iter().zip(&dev_kv).enumerate() {
        let (kr, kk) = mma_rows(g, kp);
        keep.push(kk);
        let (dk0, dv0, dk, dv) = &dkv[i];
        let (pdk, pdv) = (g.up(dk0), g.up(dv0));
        // SAFETY: as the forward; dout like q; lse, delta and the gradients f32.
        unsafe {
            ops::flash::mma::backward_block(
                &g.s,
                &g.k,
                sh,
                p(g, &pq),
                qr,
                p(g, pk),
                p(g, pv),
                kr,
                p(g, &pdo),
                p(g, &dlse),
                p(g, &ddl),
                p(g, &pdq),
                p(g, &pdk),
                p(g, &pdv),
            )
        }
        .unwrap();
        check(&format!("{name} dk[{i}]"), &g.down(&pdk), dk, 1e-2);
        check(&format!("{name} dv[{i}]"), &g.down(&pdv), dv, 1e-2);
    }
    check(&format!("{name} dq"), &g.down(&pdq), &dq, 1e-2);
}

#[test]
fn flash_mma_bf16_matches_the_cpu_at_odd_lengths_gqa_zigzag_and_a_ring_merge() {
    let Some(g) = gpu() else { return };
    // Both backwards: the fused one (dQ by atomics, the default) and the deterministic two
    // kernels.
    for deterministic in [false, true] {
        ops::flash::mma::set_deterministic(deterministic);
        mma_cases(&g);
    }
    ops::flash::mma::set_deterministic(false);
}

fn mma_cases(g: &Gpu) {
    let shape = |b, hq, hk, d| BlockShape {
        b,
        hq,
        hk,
        d,
        dv: d,
        dropout: None,
        span: parsim_plan::plan::AttnSpan::Full,
    };
    // Contiguous causal, 100 rows (not a multiple of the 64- or 32-row tiles), GQA 4:2, d 64.
    let pos: Vec<u32> = (0..100).collect();
    mma_case(
        g,
        "contiguous d64",
        &shape(1, 4, 2, 64),
        &pos,
        std::slice::from_ref(&pos),
        51,
    );
    // The same at d 128 with 3 sequences, 200 rows, one key head for 4 query heads.
    let pos: Vec<u32> = (0..200).collect();
    mma_case(
        g,
        "contiguous d128",
        &shape(3, 4, 1, 128),
        &pos,
        std::slice::from_ref(&pos),
        61,
    );
    // Zigzag CP shard of a 320-row sequence over cp 2: chunks 0 and 3 (80 rows each) against
    // every key, d 128, GQA 2:1.
    let qpos: Vec<u32> = (0..80).chain(240..320).collect();
    let kpos: Vec<u32> = (0..320).collect();
    mma_case(g, "zigzag d128", &shape(2, 2, 1, 128), &qpos, &[kpos], 71);
    // The ring's block merge: the same queries against two K/V blocks in two calls (keys
    // 0..150 and 150..301, the second partly in the future of every query block), d 64.
    let qpos: Vec<u32> = (0..301).collect();
    let blocks = vec![(0..150).collect(), (150..301).collect()];
    mma_case(g, "ring merge d64", &shape(1, 8, 2, 64), &qpos, &blocks, 81);
    // A zigzag ring on cp 2: shard 0 (chunks 0 and 3 of 320 rows) merges its own keys, then
    // shard 1's (chunks 1 and 2: wholly in the past of chunk 3, the future of chunk 0).
    let qpos: Vec<u32> = (0..80).chain(240..320).collect();
    let blocks = vec![qpos.clone(), (80..240).collect()];
    mma_case(
        g,
        "zigzag ring d128",
        &shape(1, 4, 2, 128),
        &qpos,
        &blocks,
        91,
    );
}
