//! The host-side arguments and results of the tensor ops: attention and block-attention
//! shapes, the Ulysses geometry, what the attention forward keeps, and MoE routes.

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
    /// The keys each query sees besides the causal mask (sliding window, chunk).
    pub span: parsim_plan::plan::AttnSpan,
}

impl AttnShape {
    /// The block shape of this whole-sequence attention.
    pub fn block(&self) -> BlockShape {
        BlockShape {
            b: self.b,
            hq: self.heads,
            hk: self.kv_heads,
            d: self.d,
            dv: self.dv,
            dropout: self.dropout,
            span: self.span,
        }
    }
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
    /// The keys each query sees besides the causal mask (sliding window, chunk).
    pub span: parsim_plan::plan::AttnSpan,
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

impl UlyssesGeo {
    /// Elements of part `p` in one chunk of the all-to-all buffer: its `b s_loc` rows of
    /// `heads / cp` heads of `e` features.
    pub fn part_len(&self, p: &UlyssesPart) -> usize {
        self.b * self.s_loc * p.heads / self.cp * p.e
    }

    /// Where each part starts inside a chunk (parts one after another, in order), and the
    /// chunk's length; chunk j starts at j times that length. The layout both backends pack.
    pub fn part_offsets(&self, parts: &[UlyssesPart]) -> (Vec<usize>, usize) {
        let mut offs = Vec::with_capacity(parts.len());
        let mut off = 0;
        for p in parts {
            offs.push(off);
            off += self.part_len(p);
        }
        (offs, off)
    }
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

/// One rank's Mamba-2 mixer on one microbatch: `b` sequences of `s` tokens (rows sequence by
/// sequence), this rank's `heads` heads of `p` channels and `groups` B/C groups of state `n`
/// (heads split evenly over the groups), the causal convolution's width `k`, the SSD's chunk
/// `q` and the gated norm's epsilon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MambaGeo {
    pub b: usize,
    pub s: usize,
    pub heads: usize,
    pub p: usize,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub q: usize,
    pub eps: f32,
}

impl MambaGeo {
    /// The inner width: heads x p.
    pub fn inner(&self) -> usize {
        self.heads * self.p
    }

    /// The convolution's channels: x, B and C.
    pub fn conv(&self) -> usize {
        self.inner() + 2 * self.groups * self.n
    }

    /// in_proj's outputs: z, x, B, C and dt.
    pub fn proj(&self) -> usize {
        2 * self.inner() + 2 * self.groups * self.n + self.heads
    }

    /// Tokens: b x s.
    pub fn tokens(&self) -> usize {
        self.b * self.s
    }

    /// Elements of the chunk states (fp32), every sequence, chunk and head: P x N each.
    pub fn states_len(&self) -> usize {
        self.b * self.s.div_ceil(self.q.max(1)) * self.heads * self.p * self.n
    }
}
