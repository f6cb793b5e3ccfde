//! The tensor ops of a training step ([`TensorOps`]), one method per op and direction,
//! grouped by op family in the order of the CPU's `cpu/ops/<family>.rs` files.
//!
//! A new op: its method here in its family's section (a new host-side argument type goes
//! into `shapes.rs` and is re-exported by `backend/mod.rs`); its CPU twin, the kernel on host
//! slices with a unit test in `cpu/ops/<family>.rs` and the method in the family's section of
//! `cpu/ops/mod.rs` (unpack the tensors, run the kernel, round bf16 outputs with `store_all` or
//! `store_view`); and the CUDA backend's method, launch wrapper and kernel.

use super::shapes::{
    AttnSaved, AttnShape, BlockShape, Keep, MambaGeo, Route, Routing, Side, UlyssesGeo,
    UlyssesLayout, UlyssesPart,
};
use super::tensor::{View, ViewMut};
use super::types::BackendTypes;
use crate::error::ExecError;
use parsim_plan::plan::{Activation, AdamConfig, MoeShape, Norm};

/// The tensor ops of a training step on device tensors, each with its backward; every op is
/// fallible (a device kernel can fail to launch). Row-major; `n` rows of `i` inputs and `o`
/// outputs for linear layers (weights [o, i]). Accumulation is fp32 whatever the tensors'
/// dtype.
pub trait TensorOps<B: BackendTypes>: MambaOps<B> {
    // --- linear layers ---
    /// y[n, o] = x[n, i] . w[o, i]^T.
    fn linear_fwd(
        &self,
        x: &B::Tensor,
        w: View<'_, B::Tensor>,
        dims: (usize, usize, usize),
        y: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// dx[n, i] (+)= dy[n, o] . w[o, i].
    fn linear_dgrad(
        &self,
        dy: &B::Tensor,
        w: View<'_, B::Tensor>,
        dims: (usize, usize, usize),
        dx: &mut B::Tensor,
        acc: bool,
    ) -> Result<(), ExecError>;
    /// dw[o, i] += dy^T . x.
    fn linear_wgrad(
        &self,
        dy: &B::Tensor,
        x: &B::Tensor,
        dims: (usize, usize, usize),
        dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;

    // --- norms ---
    /// Norm over rows of `h` with gain (and bias for LayerNorm) `p`.
    fn norm_fwd(
        &self,
        kind: Norm,
        x: &B::Tensor,
        p: View<'_, B::Tensor>,
        eps: f32,
        y: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// dx (+)= the norm's input gradient.
    #[allow(clippy::too_many_arguments)]
    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &B::Tensor,
        p: View<'_, B::Tensor>,
        dy: &B::Tensor,
        eps: f32,
        dx: &mut B::Tensor,
        acc: bool,
    ) -> Result<(), ExecError>;
    /// dp += the gain (and bias) gradient.
    fn norm_wgrad(
        &self,
        kind: Norm,
        x: &B::Tensor,
        dy: &B::Tensor,
        eps: f32,
        dp: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;

    // --- rotary embedding ---
    /// Rotary embedding in place on [rows, heads * d]; row r of a sequence sits at
    /// `positions[r % positions.len()]`.
    fn rotary(
        &self,
        x: &mut B::Tensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError>;

    // --- activations ---
    /// out[n, f] = act(u[n, f or 2f]) (SwiGLU halves its input).
    fn act_fwd(
        &self,
        kind: Activation,
        u: &B::Tensor,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// The activation's input gradient, overwriting its input `u`.
    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut B::Tensor,
        dout: &B::Tensor,
    ) -> Result<(), ExecError>;

    // --- element-wise ---
    /// out = a + b.
    fn add(&self, a: &B::Tensor, b: &B::Tensor, out: &mut B::Tensor) -> Result<(), ExecError>;
    /// y += alpha * x.
    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, B::Tensor>,
        y: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// dst = src (converting the dtype: fp32 to bf16 rounds to nearest even).
    fn copy(&self, src: View<'_, B::Tensor>, dst: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;
    /// Every element of `t` set to `value`.
    fn fill(&self, t: &mut B::Tensor, value: f32) -> Result<(), ExecError>;

    // --- biases ---
    /// y[n, o] += b[o] on every row: a linear layer's bias (`b` holds o elements).
    fn bias_add(&self, y: &mut B::Tensor, b: View<'_, B::Tensor>) -> Result<(), ExecError>;
    /// db[o] += the column sums of dy[n, o]: a bias's gradient over this rank's rows.
    fn bias_grad(&self, dy: &B::Tensor, db: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;

    // --- layouts: the fused projection and the embedding ---
    /// Splits the rows of a fused projection [n, q + k + v] into q [n, q], k [n, k], v [n, v].
    fn qkv_split(
        &self,
        qkv: &B::Tensor,
        q: &mut B::Tensor,
        k: &mut B::Tensor,
        v: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// The inverse of [`TensorOps::qkv_split`].
    fn qkv_merge(
        &self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        qkv: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// out[r] = table[tokens[r] - lo] for the tokens in this shard's rows lo..lo + rows,
    /// zeros for the others (vocab-parallel embedding).
    fn embedding_gather(
        &self,
        table: View<'_, B::Tensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// grad[tokens[r] - lo] += dy[r] for the tokens in this shard (embedding weight gradient).
    fn embedding_scatter_add(
        &self,
        dy: &B::Tensor,
        tokens: &[u32],
        lo: usize,
        grad: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;

    // --- MLA's heads ---
    /// MLA's query/key heads (DeepSeek-V2, decoupled rotary): out [n, heads (da + db)] with
    /// head h = [a's head h, b's head h]; `a` [n, heads da], `b` [n, heads db] or [n, db]
    /// (the rotary key, shared by every head).
    fn heads_concat(
        &self,
        a: &B::Tensor,
        b: &B::Tensor,
        heads: usize,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// The backward of [`Self::heads_concat`]: `da` and `db` written from `dout` (a shared
    /// `db` sums the heads' gradients).
    fn heads_split(
        &self,
        dout: &B::Tensor,
        heads: usize,
        da: &mut B::Tensor,
        db: &mut B::Tensor,
    ) -> Result<(), ExecError>;

    // --- vocab-parallel cross-entropy ---
    /// Vocab-parallel cross-entropy, first piece: the row maximum of the logits shard [n, v].
    fn ce_row_max(&self, logits: &B::Tensor, max: &mut B::Tensor) -> Result<(), ExecError>;
    /// Second piece: probs = exp(logits - max) and its row sums.
    fn ce_exp(
        &self,
        logits: &B::Tensor,
        max: &B::Tensor,
        probs: &mut B::Tensor,
        sum: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Third piece: the logit of each row's target where this shard (columns lo..) holds it,
    /// 0 elsewhere.
    fn ce_target_logit(
        &self,
        logits: &B::Tensor,
        targets: &[u32],
        lo: usize,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Last piece: normalises `probs` by the global row sums and returns the sum over rows of
    /// log(sum) + max - target logit (the only host read of the forward).
    fn ce_loss(
        &self,
        probs: &mut B::Tensor,
        sum: &B::Tensor,
        max: &B::Tensor,
        target_logit: &B::Tensor,
    ) -> Result<f64, ExecError>;
    /// Backward, in place: dlogits = scale * (probs - onehot(target)).
    fn ce_grad(
        &self,
        probs: &mut B::Tensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError>;

    // --- whole-sequence attention ---
    /// Causal GQA attention o = softmax(q k^T / sqrt(d)) v over whole sequences; returns what
    /// `keep` asks to save.
    fn attn_fwd(
        &self,
        sh: &AttnShape,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        o: &mut B::Tensor,
        keep: Keep,
    ) -> Result<AttnSaved<B::Tensor>, ExecError>;
    /// dq, dk and dv (written) from do.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), ExecError>;

    // --- block attention ---
    /// Block attention forward: merges one K/V block into the running output `acc` and the
    /// online-softmax statistics `max`, `sum` ([b, hq, q rows] each); `tile` is scratch of at
    /// least (q tile x k tile). Returns the unmasked score elements (the causal work).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<u64, ExecError>;
    /// The merge's end: normalises `acc` in place and writes the log-sum-exp.
    fn flash_finish(
        &self,
        sh: &BlockShape,
        rows: usize,
        acc: &mut B::Tensor,
        max: &B::Tensor,
        sum: &B::Tensor,
        lse: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// FlashAttention-2's D = rowsum(dO * O) per row and head, [b, rows, hq].
    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &B::Tensor,
        o: &B::Tensor,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Attention sinks (GPT-OSS): head h's logit `sinks[h]` joins every row's softmax
    /// denominator. From the normalised output `o` [b, rows, hq, dv] and the keys'
    /// log-sum-exp `lse` [b, hq, rows], in place: lse' = log(exp(lse) + exp(sink)),
    /// o *= exp(lse - lse'). The backward of the keys then runs unchanged on lse'.
    fn attn_sink_fwd(
        &self,
        sh: &BlockShape,
        rows: usize,
        o: &mut B::Tensor,
        lse: &mut B::Tensor,
        sinks: View<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// The sinks' gradient, added into `dsinks`: -sum over each head's rows of
    /// exp(sink - lse') D, from the final `lse` [b, hq, rows] and D = rowsum(dO * O)
    /// ([`Self::flash_delta`], [b, rows, hq]).
    #[allow(clippy::too_many_arguments)]
    fn attn_sink_grad(
        &self,
        sh: &BlockShape,
        rows: usize,
        lse: &B::Tensor,
        delta: &B::Tensor,
        sinks: View<'_, B::Tensor>,
        dsinks: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// Block attention backward: dQ (local rows) +=, dK and dV (the block's rows) +=, from
    /// the final log-sum-exp and D; `p_tile`, `dp_tile` are scratch. Returns the work.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<u64, ExecError>;

    // --- Ulysses' all-to-all layouts ---
    /// Ulysses pack: tensors on side `from` into the all-to-all send buffer `out`.
    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&B::Tensor, UlyssesPart)],
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Ulysses unpack: the received buffer into tensors on side `to`.
    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &B::Tensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut B::Tensor],
    ) -> Result<(), ExecError>;

    // --- MoE routing and token permutation ---
    /// MoE router: softmax of `logits` [n, E] in place (they become the probabilities), then
    /// top-k with the capacity's drops; returns the routing and the load-balancing loss.
    fn moe_route(
        &self,
        logits: &mut B::Tensor,
        moe: &MoeShape,
    ) -> Result<(Routing, f64), ExecError>;
    /// MoE router with DeepSeek-V3's options (`moe.router`): scores of `logits` [n, E] in
    /// place (softmax or sigmoid), then per token the top-k of score + `bias` (host, [E]; for
    /// selection only) within its best `group_topk` groups; gates are the chosen unbiased
    /// scores, renormalised over the k when asked; capacity drops as [`Self::moe_route`].
    /// Returns the routing, the load-balancing loss (softmax scores) and the k chosen experts
    /// of every token before dropping ([n k], choice order).
    fn moe_route_scored(
        &self,
        logits: &mut B::Tensor,
        bias: Option<&[f32]>,
        moe: &MoeShape,
    ) -> Result<(Routing, f64, Vec<usize>), ExecError>;
    /// Backward of the router in place: `d` [n, E] (probabilities' gradient, plus
    /// `aux_scale` f_i of the load-balancing loss) becomes the logits' gradient.
    fn moe_router_bwd(
        &self,
        d: &mut B::Tensor,
        probs: &B::Tensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError>;
    /// Backward of [`Self::moe_route_scored`] in place: `d` [n, E] (the gates' gradients at
    /// the chosen entries, zero elsewhere) becomes the logits' gradient, through the
    /// renormalisation, the load-balancing loss's `aux_scale` f_i (softmax only) and the
    /// score function; `scores` [n, E] as the forward left them.
    fn moe_router_scored_bwd(
        &self,
        d: &mut B::Tensor,
        scores: &B::Tensor,
        chosen: &[usize],
        moe: &MoeShape,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError>;
    /// Token permutation: out[i] = src[rows[i]].
    fn gather_rows(
        &self,
        src: &B::Tensor,
        rows: &[usize],
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Its inverse, adding: out[rows[i]] += w_i src[i] (w_i = 1 without weights).
    fn scatter_add_rows(
        &self,
        src: &B::Tensor,
        rows: &[usize],
        weights: Option<&[f32]>,
        out: &mut B::Tensor,
    ) -> Result<(), ExecError>;
    /// Backward of the gated combine: gate gradients into `dprobs` [n, E], the routed rows'
    /// gradients into `dsend` [routes, h].
    fn moe_combine_bwd(
        &self,
        dy: &B::Tensor,
        y: &B::Tensor,
        routes: &[Route],
        dprobs: &mut B::Tensor,
        dsend: &mut B::Tensor,
    ) -> Result<(), ExecError>;

    // --- dropout ---
    /// Inverted dropout in place: x[i, j] *= mask(tokens[i], col_offset + j), the mask being 0
    /// or 1 / (1 - p) drawn by Philox 4x32-10 from `key` and the element's global coordinates
    /// ([`crate::rng`]). The backward is the same call on the output gradient.
    fn dropout_inplace(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// [`TensorOps::dropout_inplace`] that also returns the keep mask (0 or 1, one byte per
    /// element, an activation) for the backward, as Megatron saves it.
    fn dropout_save(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, B::Tensor>,
    ) -> Result<B::Tensor, ExecError>;
    /// x *= mask x `scale`: a saved dropout mask applied to the output gradient.
    fn dropout_apply(
        &self,
        mask: &B::Tensor,
        scale: f32,
        x: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;

    // --- the optimizer ---
    /// Adam on fp32 master weights `p` with gradient `g` and moments `m`, `v`; with
    /// `weight_copy`, also writes the updated weights there (the bf16 copy the model reads, in
    /// the same pass, as a fused mixed-precision optimizer kernel does).
    #[allow(clippy::too_many_arguments)]
    fn adam(
        &self,
        c: &AdamConfig,
        t: u32,
        p: ViewMut<'_, B::Tensor>,
        g: View<'_, B::Tensor>,
        m: &mut B::Tensor,
        v: &mut B::Tensor,
        weight_copy: Option<ViewMut<'_, B::Tensor>>,
    ) -> Result<(), ExecError>;
}

/// The Mamba-2 mixer's ops (the CPU's `cpu/ops/mamba.rs`), a family of its own: a backend
/// without them (`impl MambaOps for .. {}`) refuses the mixer by name; the CUDA backend
/// refuses hybrid plans before it runs (`runner::cuda`).
pub trait MambaOps<B: BackendTypes> {
    /// Splits in_proj's output [n, proj] into z [n, inner], x/B/C [n, conv] and dt [n, heads].
    fn mamba_split(
        &self,
        _zxbcdt: &B::Tensor,
        _z: &mut B::Tensor,
        _xbc: &mut B::Tensor,
        _dt: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The reverse of [`TensorOps::mamba_split`]: the gradients into one [n, proj].
    fn mamba_merge(
        &self,
        _dz: &B::Tensor,
        _dxbc: &B::Tensor,
        _ddt: &B::Tensor,
        _out: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// SiLU of the causal depthwise convolution over each sequence; `w` is [conv, k + 1], the
    /// k taps then the bias of each channel.
    fn mamba_conv_fwd(
        &self,
        _g: &MambaGeo,
        _x: &B::Tensor,
        _w: View<'_, B::Tensor>,
        _y: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The convolution's input gradient `dx` (written) and its weights' `dw` (accumulated),
    /// from its input `x` and the output gradient `dy`.
    #[allow(clippy::too_many_arguments)]
    fn mamba_conv_bwd(
        &self,
        _g: &MambaGeo,
        _x: &B::Tensor,
        _w: View<'_, B::Tensor>,
        _dy: &B::Tensor,
        _dx: &mut B::Tensor,
        _dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The SSD chunked scan with the D skip: y [n, inner] from x/B/C [n, conv] and dt's
    /// projection [n, heads]; `ssm` is [3, heads]: A_log, D, dt's bias. Writes dt (after the
    /// softplus) and dt x A [n, heads] for backward; `states` is the chunk states' scratch
    /// ([`MambaGeo::states_len`]).
    #[allow(clippy::too_many_arguments)]
    fn mamba_ssd_fwd(
        &self,
        _g: &MambaGeo,
        _xbc: &B::Tensor,
        _dt_raw: &B::Tensor,
        _ssm: View<'_, B::Tensor>,
        _y: &mut B::Tensor,
        _dt: &mut B::Tensor,
        _da: &mut B::Tensor,
        _states: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The scan's backward: `dxbc` and `ddt_raw` written, `dssm` accumulated, from the saved
    /// x/B/C and dt and the output gradient `dy`; the chunk states are recomputed in `states`.
    #[allow(clippy::too_many_arguments)]
    fn mamba_ssd_bwd(
        &self,
        _g: &MambaGeo,
        _xbc: &B::Tensor,
        _dt: &B::Tensor,
        _ssm: View<'_, B::Tensor>,
        _dy: &B::Tensor,
        _dxbc: &mut B::Tensor,
        _ddt_raw: &mut B::Tensor,
        _dssm: ViewMut<'_, B::Tensor>,
        _states: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The gated RMSNorm: out = rmsnorm(y x SiLU(z)) x w, normalised over each B/C group's
    /// heads (Megatron-Core's RMSNormGated, norm_before_gate = False).
    fn mamba_gate_fwd(
        &self,
        _g: &MambaGeo,
        _y: &B::Tensor,
        _z: &B::Tensor,
        _w: View<'_, B::Tensor>,
        _out: &mut B::Tensor,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
    /// The gated norm's input gradients `dy`, `dz` (written) and its weight's `dw`
    /// (accumulated) from the output gradient `dout`.
    #[allow(clippy::too_many_arguments)]
    fn mamba_gate_bwd(
        &self,
        _g: &MambaGeo,
        _y: &B::Tensor,
        _z: &B::Tensor,
        _w: View<'_, B::Tensor>,
        _dout: &B::Tensor,
        _dy: &mut B::Tensor,
        _dz: &mut B::Tensor,
        _dw: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        Err(no_mamba())
    }
}

/// The error of a backend that does not run the Mamba-2 mixer.
fn no_mamba() -> ExecError {
    ExecError::Unsupported {
        field: "model.mamba",
        message: "this backend does not run the Mamba-2 mixer",
    }
}
