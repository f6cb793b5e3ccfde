//! Megatron-LM flags to configuration fields. Flags that map one to one go straight into the
//! layer; those that combine (model shape, parallel degrees, precision, recompute) are kept and
//! combined with Megatron's defaults in [`State::finish`].

use super::flag_table::{Kind, DIRECT, KEPT_INTS, KEPT_LISTS, KEPT_SWITCHES, KEPT_WORDS, REFUSED};
use super::put;
use super::values::{first_dense_layers, layer_list, tokenizer_vocab};
use serde_json::{json, Map, Value};

mod dispatch_flags;
mod training_flags;

/// Flags kept until [`State::finish`], by name.
#[derive(Debug, Default)]
pub(super) struct State {
    layer: Map<String, Value>,
    ints: std::collections::BTreeMap<&'static str, u64>,
    switches: std::collections::BTreeSet<&'static str>,
    words: std::collections::BTreeMap<&'static str, String>,
    lists: std::collections::BTreeMap<&'static str, Vec<String>>,
    ignored: Vec<String>,
    notes: Vec<String>,
    nproc_per_node: Option<u64>,
    nnodes: Option<u64>,
}

/// The finished layer with what did not carry over.
pub(super) struct Finished {
    pub layer: Value,
    pub ignored: Vec<String>,
    pub notes: Vec<String>,
}

fn int(flag: &str, values: &[String]) -> Result<u64, String> {
    let v = single(flag, values)?;
    v.parse()
        .map_err(|_| format!("expected a non-negative integer, got '{v}'"))
}

fn single<'a>(flag: &str, values: &'a [String]) -> Result<&'a str, String> {
    match values {
        [v] => Ok(v),
        [] => Err(format!("{flag} needs a value")),
        _ => Err(format!("expected one value, got {}", values.join(" "))),
    }
}

/// True when the import reads `flag` (spelled with dashes): it maps onto a field or is
/// combined with others; false for flags it ignores or refuses.
pub(super) fn reads(flag: &str) -> bool {
    DIRECT.iter().any(|d| d.0 == flag)
        || KEPT_INTS.contains(&flag)
        || KEPT_SWITCHES.contains(&flag)
        || KEPT_WORDS.contains(&flag)
        || KEPT_LISTS.contains(&flag)
}

impl State {
    /// Reads the GPU count from torchrun's (or torch.distributed.launch's) own flags.
    pub fn launcher(&mut self, words: &[String]) {
        let mut it = words.iter();
        while let Some(w) = it.next() {
            let (flag, inline) = match w.split_once('=') {
                Some((f, v)) => (f.replace('_', "-"), Some(v.to_string())),
                None => (w.replace('_', "-"), None),
            };
            let slot = match flag.as_str() {
                "--nproc-per-node" => &mut self.nproc_per_node,
                "--nnodes" => &mut self.nnodes,
                _ => continue,
            };
            let value = inline.or_else(|| it.next().cloned());
            // An elastic range `MIN:MAX` runs with MAX nodes at most; take the maximum.
            *slot = value.and_then(|v| v.rsplit(':').next().and_then(|n| n.parse().ok()));
        }
    }

    /// Takes one `--flag values...` of the training script.
    pub fn apply(&mut self, raw_flag: &str, values: &[String]) -> Result<(), String> {
        let flag = raw_flag.replace('_', "-");
        if let Some((_, why)) = REFUSED.iter().find(|r| r.0 == flag) {
            return Err(format!(
                "{why}; this flag changes the model or its parallel layout, so the run is not estimated"
            ));
        }
        let known = reads(&flag);
        if known && values.iter().any(|v| v.contains('$')) {
            self.notes.push(format!(
                "{raw_flag} {}: the value is not resolved, so the flag is ignored",
                values.join(" ")
            ));
            return Ok(());
        }
        if let Some((_, section, key, kind)) = DIRECT.iter().find(|d| d.0 == flag) {
            let value = match kind {
                Kind::Int => json!(int(&flag, values)?),
                Kind::Float => {
                    let v = single(&flag, values)?;
                    let f: f64 = v
                        .parse()
                        .ok()
                        .filter(|f: &f64| f.is_finite())
                        .ok_or_else(|| format!("expected a finite number, got '{v}'"))?;
                    json!(f)
                }
                Kind::On => json!(true),
            };
            put(&mut self.layer, section, key, value);
        } else if let Some(name) = KEPT_INTS.iter().find(|n| **n == flag) {
            self.ints.insert(name, int(&flag, values)?);
        } else if let Some(name) = KEPT_SWITCHES.iter().find(|n| **n == flag) {
            self.switches.insert(name);
        } else if let Some(name) = KEPT_WORDS.iter().find(|n| **n == flag) {
            self.words.insert(name, single(&flag, values)?.to_string());
        } else if let Some(name) = KEPT_LISTS.iter().find(|n| **n == flag) {
            if values.is_empty() {
                return Err(format!("{flag} needs at least one value"));
            }
            self.lists.insert(name, values.to_vec());
        } else if !self.ignored.contains(&raw_flag.to_string()) {
            self.ignored.push(raw_flag.to_string());
        }
        Ok(())
    }

    fn on(&self, flag: &str) -> bool {
        self.switches.contains(flag)
    }

    fn word(&self, flag: &str) -> Option<&str> {
        self.words.get(flag).map(String::as_str)
    }

    /// Combines the kept flags with Megatron's defaults into the layer.
    pub fn finish(mut self) -> Result<Finished, String> {
        self.model()?;
        self.parallel()?;
        self.training()?;
        self.run_length();
        self.cluster();
        Ok(Finished {
            layer: Value::Object(self.layer),
            ignored: self.ignored,
            notes: self.notes,
        })
    }

    fn set(&mut self, section: &str, key: &str, value: Value) {
        put(&mut self.layer, section, key, value);
    }

    fn has(&self, section: &str, key: &str) -> bool {
        self.layer.get(section).and_then(|s| s.get(key)).is_some()
    }

    /// The model's shape; Megatron's model defaults when the script gives the shape.
    fn model(&mut self) -> Result<(), String> {
        self.hybrid()?;
        let defines =
            self.ints.contains_key("--num-layers") || self.ints.contains_key("--hidden-size");
        for (flag, key) in [
            ("--num-layers", "num_layers"),
            ("--hidden-size", "hidden_size"),
            ("--num-attention-heads", "num_attention_heads"),
            ("--num-experts", "num_experts"),
        ] {
            if let Some(v) = self.ints.get(flag).copied() {
                self.set("model", key, json!(v));
            }
        }
        let hidden = self.ints.get("--hidden-size").copied();
        // GeGLU (--quick-geglu, GPT-OSS) is gated like SwiGLU, with its shapes.
        let swiglu = self.on("--swiglu") || self.on("--quick-geglu");
        if self.on("--quick-geglu") && !self.on("--swiglu") {
            self.notes.push(
                "--quick-geglu: a gated linear unit like SwiGLU, counted with SwiGLU's shapes"
                    .into(),
            );
        }
        if self.on("--squared-relu") && !swiglu {
            self.notes.push(
                "--squared-relu: not gated, counted with GeLU's shapes (one up projection)".into(),
            );
        }
        let ffn = match (self.ints.get("--ffn-hidden-size").copied(), hidden) {
            (Some(f), _) => Some(f),
            // Megatron: 4h, or 2/3 of it rounded down to a multiple of 64 with SwiGLU.
            (None, Some(h)) if defines && swiglu => Some(4 * h * 2 / 3 / 64 * 64),
            (None, Some(h)) if defines => Some(4 * h),
            _ => None,
        };
        if let Some(f) = ffn {
            self.set("model", "ffn_hidden_size", json!(f));
        }
        let gqa = self.on("--group-query-attention");
        let groups = match self.ints.get("--num-query-groups").copied() {
            Some(g) if gqa => Some(g),
            Some(g) => {
                self.notes.push(format!(
                    "--num-query-groups {g} without --group-query-attention: Megatron uses one group per head"
                ));
                defines
                    .then(|| self.ints.get("--num-attention-heads").copied())
                    .flatten()
            }
            None if defines => self.ints.get("--num-attention-heads").copied(),
            None => None,
        };
        if let Some(g) = groups {
            self.set("model", "num_query_groups", json!(g));
        }
        if swiglu || defines {
            self.set(
                "model",
                "activation",
                json!(if swiglu { "swiglu" } else { "gelu" }),
            );
        }
        self.model_words(defines)?;
        self.vocab(defines);
        if defines {
            self.model_defaults(ffn);
        }
        self.mla();
        Ok(())
    }

    /// A hybrid model's layer pattern and its Mamba-2 mixer, with Megatron's defaults (head
    /// dim 64, 8 groups, state 128, twice the hidden width inside); `--num-layers` is the
    /// pattern's length when not given.
    fn hybrid(&mut self) -> Result<(), String> {
        let pattern = self
            .word("--hybrid-layer-pattern")
            .or(self.word("--hybrid-override-pattern"))
            .map(str::to_string);
        let Some(pattern) = pattern else {
            if self.on("--is-hybrid-model") {
                return Err("--is-hybrid-model: no --hybrid-layer-pattern places its layers (the ratio flags are not modelled)".into());
            }
            return Ok(());
        };
        let pattern = pattern.trim_matches(|c| c == '"' || c == '\'').to_string();
        if let Some(c) = pattern
            .chars()
            .find(|c| !matches!(c, 'M' | '*' | '-' | 'E'))
        {
            return Err(format!(
                "--hybrid-layer-pattern: unknown layer '{c}' (M Mamba-2, * attention, - MLP, E MoE)"
            ));
        }
        let len = pattern.chars().count() as u64;
        match self.ints.get("--num-layers").copied() {
            Some(l) if l != len => {
                return Err(format!(
                    "--hybrid-layer-pattern: {len} layers, --num-layers is {l}"
                ))
            }
            Some(_) => {}
            None => {
                self.ints.insert("--num-layers", len);
            }
        }
        self.set("model", "hybrid_layer_pattern", json!(pattern));
        if pattern.contains('M') {
            let hidden = self
                .ints
                .get("--hidden-size")
                .copied()
                .ok_or("--hybrid-layer-pattern: Mamba-2 layers need --hidden-size")?;
            let head_dim = self.ints.get("--mamba-head-dim").copied().unwrap_or(64);
            let heads = match self.ints.get("--mamba-num-heads").copied() {
                Some(h) => h,
                None if head_dim > 0 => 2 * hidden / head_dim,
                None => return Err("--mamba-head-dim: must be at least 1, got 0".into()),
            };
            self.set(
                "model",
                "mamba",
                json!({
                    "num_heads": heads,
                    "head_dim": head_dim,
                    "state_dim": self.ints.get("--mamba-state-dim").copied().unwrap_or(128),
                    "num_groups": self.ints.get("--mamba-num-groups").copied().unwrap_or(8),
                }),
            );
        }
        Ok(())
    }

    /// Normalization, positions and the MoE layer pattern.
    fn model_words(&mut self, defines: bool) -> Result<(), String> {
        let norm = match self.word("--normalization") {
            Some("RMSNorm") => Some("rmsnorm"),
            Some("LayerNorm") => Some("layernorm"),
            Some(other) => {
                return Err(format!(
                    "--normalization: unknown '{other}' (RMSNorm, LayerNorm)"
                ))
            }
            None => defines.then_some("layernorm"),
        };
        if let Some(n) = norm {
            self.set("model", "normalization", json!(n));
        }
        // Megatron-LM's modelopt builder turns --enable-gpt-oss into YaRN rotary positions
        // (megatron/post_training/model_builder.py).
        let pos = match self.word("--position-embedding-type") {
            _ if self.on("--enable-gpt-oss") => Some("rope"),
            Some("rope") => Some("rope"),
            Some("learned_absolute") => Some("learned"),
            Some("none") => Some("none"),
            Some(other) => {
                return Err(format!(
                    "--position-embedding-type: unknown '{other}' (rope, learned_absolute, none)"
                ))
            }
            None => defines.then_some("learned"),
        };
        if let Some(p) = pos {
            self.set("model", "position_embedding", json!(p));
        }
        match self.word("--moe-router-score-function").map(str::to_string) {
            Some(f) if f == "softmax" || f == "sigmoid" => {
                // Megatron-Core renormalises sigmoid top-k scores (k > 1) always.
                if f == "sigmoid" {
                    self.set("model", "moe_router_renormalize", json!(true));
                }
                self.set("model", "moe_router_score_function", json!(f));
            }
            Some(other) => {
                return Err(format!(
                    "--moe-router-score-function: unknown '{other}' (softmax, sigmoid)"
                ))
            }
            None => {}
        }
        if let Some(freq) = self.word("--moe-layer-freq").map(str::to_string) {
            self.moe_layer_freq(&freq)?;
        }
        self.attention_flags()?;
        Ok(())
    }

    /// Megatron's `--moe-layer-freq`: an integer N (layer i MoE when i % N == 0) or a list
    /// expression (`([0]*3+[1]*58)`, `([0,1]*24)`), 1 for MoE.
    fn moe_layer_freq(&mut self, freq: &str) -> Result<(), String> {
        if let Some(k) = first_dense_layers(freq) {
            self.set("model", "moe_first_k_dense", json!(k));
            return Ok(());
        }
        let layers = self.ints.get("--num-layers").copied();
        let pattern = match (freq.trim().parse::<u64>(), layers) {
            (Ok(0), _) => return Err("--moe-layer-freq: must be at least 1, got 0".into()),
            (Ok(n), Some(l)) => (0..l).map(|i| u8::from(i % n == 0)).collect(),
            (Ok(_), None) => {
                return Err("--moe-layer-freq: an integer frequency needs --num-layers".into())
            }
            (Err(_), _) => layer_list(freq).ok_or_else(|| {
                format!("--moe-layer-freq: cannot read '{freq}' (an integer, or a list such as ([0]*3+[1]*58))")
            })?,
        };
        if pattern.iter().any(|&x| x > 1) {
            return Err(format!(
                "--moe-layer-freq: entries are 1 (MoE) or 0 (dense), got '{freq}'"
            ));
        }
        if let Some(l) = layers {
            if pattern.len() as u64 != l {
                return Err(format!(
                    "--moe-layer-freq: '{freq}' lists {} layers, --num-layers is {l}",
                    pattern.len()
                ));
            }
        }
        let dense_first = pattern.iter().take_while(|&&x| x == 0).count();
        if pattern[dense_first..].iter().all(|&x| x == 1) {
            self.set("model", "moe_first_k_dense", json!(dense_first));
        } else {
            self.set("model", "moe_first_k_dense", json!(0));
            self.set("model", "moe_layer_pattern", json!(pattern));
        }
        Ok(())
    }

    /// Sliding windows (`--window-size L,0`, `--window-attn-skip-freq`), the softmax's sink
    /// (`--softmax-type`), QK norm and the MoE dispatcher ([`Self::dispatcher_flags`]).
    fn attention_flags(&mut self) -> Result<(), String> {
        // An L2 QK norm (Llama 4; modelopt's --export-qk-l2-norm) replaces the QK layernorm
        // and has no weights.
        let l2 = self.on("--export-qk-l2-norm") || self.on("--qk-l2-norm");
        if self.on("--qk-layernorm") && !l2 {
            self.set("model", "qk_layernorm", json!(true));
        } else if l2 {
            self.notes
                .push("the QK norm is an L2 norm without weights: nothing to count".into());
        }
        let mut window = None;
        if let Some(w) = self.word("--window-size").map(str::to_string) {
            let inner: String = w
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
                .collect();
            let parsed = inner
                .split_once(',')
                .and_then(|(l, r)| Some((l.parse::<i64>().ok()?, r.parse::<i64>().ok()?)));
            match parsed {
                Some((left, 0)) if left >= 0 => window = Some(left as u64 + 1),
                Some((-1, 0)) => {}
                Some((_, right)) if right != 0 => {
                    return Err(format!(
                        "--window-size: only causal windows (right 0) are modelled, got '{w}'"
                    ))
                }
                _ => {
                    return Err(format!(
                        "--window-size: expected LEFT,RIGHT (e.g. 127,0), got '{w}'"
                    ))
                }
            }
        }
        if let Some(w) = window {
            self.set("model", "window_size", json!(w));
        }
        if let Some(f) = self.word("--window-attn-skip-freq").map(str::to_string) {
            if window.is_none() {
                return Err(format!(
                    "--window-attn-skip-freq {f}: names the full-attention layers among windowed ones, but no --window-size sets a window"
                ));
            }
            let freq = match f.trim().parse::<u32>() {
                Ok(n) => n,
                Err(_) => {
                    // A list: 1 windowed, 0 full (Megatron-Core's is_layer_window_attention).
                    let full: Vec<bool> = layer_list(&f)
                        .ok_or_else(|| format!("--window-attn-skip-freq: cannot read '{f}'"))?
                        .into_iter()
                        .map(|x| x == 0)
                        .collect();
                    let n = full.len() as u32;
                    (1..=n)
                        .find(|&k| (0..n).all(|l| full[l as usize] == ((l + 1) % k == 0)))
                        .ok_or_else(|| {
                            format!("--window-attn-skip-freq: '{f}' is not one full-attention layer every N (the only pattern modelled)")
                        })?
                }
            };
            self.set("model", "window_attn_skip_freq", json!(freq));
        }
        match self.word("--softmax-type") {
            None | Some("vanilla") => {}
            Some("off-by-one") => self.notes.push(
                "--softmax-type off-by-one: a 1 added to the softmax's denominator, nothing to count".into(),
            ),
            Some("learnable") => self.set("model", "attention_sinks", json!(true)),
            Some(other) => {
                return Err(format!(
                    "--softmax-type: unknown '{other}' (vanilla, off-by-one, learnable)"
                ))
            }
        }
        self.dispatcher_flags()
    }

    /// The vocabulary: given, padded, or left to the base model (it comes from the tokenizer).
    fn vocab(&mut self, defines: bool) {
        if let Some(p) = self.ints.get("--padded-vocab-size").copied() {
            self.set("model", "vocab_size", json!(p));
            self.set("model", "make_vocab_size_divisible_by", json!(1));
            return;
        }
        let known = self.word("--tokenizer-model").and_then(tokenizer_vocab);
        if let Some(v) = self.ints.get("--vocab-size").copied() {
            self.set("model", "vocab_size", json!(v));
        } else if let (Some((v, family)), true) = (known, defines) {
            self.set("model", "vocab_size", json!(v));
            self.notes.push(format!(
                "the vocabulary is {family}'s ({v} tokens), from the tokenizer {}",
                self.word("--tokenizer-model").unwrap_or_default()
            ));
        } else if defines {
            let from = self
                .word("--tokenizer-model")
                .map_or_else(String::new, |t| format!(" ({t})"));
            self.notes.push(format!(
                "the vocabulary size comes from the tokenizer{from}, which is not read: the base model's is kept (set it with parsim's --vocab-size N, or add Megatron's --vocab-size N to the launch)"
            ));
        }
        let div = self.ints.get("--make-vocab-size-divisible-by").copied();
        if let Some(d) = div.or(defines.then_some(128)) {
            self.set("model", "make_vocab_size_divisible_by", json!(d));
        }
    }

    /// Megatron's defaults for the model fields a script that gives the shape leaves out.
    fn model_defaults(&mut self, ffn: Option<u64>) {
        let bias = !self.on("--disable-bias-linear");
        self.set("model", "name", json!("megatron"));
        self.set("model", "add_bias_linear", json!(bias));
        // Megatron-Core's router has a bias under --add-bias-linear (router.py).
        let experts = self.ints.get("--num-experts").copied().unwrap_or(0);
        self.set(
            "model",
            "moe_router_linear_bias",
            json!(bias && experts > 0),
        );
        self.set(
            "model",
            "add_qkv_bias",
            json!(bias || self.on("--add-qkv-bias")),
        );
        let tied = !self.on("--untie-embeddings-and-output-weights");
        self.set("model", "tied_embeddings", json!(tied));
        if !self.has("model", "kv_channels") {
            self.set("model", "kv_channels", Value::Null);
        }
        for (key, default) in [
            ("hidden_dropout", json!(0.1)),
            ("attention_dropout", json!(0.1)),
            ("num_experts", json!(0)),
            ("moe_first_k_dense", json!(0)),
            ("moe_router_bias", json!(false)),
            ("mtp_num_layers", json!(0)),
            ("moe_shared_expert_intermediate_size", json!(0)),
            ("moe_capacity_factor", json!(0.0)),
            ("moe_aux_loss_coeff", json!(0.0)),
        ] {
            if !self.has("model", key) {
                self.set("model", key, default);
            }
        }
        if !self.has("model", "moe_ffn_hidden_size") {
            let experts = self.ints.get("--num-experts").copied().unwrap_or(0);
            let moe_ffn = if experts > 0 { ffn.unwrap_or(0) } else { 0 };
            self.set("model", "moe_ffn_hidden_size", json!(moe_ffn));
        }
        if !self.has("model", "moe_router_topk") {
            self.set(
                "model",
                "moe_router_topk",
                json!(
                    if self.ints.get("--num-experts").copied().unwrap_or(0) > 0 {
                        2
                    } else {
                        0
                    }
                ),
            );
        }
        if !self.has("model", "max_position_embeddings") {
            if let Some(seq) = self
                .layer
                .get("training")
                .and_then(|t| t.get("seq_length"))
                .cloned()
            {
                self.set("model", "max_position_embeddings", seq);
            }
        }
    }

    /// Multi-head latent attention (`--multi-latent-attention`), with Megatron's defaults.
    fn mla(&mut self) {
        if !self.on("--multi-latent-attention") {
            if self.has("model", "name") {
                self.set("model", "mla", Value::Null);
            }
            return;
        }
        let get = |k: &str, d: u64| self.ints.get(k).copied().unwrap_or(d);
        let mla = json!({
            "q_lora_rank": get("--q-lora-rank", 0),
            "kv_lora_rank": get("--kv-lora-rank", 32),
            "qk_nope_head_dim": get("--qk-head-dim", 128),
            "qk_rope_head_dim": get("--qk-pos-emb-head-dim", 64),
            "v_head_dim": get("--v-head-dim", 128),
        });
        self.set("model", "mla", mla);
    }

    /// Parallel degrees with Megatron's defaults (1, no SP, no distributed optimizer).
    fn parallel(&mut self) -> Result<(), String> {
        let tp = self
            .ints
            .get("--tensor-model-parallel-size")
            .copied()
            .unwrap_or(1);
        let pp = self
            .ints
            .get("--pipeline-model-parallel-size")
            .copied()
            .unwrap_or(1);
        let cp = self
            .ints
            .get("--context-parallel-size")
            .copied()
            .unwrap_or(1);
        self.set("parallel", "tp", json!(tp));
        self.set("parallel", "pp", json!(pp));
        self.set("parallel", "cp", json!(cp));
        if !self.has("parallel", "ep") {
            self.set("parallel", "ep", json!(1));
        }
        if !self.has("parallel", "expert_tp")
            && self.ints.get("--num-experts").copied().unwrap_or(0) > 0
        {
            // Megatron: the experts' TP defaults to the dense TP.
            self.set("parallel", "expert_tp", json!(tp));
        }
        self.set("parallel", "sp", json!(self.on("--sequence-parallel")));
        // A Megatron command line runs Megatron-Core: its overlap defaults, then the flags.
        self.set("training", "framework", json!("megatron-core"));
        let zero = self.zero()?;
        self.set("parallel", "zero", json!(zero));
        for (flag, key) in [
            ("--overlap-grad-reduce", "overlap_grad_reduce"),
            ("--overlap-param-gather", "overlap_param_gather"),
            ("--tp-comm-overlap", "tp_comm_overlap"),
        ] {
            let on = self.on(flag);
            self.set("parallel", key, json!(on));
        }
        let vpp = self.vpp(pp)?;
        self.set("parallel", "vpp", json!(vpp));
        if let Some(layout) = self
            .word("--pipeline-model-parallel-layout")
            .map(str::to_string)
        {
            self.set("parallel", "pipeline_layout", json!(layout));
        }
        let schedule = if vpp > 1 { "interleaved-1f1b" } else { "1f1b" };
        self.set("parallel", "schedule", json!(schedule));
        let cp_comm = match self.word("--cp-comm-type") {
            // Megatron's p2p ring splits the sequence into 2 x cp load-balanced chunks.
            Some("p2p") => Some("zigzag"),
            Some("all_gather") => Some("allgather"),
            Some("a2a") => Some("a2a"),
            Some("a2a+p2p") => {
                self.notes.push("--cp-comm-type a2a+p2p (hierarchical) is taken as the zigzag ring over all cp ranks".into());
                Some("zigzag")
            }
            Some(other) => {
                return Err(format!(
                    "--cp-comm-type: unknown '{other}' (p2p, all_gather, a2a, a2a+p2p)"
                ))
            }
            None => (cp > 1).then_some("zigzag"),
        };
        if let Some(c) = cp_comm {
            self.set("parallel", "cp_comm", json!(c));
        }
        Ok(())
    }

    /// The ZeRO stage and FSDP implementation of the sharding flags
    /// ([`super::sharding::sharding`]), the implementation set in the layer.
    fn zero(&mut self) -> Result<u64, String> {
        let mut notes = Vec::new();
        let sharding = super::sharding::sharding(
            &|f| self.on(f),
            &|f| self.word(f),
            self.ints
                .get("--num-distributed-optimizer-instances")
                .copied(),
            &mut notes,
        )?;
        self.notes.extend(notes);
        if let Some(f) = sharding.fsdp {
            self.set("parallel", "fsdp", json!(f.name()));
        }
        Ok(sharding.zero.into())
    }

    /// Model chunks per pipeline rank, from either of Megatron's two spellings or, as
    /// Megatron-Core derives it, from the explicit layout's stage count over pp.
    fn vpp(&self, pp: u64) -> Result<u64, String> {
        if let Some(v) = self.ints.get("--virtual-pipeline-model-parallel-size") {
            return Ok(*v);
        }
        if let Some(layout) = self.word("--pipeline-model-parallel-layout") {
            let stages = crate::config::rules::pipeline_layout::parse(layout)
                .map_err(|v| format!("--pipeline-model-parallel-layout: {}", v.rule))?
                .len() as u64;
            if pp == 0 || stages % pp != 0 {
                return Err(format!(
                    "--pipeline-model-parallel-layout: {stages} stages are not a multiple of --pipeline-model-parallel-size {pp}"
                ));
            }
            return Ok(stages / pp);
        }
        let Some(per_stage) = self
            .ints
            .get("--num-layers-per-virtual-pipeline-stage")
            .copied()
        else {
            return Ok(1);
        };
        let layers = self.ints.get("--num-layers").copied().ok_or(
            "--num-layers-per-virtual-pipeline-stage needs --num-layers (or give --virtual-pipeline-model-parallel-size)",
        )?;
        let per_rank = per_stage * pp;
        if per_rank == 0 || layers % per_rank != 0 {
            return Err(format!(
                "--num-layers-per-virtual-pipeline-stage {per_stage}: {layers} layers are not a multiple of {per_stage} x pp {pp}"
            ));
        }
        Ok(layers / per_rank)
    }

    /// Precision, recompute, gradient dtype and attention kernel.
    fn training(&mut self) -> Result<(), String> {
        let precision = super::precision::settings(
            |f| self.words.get(f).map(String::as_str),
            |f| self.switches.contains(f),
            |f| self.ints.get(f).copied(),
        )?;
        for (key, value) in precision {
            self.set("training", key, value);
        }
        let grad = if self.on("--grad-reduce-in-bf16") {
            "bf16"
        } else {
            "fp32"
        };
        self.set("training", "grad_dtype", json!(grad));
        let optimizer = super::optimizer_state::settings(|f| self.word(f), |f| self.on(f))?;
        for (key, value) in optimizer {
            self.set("training", key, value);
        }
        let recompute = match self.word("--recompute-granularity") {
            Some("full") => "full",
            Some("selective") => "selective",
            Some(other) => {
                return Err(format!(
                    "--recompute-granularity: unknown '{other}' (full, selective)"
                ))
            }
            None if self.on("--recompute-activations") => "selective",
            None => "none",
        };
        self.set("training", "recompute", json!(recompute));
        if recompute == "full" {
            let method = self
                .word("--recompute-method")
                .unwrap_or("uniform")
                .to_string();
            let n = self
                .ints
                .get("--recompute-num-layers")
                .copied()
                .unwrap_or(1);
            if method == "block" || n > 1 {
                self.notes.push(format!(
                    "--recompute-method {method} --recompute-num-layers {n} is taken as full recompute of every layer"
                ));
            }
        }
        self.recompute_modules(recompute)?;
        self.offloading()?;
        self.optimizer_offload()?;
        self.cuda_graph_flags()?;
        self.optimizer()?;
        match self.word("--attention-backend") {
            Some("unfused" | "local") => self.set("training", "flash_attention", json!(false)),
            Some(_) => self.set("training", "flash_attention", json!(true)),
            None if self.on("--use-flash-attn") => {
                self.set("training", "flash_attention", json!(true))
            }
            None => {}
        }
        Ok(())
    }

    /// The GPU count from torchrun's own flags.
    fn cluster(&mut self) {
        if let Some(n) = self.nproc_per_node {
            self.set("cluster", "gpus_per_node", json!(n));
            let gpus = n * self.nnodes.unwrap_or(1);
            self.set("cluster", "num_gpus", json!(gpus));
        }
    }
}
