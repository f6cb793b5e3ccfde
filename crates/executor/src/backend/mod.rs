//! What a backend implements. [`Backend`] names its device tensor, event, process group and
//! per-rank device; the device allocates, uploads and downloads tensors, counts them in the
//! rank's [`MemoryTracker`], and runs the [`TensorOps`] and [`DeviceCollectives`] of a training
//! step on device tensors, every one fallible. Model code calls these and touches no element
//! on the host (Burn and candle structure their backends the same way: associated storage
//! types, monomorphised model code).
//!
//! The `cpu` backend is the reference; the `cuda` backend implements the same traits on device
//! buffers. [`Collectives`] is the host-slice layer the CPU collectives are
//! built on.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::ExecError;
use crate::plan::{Activation, AdamConfig, MoeShape, Norm};
use crate::tracker::{Category, MemoryTracker};
pub use parsim_plan::DType;
use std::ops::Range;

/// What every device tensor tells about itself.
pub trait DeviceTensor {
    fn shape(&self) -> &[usize];
    fn dtype(&self) -> DType;
    fn category(&self) -> Category;
    /// Elements.
    fn len(&self) -> usize {
        self.shape().iter().product()
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rows (the first dimension).
    fn rows(&self) -> usize {
        self.shape().first().copied().unwrap_or(0)
    }
    /// Elements per row.
    fn cols(&self) -> usize {
        self.shape().iter().skip(1).product()
    }
    /// Bytes the tensor's elements take.
    fn size_bytes(&self) -> u64 {
        self.len() as u64 * self.dtype().size_bytes()
    }
}

/// Elements `range` of a tensor seen flat: a parameter of a flat buffer, a ZeRO shard, a row
/// block.
#[derive(Debug)]
pub struct View<'t, T> {
    pub tensor: &'t T,
    pub range: Range<usize>,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        View {
            tensor: self.tensor,
            range: self.range.clone(),
        }
    }
}

impl<'t, T: DeviceTensor> View<'t, T> {
    /// The whole tensor.
    pub fn all(tensor: &'t T) -> View<'t, T> {
        View {
            range: 0..tensor.len(),
            tensor,
        }
    }

    /// Elements `r` of this view (relative to its start).
    pub fn sub(&self, r: Range<usize>) -> View<'t, T> {
        debug_assert!(r.end <= self.range.len());
        View {
            tensor: self.tensor,
            range: self.range.start + r.start..self.range.start + r.end,
        }
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// Writable elements `range` of a tensor seen flat: a gradient slice, a shard.
#[derive(Debug)]
pub struct ViewMut<'t, T> {
    pub tensor: &'t mut T,
    pub range: Range<usize>,
}

impl<'t, T: DeviceTensor> ViewMut<'t, T> {
    /// The whole tensor.
    pub fn all(tensor: &'t mut T) -> ViewMut<'t, T> {
        ViewMut {
            range: 0..tensor.len(),
            tensor,
        }
    }

    /// Elements `r` of this view (relative to its start), reborrowed.
    pub fn sub(&mut self, r: Range<usize>) -> ViewMut<'_, T> {
        debug_assert!(r.end <= self.range.len());
        ViewMut {
            range: self.range.start + r.start..self.range.start + r.end,
            tensor: self.tensor,
        }
    }

    /// The same elements, reborrowed.
    pub fn reborrow(&mut self) -> ViewMut<'_, T> {
        ViewMut {
            range: self.range.clone(),
            tensor: self.tensor,
        }
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// A backend: its associated types. Model code is generic over `B: Backend` and monomorphised
/// per backend.
pub trait Backend: Sized + 'static {
    /// A tensor in device memory, with its shape, dtype and memory category.
    type Tensor: DeviceTensor;
    /// A point in a device stream that another stream (or the host) can wait for.
    type Event;
    /// A process group (NCCL communicator, or the CPU's shared-memory group).
    type Group: ProcessGroup + Clone;
    /// One rank's device: allocation, the rank's tracker, tensor ops.
    type Device: Device<Self>;
    /// One rank's collectives on device tensors.
    type Comm: DeviceCollectives<Self>;
}

/// A process group as one member sees it.
pub trait ProcessGroup {
    /// Members.
    fn size(&self) -> usize;
    /// This member's index among the members.
    fn index(&self) -> usize;
    /// The members' global ranks, in member order.
    fn members(&self) -> &[u32];
}

/// One rank's device: allocation, upload and download (download only for the loss, exports and
/// tests), events, and the tensor ops.
pub trait Device<B: Backend>: TensorOps<B> {
    /// The rank's tracker of requested and reserved bytes by category.
    fn memory(&self) -> &MemoryTracker;
    /// A zero-filled tensor.
    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<B::Tensor, ExecError>;
    /// A tensor holding `data` (rounded to `dtype`).
    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<B::Tensor, ExecError>;
    /// The elements of a view, widened to f32.
    fn download(&self, t: View<'_, B::Tensor>) -> Result<Vec<f32>, ExecError>;
    /// FLOPs and seconds of the device's matrix multiplications so far.
    fn gemm_stats(&self) -> (f64, f64);
    /// Moves a tensor to another memory category (a temporary kept as an activation).
    fn recat(&self, t: B::Tensor, cat: Category) -> B::Tensor;
    /// An event at the current point of the compute stream.
    fn record(&self) -> Result<B::Event, ExecError>;
    /// Makes the compute stream wait for `e`.
    fn wait(&self, e: &B::Event) -> Result<(), ExecError>;
    /// Seconds from `start` to `end` (waiting for `end`): step and phase times come from
    /// events, since a device's host calls return before its work ends.
    fn elapsed_s(&self, start: &B::Event, end: &B::Event) -> Result<f64, ExecError>;
}

/// Collectives on device tensors, with NCCL's semantics within a group (see [`Collectives`]
/// for each one's contract), plus point-to-point messages.
pub trait DeviceCollectives<B: Backend> {
    /// This rank's handle on the group of `members` (global ranks, in member order).
    fn group(&self, members: &[u32]) -> Result<B::Group, ExecError>;
    /// In-place reduce-scatter of a flat buffer held whole by every member: afterwards
    /// `buf[mine]` is the sum over members of their `buf[mine]` (ZeRO-1's gradient step).
    fn reduce_scatter_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError>;
    /// In-place all-gather of a flat buffer whose shard `mine` is this member's: afterwards
    /// every member holds every member's shard (the updated parameters of ZeRO 1/2).
    fn all_gather_in_place(
        &self,
        g: &B::Group,
        buf: &mut B::Tensor,
        mine: Range<usize>,
    ) -> Result<(), ExecError>;
    fn all_reduce(
        &self,
        g: &B::Group,
        buf: ViewMut<'_, B::Tensor>,
        op: ReduceOp,
    ) -> Result<(), ExecError>;
    fn all_gather(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    fn reduce_scatter(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    fn all_to_all(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// All-to-all of host counts (split sizes of a following [`DeviceCollectives::all_to_all_v`]):
    /// `send` holds `send.len() / size` counts per member; returns what each member sent this
    /// one, in member order.
    fn all_to_all_counts(&self, g: &B::Group, send: &[usize]) -> Result<Vec<usize>, ExecError>;
    /// See [`Collectives::all_to_all_v`] (counts in elements).
    fn all_to_all_v(
        &self,
        g: &B::Group,
        input: View<'_, B::Tensor>,
        send_counts: &[usize],
        out: ViewMut<'_, B::Tensor>,
        recv_counts: &[usize],
    ) -> Result<(), ExecError>;
    fn send(&self, to: u32, tag: u64, data: View<'_, B::Tensor>) -> Result<(), ExecError>;
    fn recv(&self, from: u32, tag: u64, out: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;
    /// Posts point-to-point `sends` and `recvs` as one exchange without waiting for the
    /// receives (TransformerEngine's ring attention posts step i+1's exchange before it
    /// computes step i): the data of `sends` is taken at the call; the receive buffers move
    /// into the returned [`Pending`] and come back, holding their messages, from
    /// [`DeviceCollectives::wait`].
    fn p2p_start(
        &self,
        sends: &[SendFrom<'_, B::Tensor>],
        recvs: Vec<RecvInto<B::Tensor>>,
    ) -> Result<Pending<B>, ExecError>;
    /// Completes a [`DeviceCollectives::p2p_start`]: the receive buffers in posting order;
    /// the device's next work sees their messages (CPU: the receives happen here; CUDA: the
    /// compute stream waits for the exchange's event).
    fn wait(&self, p: Pending<B>) -> Result<Vec<B::Tensor>, ExecError>;
    /// See [`Collectives::gather_range`].
    fn gather_range(
        &self,
        g: &B::Group,
        mine_lo: usize,
        mine: View<'_, B::Tensor>,
        want: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// See [`Collectives::reduce_scatter_range`].
    fn reduce_scatter_range(
        &self,
        g: &B::Group,
        input_lo: usize,
        input: View<'_, B::Tensor>,
        mine: Range<usize>,
        out: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// A data-parallel gradient bucket reduced during backward (Megatron-Core's
    /// `overlap_grad_reduce`): elements `bucket` of `grads`, a flat buffer held whole by every
    /// member (all passing the same range), become the sum over members, all of them (ZeRO
    /// 0's all-reduce) or, `sharded`, those inside this member's [`flat_shard`] (ZeRO 1's
    /// reduce-scatter; the others keep this member's values). A device may run it after the
    /// call returns, overlapped with the work that follows: its result is there after
    /// [`DeviceCollectives::join_grad_buckets`], and nothing may write `bucket` before.
    fn reduce_grad_bucket(
        &self,
        g: &B::Group,
        grads: &mut B::Tensor,
        bucket: Range<usize>,
        sharded: bool,
    ) -> Result<(), ExecError>;
    /// Makes the device's next work wait for every gradient bucket issued so far (the
    /// optimizer step; the CPU's reductions are done at the call).
    fn join_grad_buckets(&self) -> Result<(), ExecError>;
}

/// Member `index`'s shard of a flat buffer of `total` elements split over `size` members:
/// contiguous ranges of ceil(total / size) elements, the last ones shorter or empty (ZeRO's
/// sharding of the parameter, gradient and optimizer buffers, as Megatron's distributed
/// optimizer does).
pub fn flat_shard(total: usize, size: usize, index: usize) -> Range<usize> {
    let per = total.div_ceil(size.max(1));
    (index * per).min(total)..((index + 1) * per).min(total)
}

/// One send of a [`DeviceCollectives::p2p_start`]: `data` to global rank `to` as message `tag`.
pub struct SendFrom<'a, T> {
    pub to: u32,
    pub tag: u64,
    pub data: View<'a, T>,
}

/// One receive of a [`DeviceCollectives::p2p_start`]: message `tag` from global rank `from`
/// into the whole of `buf`.
pub struct RecvInto<T> {
    pub from: u32,
    pub tag: u64,
    pub buf: T,
}

/// A posted point-to-point exchange: it owns its receive buffers until
/// [`DeviceCollectives::wait`] hands them back, so nothing reads them before their data
/// lands (on CUDA a dropped one frees them only after the exchange's event).
pub struct Pending<B: Backend> {
    pub recvs: Vec<RecvInto<B::Tensor>>,
    /// The backend's mark of the exchange's end (CUDA: an event on the collective stream
    /// after the grouped NCCL send/recv); `None` where the receives happen at the wait.
    pub done: Option<std::sync::Arc<B::Event>>,
    /// When the exchange was posted, on the trace clock (set by the recording layer, so
    /// that a receive's span runs from its post to its wait).
    pub posted_s: Option<f64>,
}

/// Shapes of one causal grouped-query attention call on one rank: `b` sequences of `s`
/// positions, `heads` query heads sharing `kv_heads` K/V heads of width `d`; rows are
/// (sequence, position), columns (head, feature).
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Sequences in the microbatch.
    pub b: usize,
    pub s: usize,
    /// Query heads on this rank.
    pub heads: usize,
    /// K/V heads on this rank.
    pub kv_heads: usize,
    /// Query/key head width.
    pub d: usize,
    /// Value (and output) head width: `d` except under MLA (DeepSeek-V2).
    pub dv: usize,
    /// Dropout of the attention probabilities (`None`: none), its mask regenerated in backward.
    pub dropout: Option<crate::rng::AttnDropout>,
}

/// One kept assignment of a token to an expert (MoE routing: host metadata, as the split
/// sizes of the dispatch all-to-all are on the host for NCCL too).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub token: usize,
    pub expert: usize,
    pub gate: f32,
}

/// The router's decisions for one microbatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Kept assignments ordered by expert, then token.
    pub routes: Vec<Route>,
    /// Fraction of the n k routed slots that chose each expert (before dropping).
    pub fraction: Vec<f64>,
    /// Assignments dropped by the capacity.
    pub dropped: usize,
}

/// Shapes shared by the query and key sides of a block attention: `b` sequences, `hq` query
/// heads and `hk` K/V heads of `d` features (GQA: query head h reads K/V head h / (hq / hk)).
#[derive(Debug, Clone, Copy)]
pub struct BlockShape {
    pub b: usize,
    pub hq: usize,
    pub hk: usize,
    /// Query/key head width.
    pub d: usize,
    /// Value (and output) head width: `d` except under MLA (DeepSeek-V2).
    pub dv: usize,
    /// Dropout of the attention probabilities (`None`: none), its mask regenerated in backward.
    pub dropout: Option<crate::rng::AttnDropout>,
}

/// One side of a block attention: rows of `b` sequences, [b, pos.len(), heads, d] row-major,
/// row i of a sequence at position `pos[i]`, processed in runs of at most `tile` rows.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    pub pos: &'a [u32],
    pub tile: usize,
}

/// The geometry of a Ulysses all-to-all: `b` sequences of `cp` shards of `s_loc` rows.
#[derive(Debug, Clone, Copy)]
pub struct UlyssesGeo {
    pub b: usize,
    pub s_loc: usize,
    pub cp: usize,
}

/// One tensor of a Ulysses all-to-all: its heads on the sequence side and features per head.
#[derive(Debug, Clone, Copy)]
pub struct UlyssesPart {
    pub heads: usize,
    pub e: usize,
}

/// Which side of a Ulysses exchange a tensor is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UlyssesLayout {
    /// Sequence shards [b, s_loc, H, e]; chunk j of the buffer holds head group j.
    Seq,
    /// Head shards of the whole sequence [b, s, H / cp, e]; chunk j holds rank j's rows.
    Head,
}

/// What the attention forward saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The softmax (no flash attention).
    Probs,
    /// The per-row log-sum-exp (flash attention).
    Lse,
    /// Nothing (selective recompute).
    Nothing,
}

/// What the attention forward kept for backward.
#[derive(Debug)]
pub enum AttnSaved<T> {
    /// The softmax, [b, heads, s, s].
    Probs(T),
    /// The log-sum-exp of each query row, [b, heads, s].
    Lse(T),
    /// Nothing (selective recompute).
    None,
}

/// The tensor ops of a training step on device tensors, each with its backward; every op is
/// fallible (a device kernel can fail to launch). Row-major; `n` rows of `i` inputs and `o`
/// outputs for linear layers (weights [o, i]). Accumulation is fp32 whatever the tensors'
/// dtype.
pub trait TensorOps<B: Backend> {
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
    /// out = a + b.
    fn add(&self, a: &B::Tensor, b: &B::Tensor, out: &mut B::Tensor) -> Result<(), ExecError>;
    /// y[n, o] += b[o] on every row: a linear layer's bias (`b` holds o elements).
    fn bias_add(&self, y: &mut B::Tensor, b: View<'_, B::Tensor>) -> Result<(), ExecError>;
    /// db[o] += the column sums of dy[n, o]: a bias's gradient over this rank's rows.
    fn bias_grad(&self, dy: &B::Tensor, db: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;
    /// y += alpha * x.
    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, B::Tensor>,
        y: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError>;
    /// dst = src (converting the dtype: fp32 to bf16 rounds to nearest even).
    fn copy(&self, src: View<'_, B::Tensor>, dst: ViewMut<'_, B::Tensor>) -> Result<(), ExecError>;
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
    /// MoE router: softmax of `logits` [n, E] in place (they become the probabilities), then
    /// top-k with the capacity's drops; returns the routing and the load-balancing loss.
    fn moe_route(
        &self,
        logits: &mut B::Tensor,
        moe: &MoeShape,
    ) -> Result<(Routing, f64), ExecError>;
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
    /// Backward of the router in place: `d` [n, E] (probabilities' gradient, plus
    /// `aux_scale` f_i of the load-balancing loss) becomes the logits' gradient.
    fn moe_router_bwd(
        &self,
        d: &mut B::Tensor,
        probs: &B::Tensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError>;
    /// Every element of `t` set to `value`.
    fn fill(&self, t: &mut B::Tensor, value: f32) -> Result<(), ExecError>;
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

    // --- added for issue 19 ---
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

    // --- added for issue 19 (MLA/MTP) ---
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
}

/// Reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Collectives with NCCL's semantics within a group, plus point-to-point messages, and the
/// flat-range variants that ZeRO uses on the parameter and gradient buffers (Megatron's
/// distributed optimizer shards one flat buffer into contiguous ranges).
pub trait Collectives {
    type Group;
    /// In place; every member ends with the same reduction.
    fn all_reduce(&self, g: &Self::Group, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError>;
    /// `out` = concatenation of every member's `input` in member order.
    fn all_gather(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// `out` = this member's slice of the element-wise sum of every member's `input`.
    fn reduce_scatter(
        &self,
        g: &Self::Group,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Member i's j-th slice goes to member j's i-th slice.
    fn all_to_all(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// Variable-size all-to-all (as NCCL users build it from grouped send/recv, with the counts
    /// exchanged first): member i's `input` is `send_counts[j]` elements for each member j in
    /// member order; `out` receives, in member order, what each member j sent to i, and
    /// `recv_counts[j]` must equal member j's `send_counts[i]` (exchange the counts with
    /// [`Collectives::all_to_all`] beforehand).
    fn all_to_all_v(
        &self,
        g: &Self::Group,
        input: &[f32],
        send_counts: &[usize],
        out: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), ExecError>;
    /// Member `root`'s buffer to every member.
    fn broadcast(&self, g: &Self::Group, buf: &mut [f32], root: usize) -> Result<(), ExecError>;
    /// Buffered: returns at once.
    fn send(&self, to: u32, tag: u64, data: &[f32]) -> Result<(), ExecError>;
    /// Blocks until the message (from, tag) arrives.
    fn recv(&self, from: u32, tag: u64, out: &mut [f32]) -> Result<(), ExecError>;
    /// All-gather of a flat buffer held in contiguous shards (`mine` starts at `mine_lo`):
    /// `out` receives the elements `want` of the whole buffer.
    fn gather_range(
        &self,
        g: &Self::Group,
        mine_lo: usize,
        mine: &[f32],
        want: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Reduce-scatter of a flat range (every member passes the same `input_lo` and length):
    /// the sum over members of the part of `input` inside `mine` is *added* to `out`.
    fn reduce_scatter_range(
        &self,
        g: &Self::Group,
        input_lo: usize,
        input: &[f32],
        mine: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
}
