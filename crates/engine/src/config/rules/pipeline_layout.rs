//! Megatron-Core's explicit pipeline layout (`--pipeline-model-parallel-layout`): a string of
//! virtual stages in order, `|` between stages, `E` the embedding, `t` a transformer layer,
//! `m` an MTP layer, `L` the loss; `X*n` and `(...)*n` repeat, commas are cosmetic. Stage s
//! runs on pipeline rank s mod pp, so the string holds pp x vpp stages.
//! Example: `Et*3|(tt|)*29,m|L` (31 stages' worth of layers around an embedding and a loss).

use super::super::Violation;

const FIELD: &str = "parallel.pipeline_layout";

/// The expanded layout may not exceed this many characters: a bound on what a string of
/// nested repeats can ask for, far above any real model (a million layers).
const MAX_EXPANDED_CHARS: usize = 1 << 20;

/// What one virtual stage of a layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutStage {
    pub embedding: bool,
    /// Decoder (transformer) layers.
    pub decoder: u32,
    pub mtp: u32,
    pub loss: bool,
}

impl LayoutStage {
    fn is_empty(&self) -> bool {
        !self.embedding && !self.loss && self.decoder == 0 && self.mtp == 0
    }
}

fn err(rule: impl Into<String>) -> Violation {
    Violation::new(FIELD, rule)
}

/// Expands `(...)*n` (innermost first) and `X*n`, as Megatron's `parse_str_to_list` does.
fn expand(s: &str) -> Result<String, Violation> {
    let mut s: String = s
        .chars()
        .filter(|c| *c != ',' && !c.is_whitespace())
        .collect();
    // Innermost parentheses first: a group with no '(' inside.
    while let Some(close) = s.find(')') {
        let open = s[..close]
            .rfind('(')
            .ok_or_else(|| err(format!("'{s}': a ')' has no matching '('")))?;
        let (count, end) = repeat_count(&s, close + 1)?;
        let body = &s[open + 1..close];
        let expanded = checked_repeat(body, count)?;
        s = format!("{}{}{}", &s[..open], expanded, &s[end..]);
    }
    if s.contains('(') {
        return Err(err(format!("'{s}': a '(' is never closed")));
    }
    let mut out = String::new();
    let mut it = s.char_indices().peekable();
    while let Some((_, c)) = it.next() {
        if let Some(&(star, '*')) = it.peek() {
            let (count, end) = repeat_count(&s, star)?;
            out.push_str(&checked_repeat(c.encode_utf8(&mut [0; 4]), count)?);
            while it.peek().is_some_and(|&(k, _)| k < end) {
                it.next();
            }
        } else {
            out.push(c);
        }
        if out.len() > MAX_EXPANDED_CHARS {
            return Err(too_long());
        }
    }
    Ok(out)
}

fn too_long() -> Violation {
    err(format!(
        "expands to more than {MAX_EXPANDED_CHARS} characters"
    ))
}

/// Parses `*n` at byte `at`; returns n and the byte after its digits.
fn repeat_count(s: &str, at: usize) -> Result<(usize, usize), Violation> {
    let rest = &s[at..];
    let Some(digits) = rest.strip_prefix('*') else {
        return Err(err(format!(
            "'{s}': a ')' must be followed by '*n', a repeat count"
        )));
    };
    let len = digits.chars().take_while(char::is_ascii_digit).count();
    let n: usize = digits[..len]
        .parse()
        .map_err(|_| err(format!("'{s}': '*' must be followed by a repeat count")))?;
    Ok((n, at + 1 + len))
}

fn checked_repeat(body: &str, n: usize) -> Result<String, Violation> {
    if body.len().saturating_mul(n) > MAX_EXPANDED_CHARS {
        return Err(too_long());
    }
    Ok(body.repeat(n))
}

/// The stages of a layout string, checked letter by letter (every stage non-empty).
pub fn parse(layout: &str) -> Result<Vec<LayoutStage>, Violation> {
    let expanded = expand(layout)?;
    let mut stages = Vec::new();
    for (i, text) in expanded.split('|').enumerate() {
        let mut st = LayoutStage::default();
        for c in text.chars() {
            match c {
                'E' if st.embedding => {
                    return Err(err(format!("stage {i} names the embedding 'E' twice")))
                }
                'E' => st.embedding = true,
                'L' if st.loss => return Err(err(format!("stage {i} names the loss 'L' twice"))),
                'L' => st.loss = true,
                't' => st.decoder += 1,
                'm' => st.mtp += 1,
                other => {
                    return Err(err(format!(
                        "unknown letter '{other}' in stage {i}: the letters are E (embedding), t (transformer layer), m (MTP layer), L (loss), with '|' between stages"
                    )))
                }
            }
        }
        if st.is_empty() {
            return Err(err(format!(
                "stage {i} is empty: every virtual stage holds at least one of E, t, m, L"
            )));
        }
        stages.push(st);
    }
    Ok(stages)
}

/// The arguments of a [`stage_layers`] call and what it returned.
type Checked = ((String, u32, u32, u32, u32), Result<Vec<u32>, Violation>);

/// Layouts kept per thread ([`stage_layers`]).
const KEPT_LAYOUTS: usize = 16;

thread_local! {
    /// The last layouts checked on this thread: a search validates the same few layouts for
    /// many mixes (and each validation asks twice).
    static CHECKED: std::cell::RefCell<Vec<Checked>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decoder layers of each global stage from `layout`, checked against the model and the
/// pipeline: pp x vpp stages, every layer once, the embedding first, the loss (and MTP, which
/// parsim places with the loss) last. The answer depends on the arguments alone: the last
/// [`KEPT_LAYOUTS`] are kept per thread.
pub fn stage_layers(
    layout: &str,
    layers: u32,
    mtp_layers: u32,
    pp: u32,
    vpp: u32,
) -> Result<Vec<u32>, Violation> {
    let hit = CHECKED.with(|c| {
        c.borrow()
            .iter()
            .find(|((l, a, b, c, d), _)| {
                (*a, *b, *c, *d) == (layers, mtp_layers, pp, vpp) && l == layout
            })
            .map(|(_, r)| r.clone())
    });
    if let Some(r) = hit {
        return r;
    }
    let r = check_stage_layers(layout, layers, mtp_layers, pp, vpp);
    CHECKED.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= KEPT_LAYOUTS {
            drop(c.remove(0));
        }
        c.push(((layout.to_string(), layers, mtp_layers, pp, vpp), r.clone()));
    });
    r
}

/// [`stage_layers`], worked out.
fn check_stage_layers(
    layout: &str,
    layers: u32,
    mtp_layers: u32,
    pp: u32,
    vpp: u32,
) -> Result<Vec<u32>, Violation> {
    let stages = parse(layout)?;
    let n = stages.len() as u64;
    if n % pp as u64 != 0 {
        return Err(err(format!(
            "{n} stages are not a multiple of pp ({pp}): the stages are laid out in turn over the pp ranks"
        )));
    }
    if n != pp as u64 * vpp as u64 {
        return Err(Violation::new(
            "parallel.vpp",
            format!(
                "the pipeline layout's {n} stages over pp = {pp} give {} virtual stages per rank, but vpp = {vpp}",
                n / pp as u64
            ),
        )
        .hint(format!("set parallel.vpp = {}", n / pp as u64)));
    }
    let decoder: u64 = stages.iter().map(|s| s.decoder as u64).sum();
    if decoder != layers as u64 {
        return Err(err(format!(
            "holds {decoder} transformer layers 't', but model.num_layers = {layers}"
        )));
    }
    let last = stages.len() - 1;
    if !stages[0].embedding || stages.iter().filter(|s| s.embedding).count() != 1 {
        return Err(err(
            "the embedding 'E' must appear exactly once, in the first stage",
        ));
    }
    if !stages[last].loss || stages.iter().filter(|s| s.loss).count() != 1 {
        return Err(err(
            "the loss 'L' must appear exactly once, in the last stage",
        ));
    }
    let mtp: u32 = stages.iter().map(|s| s.mtp).sum();
    if mtp != mtp_layers || stages[..last].iter().any(|s| s.mtp > 0) {
        return Err(err(format!(
            "must hold model.mtp_num_layers = {mtp_layers} MTP layers 'm', all in the last stage (got {mtp})"
        )));
    }
    Ok(stages.iter().map(|s| s.decoder).collect())
}

/// Decoder layers of each global stage with Megatron-Core's `account_for_embedding_in_pipeline_split`
/// / `account_for_loss_in_pipeline_split`: the embedding and the loss each take one layer slot,
/// on the first and the last stage, and the slots split evenly over pp x vpp stages.
pub fn accounted_stage_layers(
    layers: u32,
    pp: u32,
    vpp: u32,
    embedding: bool,
    loss: bool,
) -> Result<Vec<u32>, Violation> {
    let slots = layers as u64 + embedding as u64 + loss as u64;
    let stages = pp as u64 * vpp as u64;
    if slots % stages != 0 {
        return Err(Violation::new(
            "model.num_layers",
            format!(
                "{layers} layers{}{} = {slots} slots do not split evenly into pp x vpp = {pp} x {vpp} = {stages} stages",
                if embedding { " + embedding" } else { "" },
                if loss { " + loss" } else { "" },
            ),
        ));
    }
    let per = slots / stages;
    let mut out = vec![per as u32; stages as usize];
    let last = out.len() - 1;
    for (on, stage, field) in [
        (
            embedding,
            0,
            "parallel.account_for_embedding_in_pipeline_split",
        ),
        (loss, last, "parallel.account_for_loss_in_pipeline_split"),
    ] {
        if on {
            if out[stage] == 0 {
                return Err(Violation::new(
                    field,
                    "the first and last stage have one slot between them: not enough for both the embedding and the loss",
                ));
            }
            out[stage] -= 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_docstring_example_expands() {
        // Megatron-Core's parse_str_to_list docstring: "Ettt|(tt|)*29,m|L" is
        // [E,t,t,t] + [t,t] x 29 + [m] + [L]: 32 stages, 3 + 58 = 61 layers.
        let s = parse("Ettt|(tt|)*29,m|L").unwrap();
        assert_eq!(s.len(), 32);
        assert!(s[0].embedding && s[0].decoder == 3);
        assert!(s[1..30].iter().all(|x| x.decoder == 2 && !x.embedding));
        assert_eq!(s[30].mtp, 1);
        assert!(s[31].loss && s[31].decoder == 0);
    }

    #[test]
    fn repeats_nest_and_single_letters_repeat() {
        let s = parse("Et*3|((t|)*2)*2,tL").unwrap();
        assert_eq!(
            s.iter().map(|x| x.decoder).collect::<Vec<_>>(),
            [3, 1, 1, 1, 1, 1]
        );
    }

    #[test]
    fn bad_layouts_name_the_rule() {
        let rule = |l: &str| stage_layers(l, 4, 0, 2, 1).unwrap_err().rule;
        assert!(rule("Ett|tx|L").contains("unknown letter 'x'"));
        assert!(rule("Ett||ttL").contains("stage 1 is empty"));
        assert!(rule("Ett|tL").contains("3 transformer layers"));
        assert!(rule("Ett|t|ttL").contains("not a multiple of pp"));
        assert!(rule("tt|EttL").contains("embedding 'E'"));
        assert!(rule("EttL|tt").contains("loss 'L'"));
        assert!(rule("(Ett|ttL").contains("never closed"));
        assert!(rule("(tt)*99999999999").contains("expands to more than"));
        let e = stage_layers("Et|t|t|tL", 4, 0, 2, 1).unwrap_err();
        assert_eq!(e.field, "parallel.vpp");
    }

    #[test]
    fn llama_405b_slots_fill_sixteen_ranks_interleaved() {
        // Llama-3-405B: 126 layers + embedding + loss = 128 slots; pp 16 x vpp 2 -> 4 per stage.
        let v = accounted_stage_layers(126, 16, 2, true, true).unwrap();
        assert_eq!(v.len(), 32);
        assert_eq!((v[0], v[1], v[31]), (3, 4, 3));
        assert_eq!(v.iter().sum::<u32>(), 126);
        // Without the slots, 126 does not split over 32 stages.
        assert!(accounted_stage_layers(126, 16, 2, false, false).is_err());
    }

    /// The kept answers are the worked-out ones, valid or not, in any order and past the
    /// number kept (so that entries are dropped and asked for again).
    #[test]
    fn kept_layouts_answer_as_worked_out() {
        let layouts = [
            "Ett|ttL", "Et|tttL", "Ettt|tL", "Ett|tx|L", "Ett||ttL", "Ett|tL", "EttL|tt",
        ];
        for round in 0..3 {
            for (i, l) in layouts.iter().enumerate() {
                for pp in 1..=(KEPT_LAYOUTS as u32 / 2) {
                    let (layers, vpp) = (4 + (i as u32 + round) % 2, 1);
                    assert_eq!(
                        stage_layers(l, layers, 0, pp, vpp),
                        check_stage_layers(l, layers, 0, pp, vpp),
                        "{l} pp {pp}"
                    );
                }
            }
        }
    }
}
