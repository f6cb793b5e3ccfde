//! Headline figures of an `estimate --json` case derived by hand from its resolved
//! configuration (the `config` object the output echoes), independently of the engine's op
//! ledger: the parameter count from the architecture, the model FLOPs per token (6 x the
//! matmul parameters a token passes through, Kaplan et al. 2020 and Narayanan et al. 2021,
//! plus the attention scores), and the model-state bytes per GPU (weights, gradients and
//! optimizer) from the precision's bytes per parameter under the ZeRO stage.

use serde_json::Value;

/// What [`headline`] derives for one case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headline {
    /// Every parameter (`params.total`).
    pub params: u64,
    /// Model FLOPs of one token's forward and backward (`flops.per_token_model`).
    pub flops_per_token: f64,
    /// Weights + gradients + optimizer of the most loaded GPU, where the hand count covers
    /// the case (dense, no LoRA); `None` elsewhere.
    pub model_state_bytes: Option<u64>,
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer: {v}"))
}

fn flag(v: &Value, key: &str) -> bool {
    v[key].as_bool().unwrap_or(false)
}

/// One transformer layer's parameters, split the way the counts need them.
#[derive(Debug, Default, Clone, Copy)]
struct Layer {
    /// Weights of matmuls every token passes through (attention projections, dense MLP,
    /// active experts, shared experts, router).
    matmul_active: u64,
    /// Weights of the experts a token does not pass through.
    matmul_idle: u64,
    /// Biases of column-parallel layers (sharded by TP) and the router bias.
    bias_sharded: u64,
    /// Biases of row-parallel layers and norms (whole on every TP rank).
    replicated: u64,
}

impl Layer {
    fn total(self) -> u64 {
        self.matmul_active + self.matmul_idle + self.bias_sharded + self.replicated
    }
    /// One TP rank's share.
    fn per_rank(self, tp: u64) -> u64 {
        (self.matmul_active + self.matmul_idle + self.bias_sharded) / tp + self.replicated
    }
}

/// The architecture read from the resolved `model` object.
struct Arch<'a> {
    m: &'a Value,
    h: u64,
    heads: u64,
    /// RMSNorm carries a weight, LayerNorm a weight and a bias.
    norm: u64,
}

impl Arch<'_> {
    fn head_dim(&self) -> u64 {
        self.m["kv_channels"]
            .as_u64()
            .unwrap_or(self.h / self.heads)
    }

    /// (query-key, value) widths of one head.
    fn head_widths(&self) -> (u64, u64) {
        match self.m["mla"].as_object() {
            Some(mla) => (
                mla["qk_nope_head_dim"].as_u64().unwrap()
                    + mla["qk_rope_head_dim"].as_u64().unwrap(),
                mla["v_head_dim"].as_u64().unwrap(),
            ),
            None => (self.head_dim(), self.head_dim()),
        }
    }

    /// Attention's weights, column-parallel biases and replicated parameters (norms inside
    /// MLA's low-rank paths, the output projection's bias).
    fn attention(&self) -> Layer {
        let (h, n) = (self.h, self.heads);
        if let Some(mla) = self.m["mla"].as_object() {
            // DeepSeek-V2/V3: query and key-value low-rank paths (DeepSeek-V2 report, eq. 9-14).
            let g = |k: &str| mla[k].as_u64().unwrap();
            let (q_rank, kv_rank) = (g("q_lora_rank"), g("kv_lora_rank"));
            let (nope, rope, v) = (
                g("qk_nope_head_dim"),
                g("qk_rope_head_dim"),
                g("v_head_dim"),
            );
            let query = if q_rank > 0 {
                h * q_rank + q_rank * n * (nope + rope)
            } else {
                h * n * (nope + rope)
            };
            let q_norm = if q_rank > 0 { q_rank } else { 0 };
            return Layer {
                matmul_active: query + h * (kv_rank + rope) + kv_rank * n * (nope + v) + n * v * h,
                replicated: q_norm + kv_rank,
                ..Layer::default()
            };
        }
        let d = self.head_dim();
        let qkv_out = (n + 2 * u(self.m, "num_query_groups")) * d;
        Layer {
            matmul_active: h * qkv_out + n * d * h,
            bias_sharded: if flag(self.m, "add_qkv_bias") {
                qkv_out
            } else {
                0
            },
            replicated: if flag(self.m, "add_bias_linear") {
                h
            } else {
                0
            },
            ..Layer::default()
        }
    }

    /// One MLP of width `f`: (weights, column-parallel bias, row-parallel bias).
    fn mlp(&self, f: u64) -> (u64, u64, u64) {
        let swiglu = self.m["activation"] == "swiglu";
        let up = if swiglu { 2 * f } else { f };
        let bias = flag(self.m, "add_bias_linear");
        (
            self.h * up + f * self.h,
            if bias { up } else { 0 },
            if bias { self.h } else { 0 },
        )
    }

    /// Layer `i` of the main stack (MoE from `moe_first_k_dense` on, when there are experts).
    fn layer(&self, i: u64) -> Layer {
        let mut l = self.attention();
        l.replicated += 2 * self.norm;
        let experts = u(self.m, "num_experts");
        if experts == 0 || i < u(self.m, "moe_first_k_dense") {
            let (w, col, row) = self.mlp(u(self.m, "ffn_hidden_size"));
            l.matmul_active += w;
            l.bias_sharded += col;
            l.replicated += row;
        } else {
            let (expert, _, _) = self.mlp(u(self.m, "moe_ffn_hidden_size"));
            let top_k = u(self.m, "moe_router_topk");
            let shared = u(self.m, "moe_shared_expert_intermediate_size");
            let (shared_w, _, _) = if shared > 0 {
                self.mlp(shared)
            } else {
                (0, 0, 0)
            };
            l.matmul_active += top_k * expert + shared_w + self.h * experts;
            l.matmul_idle += (experts - top_k) * expert;
            l.bias_sharded += if flag(self.m, "moe_router_bias") {
                experts
            } else {
                0
            };
        }
        l
    }
}

/// LoRA adapters of one layer: (A, B) of each target, rank r (Hu et al. 2021): an adapter of
/// a [in x out] weight holds r (in + out) parameters.
fn lora_per_layer(a: &Arch<'_>, lora: &Value) -> u64 {
    let r = u(lora, "rank");
    let d = a.head_dim();
    let qkv_out = (a.heads + 2 * u(a.m, "num_query_groups")) * d;
    lora["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match t.as_str().unwrap() {
            "qkv" => r * (a.h + qkv_out),
            "proj" => r * (a.heads * d + a.h),
            other => panic!("no hand count for LoRA target {other}"),
        })
        .sum()
}

/// The case's headline figures from its resolved configuration.
pub fn headline(config: &Value) -> Headline {
    let m = &config["model"];
    let t = &config["training"];
    let a = Arch {
        m,
        h: u(m, "hidden_size"),
        heads: u(m, "num_attention_heads"),
        norm: if m["normalization"] == "layernorm" {
            2 * u(m, "hidden_size")
        } else {
            u(m, "hidden_size")
        },
    };
    let (h, vocab, layers) = (a.h, u(m, "vocab_size"), u(m, "num_layers"));
    let embedding = vocab * h;
    let positions = if m["position_embedding"] == "learned" {
        u(m, "max_position_embeddings") * h
    } else {
        0
    };
    let stack: Vec<Layer> = (0..layers).map(|i| a.layer(i)).collect();
    // A multi-token-prediction module (DeepSeek-V3 report, section 2.2): two input norms, a
    // [2h x h] projection, one more (MoE) layer and its output norm; embedding and output head
    // shared with the main model.
    let mtp_layers = u(m, "mtp_num_layers");
    let mtp = a.layer(layers);
    let mtp_params = mtp_layers * (3 * a.norm + 2 * h * h + mtp.total());
    let untied_output = if flag(m, "tied_embeddings") {
        0
    } else {
        embedding
    };
    let lora = (t["mode"] == "lora").then(|| layers * lora_per_layer(&a, &t["lora"]));
    let params = embedding
        + positions
        + untied_output
        + stack.iter().map(|l| l.total()).sum::<u64>()
        + a.norm
        + mtp_params
        + lora.unwrap_or(0);

    // FLOPs per token: 2 per weight a token passes through forward, 4 more backward (input
    // and weight gradients); a frozen weight (LoRA) has no weight gradient. The output layer is
    // a matmul whether or not its weight is the embedding's. Attention scores: QK^T and PV,
    // 2 s n (d_qk + d_v) forward per token and layer over the whole sequence, half of it under
    // a causal mask counted as causal.
    let seq = u(t, "seq_length");
    let (d_qk, d_v) = a.head_widths();
    let full = t["flops_attention"] == "full";
    let scores_fwd = 2 * seq * a.heads * (d_qk + d_v) / if full { 1 } else { 2 };
    let scores = 3.0 * (scores_fwd * (layers + mtp_layers)) as f64;
    let active = stack.iter().map(|l| l.matmul_active).sum::<u64>()
        + embedding
        + mtp_layers * (2 * h * h + mtp.matmul_active + embedding);
    let matmul = match lora {
        Some(adapters) => 4.0 * active as f64 + 6.0 * adapters as f64,
        None => 6.0 * active as f64,
    };
    let model_state_bytes = (u(m, "num_experts") == 0 && lora.is_none() && mtp_layers == 0)
        .then(|| model_state(config, &stack, embedding, positions, a.norm));
    Headline {
        params,
        flops_per_token: matmul + scores,
        model_state_bytes,
    }
}

/// Weights + gradients + optimizer of the most loaded GPU of a dense model. Bytes per
/// parameter (Megatron-LM's distributed-optimizer guide, docs/source/api-guide/
/// dist_optimizer.md: bf16 parameters with fp32 gradients take 6 + 12/d, fp32 ones 8 + 8/d):
/// weights 2 (4 in fp32), gradients in `grad_dtype`, optimizer 12 (fp32 master copy, Adam's m
/// and v) or 8 in fp32; ZeRO 1 shards the optimizer over the DP x CP group, 2 the gradients
/// too, 3 the weights too (Rajbhandari et al. 2020). A GPU holds its pipeline rank's chunks
/// (interleaved: chunk c on rank c mod pp; V-shaped schedules: rank c, then 2 pp - 1 - c),
/// each layer's TP share, the embedding's shard (and learned positions) with the first chunk,
/// the output layer's (the embedding's copy when tied and pipelined) and final norm with the
/// last.
fn model_state(
    config: &Value,
    stack: &[Layer],
    embedding: u64,
    positions: u64,
    final_norm: u64,
) -> u64 {
    let (p, t, m) = (&config["parallel"], &config["training"], &config["model"]);
    let (tp, pp, vpp) = (u(p, "tp"), u(p, "pp"), u(p, "vpp"));
    let chunks = pp * vpp;
    let layers = stack.len() as u64;
    // Layers per chunk: the first and last stages may be set apart (vpp 1 only).
    let first = p["first_stage_layers"].as_u64();
    let last = p["last_stage_layers"].as_u64();
    let sizes: Vec<u64> = match (first, last) {
        (Some(f), Some(l)) => {
            assert_eq!(vpp, 1, "uneven stages with virtual stages: no hand count");
            let middle = (layers - f - l) / (pp - 2).max(1);
            (0..pp)
                .map(|r| match r {
                    0 => f,
                    r if r == pp - 1 => l,
                    _ => middle,
                })
                .collect()
        }
        _ => vec![layers / chunks; chunks as usize],
    };
    assert_eq!(sizes.iter().sum::<u64>(), layers, "layers split unevenly");
    let v_shape = matches!(p["schedule"].as_str(), Some("zb-v" | "dualpipe-v"));
    let rank_of = |c: u64| {
        if v_shape {
            if c < pp {
                c
            } else {
                2 * pp - 1 - c
            }
        } else {
            c % pp
        }
    };
    let tied = flag(m, "tied_embeddings");
    // The vocabulary is split over TP ranks after padding to a multiple of
    // make_vocab_size_divisible_by x tp (Megatron-LM's `_vocab_size_with_padding`), so a
    // rank's embedding shard is the padded vocabulary over tp.
    let multiple = u(m, "make_vocab_size_divisible_by").max(1) * tp;
    let padded_vocab = u(m, "vocab_size").div_ceil(multiple) * multiple;
    let embedding_shard = embedding / u(m, "vocab_size") * padded_vocab / tp;
    let mut per_rank = vec![0u64; pp as usize];
    let mut next = 0usize;
    for c in 0..chunks {
        let r = rank_of(c) as usize;
        for l in &stack[next..next + sizes[c as usize] as usize] {
            per_rank[r] += l.per_rank(tp);
        }
        next += sizes[c as usize] as usize;
        if c == 0 {
            per_rank[r] += embedding_shard + positions;
        }
        if c == chunks - 1 {
            let output = if !tied || pp > 1 { embedding_shard } else { 0 };
            per_rank[r] += output + final_norm;
        }
    }
    let shard = u(p, "dp") * u(p, "cp");
    let zero = u(p, "zero");
    let fp32 = t["precision"] == "fp32";
    let weight_bytes = if fp32 { 4 } else { 2 };
    let grad_bytes = if fp32 || t["grad_dtype"] == "fp32" {
        4
    } else {
        2
    };
    let optimizer_bytes = if fp32 { 8 } else { 12 };
    let over = |stage: u64| if zero >= stage { shard } else { 1 };
    per_rank
        .iter()
        .map(|&n| {
            weight_bytes * n / over(3) + grad_bytes * n / over(2) + optimizer_bytes * n / over(1)
        })
        .max()
        .unwrap()
}
