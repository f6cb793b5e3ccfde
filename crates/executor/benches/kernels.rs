//! Kernel times on the GPU at hand, from CUDA events around each launch: 3 warm-up runs, then
//! the median of 20 timed ones. Prints time and achieved rate (memory-bound kernels in GB/s,
//! flash attention in causal TFLOP/s: 4 b hq s^2 d / 2 forward, 2.5x that backward, as
//! FlashAttention-2 counts; the scalar kernels of flash.cu beside the tensor-core ones of
//! flash_mma.cu). Run: `cargo bench -p parsim-executor --bench kernels`; without a
//! GPU, driver or NVRTC it prints why it skips.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use parsim_executor::backend::cuda::compile::kernels::Kernels;
use parsim_executor::backend::cuda::ops;
use parsim_executor::backend::cuda::probe::{self, Library};
use parsim_executor::backend::ops::BlockShape;
use parsim_plan::plan::Activation;
use parsim_plan::DType;
use std::sync::Arc;

/// Median milliseconds of `f` over 20 timed runs after 3 warm-up runs.
fn time_ms(s: &Arc<CudaStream>, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut ms: Vec<f64> = (0..20)
        .map(|_| {
            let a = s
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap();
            f();
            let b = s
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap();
            b.synchronize().unwrap();
            f64::from(a.elapsed_ms(&b).unwrap())
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

fn ptr<T>(s: &CudaStream, x: &CudaSlice<T>) -> u64 {
    x.device_ptr(s).0
}

fn main() {
    for lib in [Library::Driver, Library::Nvrtc] {
        if let Err(e) = probe::require(lib) {
            println!("skipped: {e}");
            return;
        }
    }
    if !matches!(CudaContext::device_count(), Ok(n) if n > 0) {
        println!("skipped: no GPU visible");
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let k = Kernels::load(&ctx).unwrap();
    let s = ctx.default_stream();
    println!("GPU: {}", ctx.name().unwrap_or_default());
    memory_bound(&s, &k);
    flash(&s, &k);
}

/// RMSNorm and SwiGLU forward in bf16 (memory-bound: GB/s).
fn memory_bound(s: &Arc<CudaStream>, k: &Kernels) {
    // RMSNorm forward, bf16, 8192 rows of 4096.
    let (rows, h) = (8192, 4096);
    let x = s.alloc_zeros::<u16>(rows * h).unwrap();
    let y = s.alloc_zeros::<u16>(rows * h).unwrap();
    let g = s.alloc_zeros::<f32>(h).unwrap();
    let (px, py, pg) = (ptr(s, &x), ptr(s, &y), ptr(s, &g));
    let t = time_ms(s, || {
        // SAFETY: buffers of rows*h bf16 and h f32.
        unsafe { ops::norm::kernel::norm_fwd(s, k, DType::Bf16, false, px, pg, py, rows, h, 1e-5) }
            .unwrap()
    });
    let gbs = (2 * rows * h * 2) as f64 / (t * 1e-3) / 1e9;
    println!("norm_fwd_bf16 {rows}x{h}: {t:.3} ms, {gbs:.0} GB/s");

    // SwiGLU forward, bf16, 8192 x 14336.
    let f = 14336;
    let u = s.alloc_zeros::<u16>(rows * 2 * f).unwrap();
    let o = s.alloc_zeros::<u16>(rows * f).unwrap();
    let (pu, po) = (ptr(s, &u), ptr(s, &o));
    let t = time_ms(s, || {
        // SAFETY: u holds rows*2f bf16, o rows*f bf16.
        unsafe {
            ops::activation::kernel::act_fwd(s, k, DType::Bf16, Activation::Swiglu, pu, po, rows, f)
        }
        .unwrap()
    });
    let gbs = (3 * rows * f * 2) as f64 / (t * 1e-3) / 1e9;
    println!("swiglu_fwd_bf16 {rows}x{f}: {t:.3} ms, {gbs:.0} GB/s");
}

/// Causal flash attention forward and backward, the scalar and the tensor-core kernels.
fn flash(s: &Arc<CudaStream>, k: &Kernels) {
    // Causal flash attention, bf16 inputs: b 1, s 4096, 32 query heads, 8 KV heads, d 128.
    let sh = BlockShape {
        b: 1,
        hq: 32,
        hk: 8,
        d: 128,
        dv: 128,
        dropout: None,
        span: parsim_plan::plan::AttnSpan::Full,
    };
    let sq = 4096;
    let pos: Vec<u32> = (0..sq as u32).collect();
    let ppos = s.clone_htod(&pos).unwrap();
    let nq = sh.b * sq * sh.hq * sh.d;
    let nk = sh.b * sq * sh.hk * sh.d;
    let q = s.alloc_zeros::<u16>(nq).unwrap();
    let kv = s.alloc_zeros::<u16>(nk).unwrap();
    let acc = s.alloc_zeros::<f32>(nq).unwrap();
    let st = s.alloc_zeros::<f32>(sh.b * sh.hq * sq).unwrap();
    let st2 = s.alloc_zeros::<f32>(sh.b * sh.hq * sq).unwrap();
    let dq = s.alloc_zeros::<f32>(nq).unwrap();
    let dkv = s.alloc_zeros::<f32>(nk).unwrap();
    let rows_q = ops::flash::kernel::Rows {
        pos: ptr(s, &ppos),
        len: sq,
    };
    let pst2 = ptr(s, &st2);
    let (pq, pkv, pacc, pst, pdq, pdkv) = (
        ptr(s, &q),
        ptr(s, &kv),
        ptr(s, &acc),
        ptr(s, &st),
        ptr(s, &dq),
        ptr(s, &dkv),
    );
    let flops_fwd = 4.0 * (sh.b * sh.hq) as f64 * (sq * sq) as f64 * sh.d as f64 / 2.0;
    let t = time_ms(s, || {
        // SAFETY: q, acc [1, s, 32, 128]; k = v [1, s, 8, 128]; max and sum [1, 32, s]. They
        // are not reset between runs: the timing is what matters here.
        unsafe {
            ops::flash::kernel::forward_block(
                s,
                k,
                DType::Bf16,
                &sh,
                pq,
                rows_q,
                pkv,
                pkv,
                rows_q,
                pacc,
                pst,
                pst2,
            )
        }
        .unwrap()
    });
    println!(
        "flash_fwd_block_bf16 s {sq}, hq 32, hk 8, d 128: {t:.3} ms, {:.1} TFLOP/s",
        flops_fwd / (t * 1e-3) / 1e12
    );
    let t = time_ms(s, || {
        // SAFETY: as above; dout = q, lse and delta in the two statistics buffers.
        unsafe {
            ops::flash::kernel::backward_block(
                s,
                k,
                DType::Bf16,
                &sh,
                pq,
                rows_q,
                pkv,
                pkv,
                rows_q,
                pq,
                pst,
                pst2,
                pdq,
                pdkv,
                pdkv,
            )
        }
        .unwrap()
    });
    println!(
        "flash backward_block_bf16 same shape: {t:.3} ms, {:.1} TFLOP/s",
        2.5 * flops_fwd / (t * 1e-3) / 1e12
    );

    // The same shape on the tensor-core kernels (flash_mma.cu).
    let rng = s.clone_htod(&ops::flash::mma::ranges(&pos)).unwrap();
    let mrows = ops::flash::mma::MmaRows {
        pos: ptr(s, &ppos),
        ranges: ptr(s, &rng),
        len: sq,
    };
    let t = time_ms(s, || {
        // SAFETY: as the scalar forward above; positions and their ranges u32.
        unsafe {
            ops::flash::mma::forward_block(s, k, &sh, pq, mrows, pkv, pkv, mrows, pacc, pst, pst2)
        }
        .unwrap()
    });
    println!(
        "flash_mma_fwd_d128 (tensor cores) same shape: {t:.3} ms, {:.1} TFLOP/s",
        flops_fwd / (t * 1e-3) / 1e12
    );
    // The fused backward (FlashAttention-2's one kernel, dQ by atomics), then the
    // deterministic two kernels.
    for (deterministic, label) in [
        (false, "fused, dq by atomics"),
        (true, "dq + dkdv, deterministic"),
    ] {
        ops::flash::mma::set_deterministic(deterministic);
        let t = time_ms(s, || {
            // SAFETY: as the scalar backward above.
            unsafe {
                ops::flash::mma::backward_block(
                    s, k, &sh, pq, mrows, pkv, pkv, mrows, pq, pst, pst2, pdq, pdkv, pdkv,
                )
            }
            .unwrap()
        });
        println!(
            "flash_mma backward ({label}, tensor cores) same shape: {t:.3} ms, {:.1} TFLOP/s",
            2.5 * flops_fwd / (t * 1e-3) / 1e12
        );
    }
    ops::flash::mma::set_deterministic(false);
}
