//! The shapes one rank works on for one microbatch, derived once from a resolved configuration.
//! Letters as in Korthikanti et al. 2022: s sequence, b micro batch, h hidden, a heads,
//! t tensor-parallel degree; plus c (context parallel), g (KV heads), d (head dim), V (vocab).

use super::low_precision::Recipe;
use crate::config::{CpComm, FlopsAttention, Resolved, TokenDispatcher, TrainingMode};
use serde::Serialize;

/// Per-rank shapes and byte sizes of one microbatch.
#[derive(Debug, Clone, Serialize)]
pub struct Dims {
    pub s: u64,
    pub b: u64,
    pub h: u64,
    pub a: u64,
    pub g: u64,
    pub d: u64,
    pub v: u64,
    pub t: u64,
    pub c: u64,
    pub sp: bool,
    /// Tokens of the whole microbatch: s x b.
    pub tokens: u64,
    /// Tokens on this CP rank: s x b / c.
    pub n: u64,
    /// Tokens in the sequence-parallel regions (norms, dropout, residual): n / t with SP, else n.
    pub n_sp: u64,
    /// Bytes of a saved activation element.
    pub act: u64,
    /// The low-precision recipe whose quantised copy of a linear layer's input Transformer
    /// Engine keeps for the weight gradient; `None` without a recipe and in the layers a recipe
    /// keeps in bf16, which save their inputs at the activation dtype.
    #[serde(skip)]
    pub quantized: Option<Recipe>,
    /// Under a recipe, Megatron-Core has the attention output projection save its original
    /// bf16 input (the fused attention's own saved output) in place of a quantised copy
    /// ([`Recipe::saves_original_projection_input`]).
    pub proj_input_original: bool,
    /// Bytes of a weight element.
    pub weight: u64,
    /// Bytes per trainable parameter of a block's gradient bucket: the gradient dtype's under
    /// ZeRO-2/3 (the block's gradients at full size before their reduce-scatter, as
    /// DeepSpeed's reduce bucket), 0 below, where gradients accumulate in place.
    pub grad_bucket: u64,
    /// Bytes per parameter ZeRO-3 gathers for a block's forward and backward (the weight
    /// dtype's), 0 below ZeRO-3, where every weight is resident.
    pub zero3_gather: u64,
    /// Fraction of the s x s scores counted in model FLOPs (0.5 causal, 1 full).
    pub attn_model_fraction: f64,
    /// Fraction of the s x s scores a rank really computes (flash skips masked blocks).
    pub attn_hw_fraction: f64,
    pub flash: bool,
    pub cp_comm: CpComm,
    pub attention_dropout: bool,
    pub hidden_dropout: bool,
    /// LoRA: base weights frozen.
    pub lora: bool,
    pub ep: u64,
    pub etp: u64,
    /// Score tiles the attention kernel materialises (the profile's `attention_score_tiles`).
    pub attention_score_tiles: u64,
    /// Bytes of one routing probability as the experts receive it: 4 under the flex
    /// dispatcher (DeepEP and HybridEP take fp32 probabilities and cast them: Megatron-Core's
    /// token_dispatcher.py, `_DeepepManager` and `_HybridEPManager`), else the router's output
    /// dtype, the activations' (router.py's `gating` computes in the input dtype).
    pub probs: u64,
}

impl Dims {
    pub fn new(r: &Resolved) -> Dims {
        let m = &r.config.model;
        let p = &r.config.parallel;
        let tr = &r.config.training;
        let t = p.tp as u64;
        let c = p.cp as u64;
        let tokens = tr.seq_length * tr.micro_batch_size;
        let n = tokens / c;
        let sp = p.sp_active();
        Dims {
            s: tr.seq_length,
            b: tr.micro_batch_size,
            h: m.hidden_size,
            a: m.num_attention_heads as u64,
            g: m.num_query_groups as u64,
            d: m.head_dim(),
            v: m.padded_vocab_size(p.tp),
            t,
            c,
            sp,
            tokens,
            n,
            n_sp: if sp { n / t } else { n },
            act: tr.activation_bytes(),
            quantized: Recipe::of(r),
            proj_input_original: Recipe::of(r)
                .is_some_and(|q| q.saves_original_projection_input(tr.fp8_recipe)),
            weight: tr.weight_bytes(),
            grad_bucket: if p.zero >= 2 {
                tr.grad_dtype.bytes()
            } else {
                0
            },
            zero3_gather: if p.zero >= 3 { tr.weight_bytes() } else { 0 },
            attn_model_fraction: match tr.flops_attention {
                FlopsAttention::Causal => 0.5,
                FlopsAttention::Full => 1.0,
            },
            attn_hw_fraction: if tr.flash_attention { 0.5 } else { 1.0 },
            flash: tr.flash_attention,
            cp_comm: p.cp_comm,
            attention_dropout: m.attention_dropout > 0.0,
            hidden_dropout: m.hidden_dropout > 0.0,
            lora: tr.mode == TrainingMode::Lora,
            ep: p.ep as u64,
            etp: p.etp() as u64,
            attention_score_tiles: r.gpu.attention_score_tiles as u64,
            probs: if p.moe_token_dispatcher == TokenDispatcher::Flex {
                4
            } else {
                tr.activation_bytes()
            },
        }
    }

    /// Rows of the vocabulary on the most loaded TP rank (ceil(V / t) when not padded).
    pub fn vocab_rank(&self) -> u64 {
        self.v.div_ceil(self.t)
    }

    /// Bytes a linear layer keeps of its input, `rows` tokens of `cols` features, for its
    /// weight gradient: the activation dtype's, or what the recipe's quantised copy takes
    /// ([`Recipe::saved_input_bytes`]; `norm_gather`: a layer-norm-fused layer whose backward
    /// re-gathers its sequence-parallel input).
    pub fn saved_input_bytes(&self, rows: u64, cols: u64, norm_gather: bool) -> u64 {
        match &self.quantized {
            Some(q) => q.saved_input_bytes(rows, cols, norm_gather),
            None => rows * cols * self.act,
        }
    }

    /// Bytes of the residual stream of this rank's tokens in the SP region: n_sp x h.
    pub fn residual_bytes(&self) -> u64 {
        self.n_sp * self.h * self.act
    }
}
