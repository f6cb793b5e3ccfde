//! Values the Megatron reader parses beyond plain numbers: Megatron's per-layer list
//! expressions and the vocabularies of the tokenizers that modelopt conf files name.

/// `K` of Megatron's `--moe-layer-freq ([0]*K+[1]*N)` (1 = every layer MoE: 0).
pub(super) fn first_dense_layers(freq: &str) -> Option<u64> {
    let f: String = freq.chars().filter(|c| !c.is_whitespace()).collect();
    if f == "1" {
        return Some(0);
    }
    let inner = f.strip_prefix('(')?.strip_suffix(')')?;
    let (dense, moe) = inner.split_once('+')?;
    moe.strip_prefix("[1]*")?.parse::<u64>().ok()?;
    dense.strip_prefix("[0]*")?.parse().ok()
}

/// Megatron's list expressions for per-layer patterns (`--moe-layer-freq`,
/// `--window-attn-skip-freq`): `[0]*3+[1]*58`, `([0,1]*24)`, `[1,1,0]`, terms joined by `+`,
/// each a bracketed list or a parenthesised expression, optionally times a count. `None`
/// when it is not one.
pub(super) fn layer_list(expr: &str) -> Option<Vec<u8>> {
    let e: String = expr
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '"' && *c != '\'')
        .collect();
    let mut out = Vec::new();
    for term in split_top(&e, '+')? {
        out.extend(list_term(term)?);
    }
    (!out.is_empty() && out.len() <= 1 << 20).then_some(out)
}

/// `s` split at `sep` outside brackets and parentheses; `None` when they do not balance.
fn split_top(s: &str, sep: char) -> Option<Vec<&str>> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth < 0 {
                    return None;
                }
            }
            c if c == sep && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    (depth == 0).then(|| {
        parts.push(&s[start..]);
        parts
    })
}

/// One term: `[a,b,...]`, `(expr)`, either times `*N`.
fn list_term(t: &str) -> Option<Vec<u8>> {
    let parts = split_top(t, '*')?;
    let (base, times) = match parts.as_slice() {
        [b] => (*b, 1usize),
        [b, n] => (*b, n.parse().ok()?),
        _ => return None,
    };
    let items: Vec<u8> =
        if let Some(inner) = base.strip_prefix('[').and_then(|b| b.strip_suffix(']')) {
            inner
                .split(',')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?
        } else if let Some(inner) = base.strip_prefix('(').and_then(|b| b.strip_suffix(')')) {
            layer_list(inner)?
        } else {
            return None;
        };
    if times > 1 << 20 || items.len().saturating_mul(times) > 1 << 20 {
        return None;
    }
    Some(items.repeat(times))
}

/// The vocabulary of a Hugging Face tokenizer parsim knows by name (the models of its presets
/// that Megatron-LM's modelopt conf files name without a vocabulary size): (rows, family).
pub(super) fn tokenizer_vocab(name: &str) -> Option<(u64, &'static str)> {
    let repo = name.trim_end_matches('/');
    let model = repo.rsplit('/').next().unwrap_or(repo);
    let org = repo.split('/').next().unwrap_or("");
    match org {
        // Qwen3 technical report, Table 1 and the released config.json files: 151,936.
        "Qwen" if model.starts_with("Qwen3-") => Some((151_936, "Qwen3")),
        // DeepSeek-V3 and R1 config.json: 129,280.
        "deepseek-ai" if model.starts_with("DeepSeek-V3") || model.starts_with("DeepSeek-R1") => {
            Some((129_280, "DeepSeek-V3"))
        }
        "moonshotai" if model.starts_with("Kimi-K2") => Some((163_840, "Kimi K2")),
        "openai" if model.starts_with("gpt-oss-") => Some((201_088, "GPT-OSS (o200k)")),
        "meta-llama" if model.starts_with("Llama-4-") => Some((202_048, "Llama 4")),
        // Nemotron-H and Nemotron 3 config.json: 131,072.
        "nvidia" if model.starts_with("Nemotron-H-") || model.starts_with("NVIDIA-Nemotron-3-") => {
            Some((131_072, "Nemotron"))
        }
        _ => None,
    }
}
