//! Each kernel against its CPU twin (executor/src/backend/cpu/ops) on fresh random inputs with
//! the outputs poisoned (NaN) first: relative error (max |gpu - cpu| / max |cpu|) below 1e-5
//! in fp32 and 1e-2 in bf16. Needs a GPU, its driver and NVRTC: prints why it skips otherwise.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use parsim_executor::backend::cpu::ops::{
    activation, adam, cross_entropy, elementwise, flash, norm, rotary,
};
use parsim_executor::backend::cuda::kernels::Kernels;
use parsim_executor::backend::cuda::launch;
use parsim_executor::backend::cuda::probe::{self, Library};
use parsim_executor::backend::{BlockShape, DType, Side};
use parsim_executor::plan::{Activation, AdamConfig, Norm};
use std::sync::Arc;

struct Gpu {
    s: Arc<CudaStream>,
    k: Kernels,
}

fn gpu() -> Option<Gpu> {
    for lib in [Library::Driver, Library::Nvrtc] {
        if let Err(e) = probe::require(lib) {
            eprintln!("skipped: {e}");
            return None;
        }
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            eprintln!("skipped: no GPU ({other:?})");
            return None;
        }
    }
    let ctx = CudaContext::new(0).expect("context on GPU 0");
    let k = Kernels::load(&ctx).expect("kernels compile and load");
    Some(Gpu {
        s: ctx.default_stream(),
        k,
    })
}

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Gpu {
    fn up<T: cudarc::driver::DeviceRepr>(&self, x: &[T]) -> CudaSlice<T> {
        self.s.clone_htod(x).unwrap()
    }
    fn poisoned(&self, n: usize) -> CudaSlice<f32> {
        self.up(&vec![f32::NAN; n])
    }
    fn down(&self, x: &CudaSlice<f32>) -> Vec<f32> {
        self.s.synchronize().unwrap();
        self.s.clone_dtoh(x).unwrap()
    }
}

fn p<T>(g: &Gpu, x: &CudaSlice<T>) -> u64 {
    x.device_ptr(&g.s).0
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff.is_finite(), "non-finite output");
    diff / scale
}

fn check(name: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_err(got, want);
    eprintln!("{name}: relative error {e:.2e}");
    assert!(e < tol, "{name}: relative error {e} >= {tol}");
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
        launch::elementwise::axpy(
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
            launch::norm::norm_fwd(
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
            launch::norm::norm_dgrad(
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
            launch::norm::norm_wgrad(
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
            launch::activation::act_fwd(
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
            launch::activation::act_bwd(
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
        launch::rotary::rotary(
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
        launch::adam::adam_step(
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
    let (pmx, ppr, psum, ptl, prl) = (
        g.poisoned(n),
        g.poisoned(n * v),
        g.poisoned(n),
        g.poisoned(n),
        g.poisoned(n),
    );
    // SAFETY: buffers sized as the wrappers require.
    unsafe {
        launch::cross_entropy::ce_row_max(&g.s, &g.k, p(&g, &pl), n, v, p(&g, &pmx)).unwrap();
        launch::cross_entropy::ce_exp_rows(
            &g.s,
            &g.k,
            p(&g, &pl),
            n,
            v,
            p(&g, &pmx),
            p(&g, &ppr),
            p(&g, &psum),
        )
        .unwrap();
        launch::cross_entropy::ce_target_logit(
            &g.s,
            &g.k,
            p(&g, &pl),
            n,
            v,
            p(&g, &pt),
            lo,
            p(&g, &ptl),
        )
        .unwrap();
        launch::cross_entropy::ce_loss(
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
        launch::cross_entropy::ce_grad(&g.s, &g.k, p(&g, &ppr), n, v, p(&g, &pt), lo, 0.25)
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
    let gc = parsim_executor::backend::cpu::ops::gemm::GemmCounter::new();
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
        &q,
        qs,
        &k,
        &v,
        ks,
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
        &gc, &sh, &q, qs, &k, &v, ks, &dout, &lse, &delta, &mut dq, &mut dk, &mut dv, &mut pt,
        &mut dpt,
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
    let qr = launch::flash::Rows {
        pos: p(&g, &pqp),
        len: sq,
    };
    let kr = launch::flash::Rows {
        pos: p(&g, &pkp),
        len: sk,
    };
    // SAFETY: every buffer holds the shape its wrapper documents.
    unsafe {
        launch::flash::forward_block(
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
        launch::flash::finish(
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
        launch::flash::delta(
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
        launch::flash::backward_block(
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
    unsafe { launch::elementwise::cast_f32_to_bf16(&g.s, &g.k, p(g, &src), p(g, &dst), x.len()) }
        .unwrap();
    g.s.synchronize().unwrap();
    dst
}

/// A bf16 device buffer read back as f32 through the cast kernel.
fn bf16_down(g: &Gpu, x: &CudaSlice<u16>) -> Vec<f32> {
    let dst = g.poisoned(x.len());
    // SAFETY: x holds n bf16, dst n f32.
    unsafe { launch::elementwise::cast_bf16_to_f32(&g.s, &g.k, p(g, x), p(g, &dst), x.len()) }
        .unwrap();
    g.down(&dst)
}

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| elementwise::round_bf16(v)).collect()
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
        launch::norm::norm_fwd(
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
        launch::activation::act_fwd(
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
}
