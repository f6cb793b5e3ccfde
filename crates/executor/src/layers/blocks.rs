//! A rank's parameters as one flat buffer carved into blocks (embedding, decoder layers, the
//! output block), each block into tensors, each tensor into segments of global tensors. The
//! table is computed once from the Plan (as llm.c's `fill_in_parameter_sizes`), so ZeRO can
//! shard the flat buffer into contiguous ranges (Megatron's distributed optimizer) and every
//! element knows its global tensor and index, which makes initialisation independent of the
//! parallel mix.
//!
//! Mixture-of-experts layers put their routed experts in a block of their own
//! ([`BlockKind::Experts`]) in a second flat buffer ([`EXPERT_SPACE`]), as Megatron keeps expert
//! parameters in their own buffers: dense parameters reduce (and ZeRO-shard) over DP, expert
//! parameters over the expert-data-parallel group.

use parsim_plan::plan::{Activation, Norm, Plan, RankPlan};
use std::ops::Range;

/// Which block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Embedding,
    Layer(u32),
    /// Final norm, output layer (and the cross-entropy, which has no parameters).
    Output,
    /// The routed experts of MoE layer l held by this rank (fc1 and fc2 of each).
    Experts(u32),
    /// LoRA: the trainable adapters of layer l (its own block is frozen).
    Adapters(u32),
    /// LoRA with adapters on the routed experts: MoE layer l's frozen routed experts (laid out
    /// as [`BlockKind::Experts`] without LoRA), after its experts block (their adapters).
    FrozenExperts(u32),
    /// Multi-token-prediction module k's input (DeepSeek-V3 sec. 2.2): the norms of the shifted
    /// tokens' embedding and of the previous depth's hidden states, and the 2h -> h projection.
    /// Its transformer layer is `Layer(num_layers + k)`; the module ends with `MtpOut(k)`.
    MtpIn(u32),
    /// Multi-token-prediction module k's final norm (the output head is the main model's).
    MtpOut(u32),
    /// The last stage's copy of the word (and position) embedding for its MTP modules, when
    /// its rank does not hold the first stage (Megatron-Core builds the embedding where
    /// `mtp_process`); kept equal to the first stage's by the embedding group.
    MtpEmbedding,
}

/// The flat buffer of dense parameters.
pub const DENSE_SPACE: usize = 0;
/// The flat buffer of expert parameters.
pub const EXPERT_SPACE: usize = 1;
/// LoRA: the flat buffer of the frozen base weights (parameters only: no gradients, no
/// optimizer states); the adapters then make up the dense space.
pub const FROZEN_SPACE: usize = 2;
/// LoRA: the flat buffer of the frozen routed experts, which (as trained experts) only the
/// expert-data-parallel group holds alike: ZeRO-3 shards it over that group.
pub const FROZEN_EXPERT_SPACE: usize = 3;
/// Number of flat buffers.
pub const SPACES: usize = 4;

/// The router's tensor in an MoE layer's block (after attn_norm, QKV, wo, mlp_norm).
pub const ROUTER: usize = 4;

/// Whether space `sp` holds frozen (LoRA base) weights: parameters only.
pub fn is_frozen_space(sp: usize) -> bool {
    sp == FROZEN_SPACE || sp == FROZEN_EXPERT_SPACE
}

/// A rectangle of a global tensor that a local tensor holds (stacked by rows).
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub name: String,
    pub global_cols: usize,
    pub rows: Range<usize>,
    pub cols: Range<usize>,
    pub init: Init,
}

/// How a global tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Uniform with this standard deviation, mean 0.
    Uniform(f32),
    /// 1 + uniform(std): norm gains.
    One(f32),
}

/// A local tensor: `rows` x `cols` at `offset` from the start of its block.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalTensor {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub segments: Vec<Segment>,
    /// TP-replicated (norms): gradients are summed over TP when sequence parallelism splits
    /// the tokens.
    pub tp_replicated: bool,
}

impl LocalTensor {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }

    /// Global tensor name and flat index of local element `i`.
    pub fn global_of(&self, i: usize) -> (&Segment, usize) {
        let (r, c) = (i / self.cols, i % self.cols);
        let mut row0 = 0;
        for s in &self.segments {
            let n = s.rows.len();
            if r < row0 + n {
                let gr = s.rows.start + (r - row0);
                let gc = s.cols.start + c;
                return (s, gr * s.global_cols + gc);
            }
            row0 += n;
        }
        unreachable!("segments cover the tensor")
    }
}

/// One block's tensors and where the block lies in the flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockLayout {
    pub kind: BlockKind,
    /// Global stage the block belongs to.
    pub stage: u32,
    /// The flat buffer it lies in: [`DENSE_SPACE`] or [`EXPERT_SPACE`].
    pub space: usize,
    /// Its range in that buffer.
    pub range: Range<usize>,
    pub tensors: Vec<LocalTensor>,
}

/// Per-rank sizes of the sharded dimensions.
#[derive(Debug, Clone, Copy)]
pub struct RankDims {
    pub h: usize,
    /// Query/key head width (MLA: no-rotary + rotary parts).
    pub d: usize,
    /// Value head width: `d` except under MLA.
    pub dv: usize,
    /// Query and K/V heads on this rank.
    pub a_r: usize,
    pub g_r: usize,
    pub f_r: usize,
    /// fc1 width on this rank: 2 f_r for SwiGLU, f_r for GeLU.
    pub fc1_r: usize,
    pub v_r: usize,
    pub t: usize,
    pub tp_rank: usize,
    /// Expert tensor parallelism: the routed experts' split (MoE Parallel Folding: any etp with
    /// etp x ep dividing tp x cp x dp) and this rank's index in its expert-TP group.
    pub et: usize,
    pub et_rank: usize,
}

impl RankDims {
    /// The dimensions of rank `rp` of `plan`.
    pub fn new(plan: &Plan, rp: &RankPlan) -> RankDims {
        let tp_rank = rp.coords.tp;
        let m = &plan.model;
        let t = plan.parallel.tp as usize;
        let f_r = m.ffn / t;
        // MLA: every query head has its own key and value head.
        let (d, dv, kv_heads) = match &m.mla {
            Some(a) => (a.qk(), a.v, m.heads),
            None => (m.head_dim, m.head_dim, m.kv_heads),
        };
        RankDims {
            h: m.hidden,
            d,
            dv,
            a_r: m.heads / t,
            g_r: kv_heads / t,
            f_r,
            fc1_r: match m.activation {
                Activation::Swiglu => 2 * f_r,
                Activation::Gelu => f_r,
            },
            v_r: m.vocab / t,
            t,
            tp_rank: tp_rank as usize,
            et: plan.parallel.etp.max(1) as usize,
            et_rank: rp.et_rank() as usize,
        }
    }

    pub fn qkv_r(&self) -> usize {
        (self.a_r + 2 * self.g_r) * self.d
    }
}

/// Lays out one block's tensors back to back (the one home of the layout, which every
/// layer file fills through it).
pub(super) struct Builder {
    tensors: Vec<LocalTensor>,
    next: usize,
}

impl Builder {
    /// An empty block.
    pub(super) fn new() -> Builder {
        Builder {
            tensors: Vec::new(),
            next: 0,
        }
    }

    /// The block's tensors and its length in elements.
    pub(super) fn finish(self) -> (Vec<LocalTensor>, usize) {
        (self.tensors, self.next)
    }

    pub(super) fn push(
        &mut self,
        rows: usize,
        cols: usize,
        segments: Vec<Segment>,
        tp_replicated: bool,
    ) {
        self.tensors.push(LocalTensor {
            offset: self.next,
            rows,
            cols,
            segments,
            tp_replicated,
        });
        self.next += rows * cols;
    }

    pub(super) fn norm(&mut self, name: &str, kind: Norm, h: usize) {
        self.norm_of(name, kind, h, true);
    }

    /// A norm over `h` features; `tp_replicated`: its gradient is a partial sum over TP under
    /// SP (a norm of the sequence-sharded residual stream).
    pub(super) fn norm_of(&mut self, name: &str, kind: Norm, h: usize, tp_replicated: bool) {
        let mut segs = vec![Segment {
            name: format!("{name}.weight"),
            global_cols: h,
            rows: 0..1,
            cols: 0..h,
            init: Init::One(0.1),
        }];
        if kind == Norm::LayerNorm {
            segs.push(Segment {
                name: format!("{name}.bias"),
                global_cols: h,
                rows: 0..1,
                cols: 0..h,
                init: Init::Uniform(0.1),
            });
        }
        let rows = segs.len();
        self.push(rows, h, segs, tp_replicated);
    }
}

/// This rank's rows of an fc1 tensor `name` [w1, cols] of intermediate size `f` split over
/// `(t, r)` (size, rank): its slice, and under SwiGLU the gate rows then the up rows of it.
/// Returns the rank's row count and segments (the weight's with `cols` = h, its bias's with 1).
pub(super) fn fc1_rows(
    act: Activation,
    name: String,
    cols: usize,
    f: usize,
    (t, r): (usize, usize),
    std: f32,
) -> (usize, Vec<Segment>) {
    let fr = f / t;
    let own = r * fr..(r + 1) * fr;
    match act {
        Activation::Swiglu => (
            2 * fr,
            vec![
                seg(name.clone(), cols, own.clone(), 0..cols, std),
                seg(name, cols, f + own.start..f + own.end, 0..cols, std),
            ],
        ),
        Activation::Gelu => (fr, vec![seg(name, cols, own, 0..cols, std)]),
    }
}

pub(super) fn seg(
    name: String,
    global_cols: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    std: f32,
) -> Segment {
    Segment {
        name,
        global_cols,
        rows,
        cols,
        init: Init::Uniform(std),
    }
}

/// Total elements of a layout's space `space`.
pub fn layout_len(blocks: &[BlockLayout], space: usize) -> usize {
    blocks
        .iter()
        .filter(|b| b.space == space)
        .map(|b| b.range.end)
        .max()
        .unwrap_or(0)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_hash(s: &str) -> u64 {
    // FNV-1a, stable across platforms and runs.
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A deterministic uniform in [-1, 1) from (seed, stream, index).
pub fn uniform(seed: u64, stream: u64, index: u64) -> f32 {
    let x = splitmix64(seed ^ splitmix64(stream ^ splitmix64(index)));
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// The initial value of element `index` of global tensor `seg`.
pub fn init_value(seed: u64, seg: &Segment, index: usize) -> f32 {
    let u = uniform(seed, name_hash(&seg.name), index as u64);
    let sqrt3 = 3.0f32.sqrt();
    match seg.init {
        Init::Uniform(std) => std * sqrt3 * u,
        Init::One(std) => 1.0 + std * sqrt3 * u,
    }
}

/// Fills `out` with elements `range` of the rank's flat buffer of space `space`.
pub fn init_range(
    seed: u64,
    blocks: &[BlockLayout],
    space: usize,
    range: Range<usize>,
    out: &mut [f32],
) {
    for b in blocks.iter().filter(|b| b.space == space) {
        if b.range.end <= range.start || b.range.start >= range.end {
            continue;
        }
        for t in &b.tensors {
            let lo = b.range.start + t.offset;
            for i in 0..t.len() {
                let flat = lo + i;
                if range.contains(&flat) {
                    let (s, gi) = t.global_of(i);
                    out[flat - range.start] = init_value(seed, s, gi);
                }
            }
        }
    }
}
