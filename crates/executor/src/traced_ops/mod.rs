//! A timing layer over a rank's device ([`TracedOps`]): every tensor op the model or the
//! optimizer calls passes through it, and with op profiling on (`RunOptions::profile_ops`)
//! each call of a timed step is keyed by its class ([`OpKey`]: a GEMM's shape, an attention's
//! shape and kernel, a memory-bound op's bytes) and bracketed by two of the device's events.
//! [`TracedComm`](crate::traced_comm::TracedComm) times the collectives through
//! [`TracedOps::timed_collective`] on the same events. Profiling off, a call costs one branch.
//!
//! Bytes of a memory-bound op: each tensor it reads or writes once, an output it also reads
//! (in place, or accumulated) twice; a gather or scatter counts the rows it touches.

use crate::backend::{
    AttnSaved, AttnShape, Backend, BlockShape, Device, DeviceCollectives, DeviceTensor, Keep,
    MambaGeo, MambaOps, Route, Routing, Side, TensorOps, UlyssesGeo, UlyssesLayout, UlyssesPart,
    View, ViewMut,
};
use crate::error::ExecError;
use crate::op_profile::OpProfile;
use crate::tracker::{Category, MemoryTracker};
use parsim_plan::op_timing::{CollectiveKind, MaskKind, OpKey, Pass, Placement};
use parsim_plan::plan::{Activation, AdamConfig, AttnSpan, MoeShape, Norm};
use parsim_plan::DType;

/// Memory-bound methods of a device trait, forwarded to the wrapped device through
/// [`TracedOps::run`]: when recording, each call is timed as an [`OpKey::Memory`] of the bytes
/// its entry names. An entry is the method's signature without `&self` and `Result`, then `=`
/// the bytes the call moves: `fn fill(t: &mut B::Tensor, value: f32) -> () = tb(t);`.
macro_rules! memory_bound {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $bytes:expr;)*) => {
        $(
            fn $name(&self, $($arg: $ty),*) -> Result<$ret, ExecError> {
                let key = self.mem(|| $bytes);
                self.run(key, |d| d.$name($($arg),*))
            }
        )*
    };
}

mod mamba;

/// A rank's device with op timing (see the module doc).
pub struct TracedOps<B: Backend> {
    inner: B::Device,
    prof: Option<OpProfile<B::Event>>,
    /// Ranks per node: a group within one node is intra-node (`None`: every rank on one).
    ranks_per_node: Option<u32>,
}

/// Bytes of a view.
fn vb<T: DeviceTensor>(v: &View<'_, T>) -> u64 {
    v.len() as u64 * v.tensor.dtype().size_bytes()
}

/// Bytes of a writable view.
fn vmb<T: DeviceTensor>(v: &ViewMut<'_, T>) -> u64 {
    v.len() as u64 * v.tensor.dtype().size_bytes()
}

/// Bytes of a tensor.
fn tb<T: DeviceTensor>(t: &T) -> u64 {
    t.size_bytes()
}

/// `C[m, n] = A[m, k] B[k, n]` in `dtype`.
fn gemm(m: usize, n: usize, k: usize, dtype: DType) -> OpKey {
    OpKey::Gemm {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        dtype,
    }
}

/// The mask a block attention of queries at `q` against keys at `k` applies: banded under a
/// window or chunk, full when every key precedes every query, causal otherwise.
fn mask_of(span: AttnSpan, q: &[u32], k: &[u32]) -> MaskKind {
    if span != AttnSpan::Full {
        return MaskKind::Banded;
    }
    match (q.iter().min(), k.iter().max()) {
        (Some(qlo), Some(khi)) if khi <= qlo => MaskKind::Full,
        _ => MaskKind::Causal,
    }
}

impl<B: Backend> TracedOps<B> {
    /// `inner` timed when `profile` is set.
    pub fn new(inner: B::Device, profile: bool, ranks_per_node: Option<u32>) -> Self {
        TracedOps {
            inner,
            prof: profile.then(OpProfile::default),
            ranks_per_node,
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &B::Device {
        &self.inner
    }

    /// The op profile, when profiling.
    pub fn profile(&self) -> Option<&OpProfile<B::Event>> {
        self.prof.as_ref()
    }

    /// The key `key` makes, only while recording (so that it costs nothing otherwise).
    fn key(&self, key: impl FnOnce() -> OpKey) -> Option<OpKey> {
        self.prof.as_ref().filter(|p| p.active()).map(|_| key())
    }

    /// A memory-bound op's key from its bytes.
    fn mem(&self, bytes: impl FnOnce() -> u64) -> Option<OpKey> {
        self.key(|| OpKey::Memory { bytes: bytes() })
    }

    /// An attention's key: `bs` batch and heads, `q` by `k` positions.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        sh: &BlockShape,
        dtype: DType,
        q_len: usize,
        kv_len: usize,
        mask: impl FnOnce() -> MaskKind,
        pass: Pass,
    ) -> Option<OpKey> {
        self.key(|| OpKey::Attention {
            batch_heads: (sh.b * sh.hq) as u64,
            q_len: q_len as u64,
            kv_len: kv_len as u64,
            head_dim: sh.d as u64,
            mask: mask(),
            pass,
            kernel: self.inner.attention_kernel(dtype, sh).to_string(),
        })
    }

    /// Runs `f` on the device, bracketed by events and recorded under `key` when set. An op
    /// with a zero dimension (an expert with no tokens) does no work and is not recorded: its
    /// time, a call's overhead, falls into the host gap.
    fn run<T>(
        &self,
        key: Option<OpKey>,
        f: impl FnOnce(&B::Device) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        self.run_waited(key, || 0.0, f)
    }

    /// [`Self::run`], with the part of the op's time that `blocked_s` (seconds blocked so far)
    /// grows by recorded as a wait ([`OpProfile::push_waited`]).
    fn run_waited<T>(
        &self,
        key: Option<OpKey>,
        blocked_s: impl Fn() -> f64,
        f: impl FnOnce(&B::Device) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let (Some(key), Some(p)) = (key, self.prof.as_ref()) else {
            return f(&self.inner);
        };
        if key.zero_dimension().is_some() {
            return f(&self.inner);
        }
        let blocked_before_s = blocked_s();
        let start = self.inner.record()?;
        let r = f(&self.inner)?;
        let end = self.inner.record()?;
        p.push_waited(key, start, end, blocked_s() - blocked_before_s);
        Ok(r)
    }

    /// Runs the collective `f` (`op` of `bytes` over the global ranks `group`, on `comm`),
    /// timed on the compute stream's events when recording: on a device whose collectives run
    /// on their own stream, the compute stream waits for each, so this is its time as the step
    /// sees it. The part `comm` reports blocked waiting for the other members
    /// ([`DeviceCollectives::blocked_s`]) is recorded as [`OpKey::Wait`], not as the
    /// collective's. A group of one, or nothing moved, is not a collective and is not recorded.
    pub fn timed_collective<T>(
        &self,
        comm: &B::Comm,
        op: CollectiveKind,
        bytes: u64,
        group: &[u32],
        f: impl FnOnce() -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let key = self
            .key(|| OpKey::Collective {
                op,
                bytes,
                group_size: group.len() as u32,
                placement: self.placement(group),
            })
            .filter(|_| group.len() > 1 && bytes > 0);
        self.run_waited(key, || comm.blocked_s(), |_| f())
    }

    /// Where `group`'s members sit.
    fn placement(&self, group: &[u32]) -> Placement {
        let node = |r: u32| self.ranks_per_node.map_or(0, |n| r / n.max(1));
        match group.first() {
            Some(&g0) if group.iter().any(|&r| node(r) != node(g0)) => Placement::InterNode,
            _ => Placement::IntraNode,
        }
    }
}

impl<B: Backend> Device<B> for TracedOps<B> {
    fn memory(&self) -> &MemoryTracker {
        self.inner.memory()
    }
    #[track_caller]
    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<B::Tensor, ExecError> {
        self.inner.alloc(cat, dtype, shape)
    }
    #[track_caller]
    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<B::Tensor, ExecError> {
        self.inner.upload(cat, dtype, shape, data)
    }
    fn download(&self, t: View<'_, B::Tensor>) -> Result<Vec<f32>, ExecError> {
        self.inner.download(t)
    }
    fn gemm_stats(&self) -> (f64, f64) {
        self.inner.gemm_stats()
    }
    fn recat(&self, t: B::Tensor, cat: Category) -> B::Tensor {
        self.inner.recat(t, cat)
    }
    fn record(&self) -> Result<B::Event, ExecError> {
        self.inner.record()
    }
    fn wait(&self, e: &B::Event) -> Result<(), ExecError> {
        self.inner.wait(e)
    }
    fn elapsed_s(&self, start: &B::Event, end: &B::Event) -> Result<f64, ExecError> {
        self.inner.elapsed_s(start, end)
    }
    fn attention_kernel(&self, dtype: DType, sh: &BlockShape) -> &'static str {
        self.inner.attention_kernel(dtype, sh)
    }
}

impl<B: Backend> TensorOps<B> for TracedOps<B> {
    fn linear_fwd(
        &self,
        x: &B::Tensor,
        w: View<'_, B::Tensor>,
        dims: (usize, usize, usize),
        y: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let (n, i, o) = dims;
        let key = self.key(|| gemm(n, o, i, x.dtype()));
        self.run(key, |d| d.linear_fwd(x, w, dims, y))
    }
    fn linear_dgrad(
        &self,
        dy: &B::Tensor,
        w: View<'_, B::Tensor>,
        dims: (usize, usize, usize),
        dx: &mut B::Tensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let (n, i, o) = dims;
        let key = self.key(|| gemm(n, i, o, dy.dtype()));
        self.run(key, |d| d.linear_dgrad(dy, w, dims, dx, acc))
    }
    fn linear_wgrad(
        &self,
        dy: &B::Tensor,
        x: &B::Tensor,
        dims: (usize, usize, usize),
        dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let (n, i, o) = dims;
        let key = self.key(|| gemm(o, i, n, dy.dtype()));
        self.run(key, |d| d.linear_wgrad(dy, x, dims, dw))
    }

    memory_bound! {
        fn norm_fwd(
            kind: Norm,
            x: &B::Tensor,
            p: View<'_, B::Tensor>,
            eps: f32,
            y: &mut B::Tensor,
        ) -> () = tb(x) + vb(&p) + tb(y);
        fn norm_dgrad(
            kind: Norm,
            x: &B::Tensor,
            p: View<'_, B::Tensor>,
            dy: &B::Tensor,
            eps: f32,
            dx: &mut B::Tensor,
            acc: bool,
        ) -> () = tb(x) + vb(&p) + tb(dy) + tb(dx) * (1 + u64::from(acc));
        fn norm_wgrad(
            kind: Norm,
            x: &B::Tensor,
            dy: &B::Tensor,
            eps: f32,
            dp: ViewMut<'_, B::Tensor>,
        ) -> () = tb(x) + tb(dy) + 2 * vmb(&dp);

        fn rotary(
            x: &mut B::Tensor,
            heads: usize,
            positions: &[u32],
            theta: f32,
            inverse: bool,
        ) -> () = 2 * tb(x);

        fn act_fwd(kind: Activation, u: &B::Tensor, out: &mut B::Tensor) -> () = tb(u) + tb(out);
        fn act_bwd_inplace(
            kind: Activation,
            u: &mut B::Tensor,
            dout: &B::Tensor,
        ) -> () = 2 * tb(u) + tb(dout);

        fn add(a: &B::Tensor, b: &B::Tensor, out: &mut B::Tensor) -> () = tb(a) + tb(b) + tb(out);
        fn axpy(
            alpha: f32,
            x: View<'_, B::Tensor>,
            y: ViewMut<'_, B::Tensor>,
        ) -> () = vb(&x) + 2 * vmb(&y);
        fn copy(src: View<'_, B::Tensor>, dst: ViewMut<'_, B::Tensor>) -> () = vb(&src) + vmb(&dst);
        fn fill(t: &mut B::Tensor, value: f32) -> () = tb(t);

        fn bias_add(y: &mut B::Tensor, b: View<'_, B::Tensor>) -> () = 2 * tb(y) + vb(&b);
        fn bias_grad(dy: &B::Tensor, db: ViewMut<'_, B::Tensor>) -> () = tb(dy) + 2 * vmb(&db);

        fn qkv_split(
            qkv: &B::Tensor,
            q: &mut B::Tensor,
            k: &mut B::Tensor,
            v: &mut B::Tensor,
        ) -> () = tb(qkv) + tb(q) + tb(k) + tb(v);
        fn qkv_merge(
            q: &B::Tensor,
            k: &B::Tensor,
            v: &B::Tensor,
            qkv: &mut B::Tensor,
        ) -> () = tb(qkv) + tb(q) + tb(k) + tb(v);
        // The gathered rows read, the output written.
        fn embedding_gather(
            table: View<'_, B::Tensor>,
            tokens: &[u32],
            lo: usize,
            out: &mut B::Tensor,
        ) -> () = 2 * tb(out);
        // dy read, the rows it adds into read and written.
        fn embedding_scatter_add(
            dy: &B::Tensor,
            tokens: &[u32],
            lo: usize,
            grad: ViewMut<'_, B::Tensor>,
        ) -> () = 3 * tb(dy);

        fn heads_concat(
            a: &B::Tensor,
            b: &B::Tensor,
            heads: usize,
            out: &mut B::Tensor,
        ) -> () = tb(a) + tb(b) + tb(out);
        fn heads_split(
            dout: &B::Tensor,
            heads: usize,
            da: &mut B::Tensor,
            db: &mut B::Tensor,
        ) -> () = tb(dout) + tb(da) + tb(db);

        fn ce_row_max(logits: &B::Tensor, max: &mut B::Tensor) -> () = tb(logits) + tb(max);
        fn ce_exp(
            logits: &B::Tensor,
            max: &B::Tensor,
            probs: &mut B::Tensor,
            sum: &mut B::Tensor,
        ) -> () = tb(logits) + tb(max) + tb(probs) + tb(sum);
        // One logit read per row, the row's value written.
        fn ce_target_logit(
            logits: &B::Tensor,
            targets: &[u32],
            lo: usize,
            out: &mut B::Tensor,
        ) -> () = 2 * tb(out);
        fn ce_loss(
            probs: &mut B::Tensor,
            sum: &B::Tensor,
            max: &B::Tensor,
            target_logit: &B::Tensor,
        ) -> f64 = 2 * tb(probs) + tb(sum) + tb(max) + tb(target_logit);
        fn ce_grad(
            probs: &mut B::Tensor,
            targets: &[u32],
            lo: usize,
            scale: f32,
        ) -> () = 2 * tb(probs);
    }

    fn attn_fwd(
        &self,
        sh: &AttnShape,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        o: &mut B::Tensor,
        keep: Keep,
    ) -> Result<AttnSaved<B::Tensor>, ExecError> {
        let mask = || mask_of(sh.span, &[], &[]);
        let key = self.attention(&sh.block(), q.dtype(), sh.s, sh.s, mask, Pass::Forward);
        self.run(key, |d| d.attn_fwd(sh, q, k, v, o, keep))
    }
    fn attn_bwd(
        &self,
        sh: &AttnShape,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        saved: &AttnSaved<B::Tensor>,
        dout: &B::Tensor,
        dq: &mut B::Tensor,
        dk: &mut B::Tensor,
        dv: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        let mask = || mask_of(sh.span, &[], &[]);
        let key = self.attention(&sh.block(), q.dtype(), sh.s, sh.s, mask, Pass::Backward);
        self.run(key, |d| d.attn_bwd(sh, q, k, v, saved, dout, dq, dk, dv))
    }

    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        q: &B::Tensor,
        qs: Side<'_>,
        k: View<'_, B::Tensor>,
        v: View<'_, B::Tensor>,
        ks: Side<'_>,
        acc: &mut B::Tensor,
        max: &mut B::Tensor,
        sum: &mut B::Tensor,
        tile: &mut B::Tensor,
    ) -> Result<u64, ExecError> {
        let mask = || mask_of(sh.span, qs.pos, ks.pos);
        let (ql, kl) = (qs.pos.len(), ks.pos.len());
        let key = self.attention(sh, q.dtype(), ql, kl, mask, Pass::Forward);
        self.run(key, |d| {
            d.flash_fwd_block(sh, q, qs, k, v, ks, acc, max, sum, tile)
        })
    }
    memory_bound! {
        fn flash_finish(
            sh: &BlockShape,
            rows: usize,
            acc: &mut B::Tensor,
            max: &B::Tensor,
            sum: &B::Tensor,
            lse: &mut B::Tensor,
        ) -> () = 2 * tb(acc) + tb(max) + tb(sum) + tb(lse);
        fn flash_delta(
            sh: &BlockShape,
            rows: usize,
            dout: &B::Tensor,
            o: &B::Tensor,
            out: &mut B::Tensor,
        ) -> () = tb(dout) + tb(o) + tb(out);
        fn attn_sink_fwd(
            sh: &BlockShape,
            rows: usize,
            o: &mut B::Tensor,
            lse: &mut B::Tensor,
            sinks: View<'_, B::Tensor>,
        ) -> () = 2 * tb(o) + 2 * tb(lse) + vb(&sinks);
        fn attn_sink_grad(
            sh: &BlockShape,
            rows: usize,
            lse: &B::Tensor,
            delta: &B::Tensor,
            sinks: View<'_, B::Tensor>,
            dsinks: ViewMut<'_, B::Tensor>,
        ) -> () = tb(lse) + tb(delta) + vb(&sinks) + 2 * vmb(&dsinks);
    }
    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        q: &B::Tensor,
        qs: Side<'_>,
        k: View<'_, B::Tensor>,
        v: View<'_, B::Tensor>,
        ks: Side<'_>,
        dout: &B::Tensor,
        lse: &B::Tensor,
        delta: &B::Tensor,
        dq: &mut B::Tensor,
        dk: ViewMut<'_, B::Tensor>,
        dv: ViewMut<'_, B::Tensor>,
        p_tile: &mut B::Tensor,
        dp_tile: &mut B::Tensor,
    ) -> Result<u64, ExecError> {
        let mask = || mask_of(sh.span, qs.pos, ks.pos);
        let (ql, kl) = (qs.pos.len(), ks.pos.len());
        let key = self.attention(sh, q.dtype(), ql, kl, mask, Pass::Backward);
        self.run(key, |d| {
            d.flash_bwd_block(
                sh, q, qs, k, v, ks, dout, lse, delta, dq, dk, dv, p_tile, dp_tile,
            )
        })
    }

    memory_bound! {
        fn ulysses_pack(
            geo: &UlyssesGeo,
            from: UlyssesLayout,
            xs: &[(&B::Tensor, UlyssesPart)],
            out: &mut B::Tensor,
        ) -> () = 2 * tb(out);
        fn ulysses_unpack(
            geo: &UlyssesGeo,
            to: UlyssesLayout,
            recv: &B::Tensor,
            parts: &[UlyssesPart],
            outs: &mut [&mut B::Tensor],
        ) -> () = 2 * tb(recv);

        fn moe_route(logits: &mut B::Tensor, moe: &MoeShape) -> (Routing, f64) = 2 * tb(logits);
        fn moe_route_scored(
            logits: &mut B::Tensor,
            bias: Option<&[f32]>,
            moe: &MoeShape,
        ) -> (Routing, f64, Vec<usize>) = 2 * tb(logits);
        fn moe_router_bwd(
            dm: &mut B::Tensor,
            probs: &B::Tensor,
            fraction: &[f64],
            aux_scale: f64,
        ) -> () = 2 * tb(dm) + tb(probs);
        fn moe_router_scored_bwd(
            dm: &mut B::Tensor,
            scores: &B::Tensor,
            chosen: &[usize],
            moe: &MoeShape,
            fraction: &[f64],
            aux_scale: f64,
        ) -> () = 2 * tb(dm) + tb(scores);
        fn gather_rows(src: &B::Tensor, rows: &[usize], out: &mut B::Tensor) -> () = 2 * tb(out);
        fn scatter_add_rows(
            src: &B::Tensor,
            rows: &[usize],
            weights: Option<&[f32]>,
            out: &mut B::Tensor,
        ) -> () = 3 * tb(src);
        fn moe_combine_bwd(
            dy: &B::Tensor,
            y: &B::Tensor,
            routes: &[Route],
            dprobs: &mut B::Tensor,
            dsend: &mut B::Tensor,
        ) -> () = tb(dy) + tb(y) + tb(dprobs) + tb(dsend);

        fn dropout_inplace(
            dkey: &crate::rng::DropoutKey,
            tokens: &[u64],
            col_offset: u64,
            x: ViewMut<'_, B::Tensor>,
        ) -> () = 2 * vmb(&x);
        // The mask: one byte per element.
        fn dropout_save(
            dkey: &crate::rng::DropoutKey,
            tokens: &[u64],
            col_offset: u64,
            x: ViewMut<'_, B::Tensor>,
        ) -> B::Tensor = 2 * vmb(&x) + x.len() as u64;
        fn dropout_apply(
            mask: &B::Tensor,
            scale: f32,
            x: ViewMut<'_, B::Tensor>,
        ) -> () = tb(mask) + 2 * vmb(&x);

        fn adam(
            c: &AdamConfig,
            t: u32,
            p: ViewMut<'_, B::Tensor>,
            g: View<'_, B::Tensor>,
            m: &mut B::Tensor,
            v: &mut B::Tensor,
            weight_copy: Option<ViewMut<'_, B::Tensor>>,
        ) -> () = 2 * (vmb(&p) + tb(m) + tb(v)) + vb(&g) + weight_copy.as_ref().map_or(0, vmb);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_masks_follow_the_positions_and_the_span() {
        // Keys wholly before the queries: every pair visible.
        assert_eq!(mask_of(AttnSpan::Full, &[4, 5], &[0, 1]), MaskKind::Full);
        // The diagonal block: causal.
        assert_eq!(mask_of(AttnSpan::Full, &[0, 1], &[0, 1]), MaskKind::Causal);
        assert_eq!(mask_of(AttnSpan::Window(2), &[4], &[0]), MaskKind::Banded);
    }
}
