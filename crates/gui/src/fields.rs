//! Which engine violations are shown next to which control.
//!
//! Every [`parsim::config::Violation`] names the field at fault (`parallel.tp`); the control
//! editing that field shows it. A rule often names a second field too ("num_attention_heads
//! (12) must be divisible by tp (8)" is filed under `parallel.tp`), and the user may just have
//! edited that one, so a violation is also shown next to every control whose field name
//! (`num_attention_heads`) appears in the rule. Violations of fields without a control
//! (`parallel.order`, say) are listed at the top of the configuration panel.

use crate::state::Problems;
use parsim::config::Violation;

/// The configuration fields that have a control in the configuration panel.
pub const CONTROLLED: &[&str] = &[
    "model.name",
    "model.num_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.num_query_groups",
    "model.ffn_hidden_size",
    "model.vocab_size",
    "model.num_experts",
    "model.moe_router_topk",
    "training.seq_length",
    "training.micro_batch_size",
    "training.global_batch_size",
    "training.precision",
    "training.recompute",
    "training.flash_attention",
    "training.framework",
    "parallel.tp",
    "parallel.sp",
    "parallel.cp",
    "parallel.cp_comm",
    "parallel.pp",
    "parallel.vpp",
    "parallel.schedule",
    "parallel.ep",
    "parallel.zero",
    "parallel.dp",
    "cluster.gpu",
    "cluster.num_gpus",
    "cluster.gpus_per_node",
    "cluster.nvlink_domain_size",
];

/// True when `rule` mentions `name` as a whole word (letters, digits and `_` delimit words).
fn mentions(rule: &str, name: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    rule.match_indices(name).any(|(i, _)| {
        let before = rule[..i].chars().next_back();
        let after = rule[i + name.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// True when violation `v` belongs next to the control of `field`: it is filed under that
/// field, or its rule names the field (only multi-word names like `num_attention_heads`, so
/// that short names such as `tp` in "tp x cp x pp" do not pull every message everywhere).
pub fn concerns(v: &Violation, field: &str) -> bool {
    if v.field == field {
        return true;
    }
    let name = field.rsplit('.').next().unwrap_or(field);
    name.contains('_') && mentions(&v.rule, name)
}

/// The violations to show next to the control of `field`.
pub fn at<'a>(
    problems: Option<&'a Problems>,
    field: &'a str,
) -> impl Iterator<Item = &'a Violation> {
    problems
        .into_iter()
        .flat_map(|p| p.violations.iter())
        .filter(move |v| concerns(v, field))
}

/// The violations no control shows (their field has no control, or no field at all).
pub fn unplaced(problems: Option<&Problems>) -> impl Iterator<Item = &Violation> {
    problems
        .into_iter()
        .flat_map(|p| p.violations.iter())
        .filter(|v| !CONTROLLED.iter().any(|f| concerns(v, f)))
}

/// The text shown for a violation: the rule, then the hint.
pub fn message(v: &Violation) -> String {
    match &v.hint {
        Some(h) => format!("{} ({h})", v.rule),
        None => v.rule.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_naming_another_field_is_shown_there_too() {
        let v = Violation::new(
            "parallel.tp",
            "num_attention_heads (12) must be divisible by tp (8)",
        );
        assert!(concerns(&v, "parallel.tp"));
        assert!(concerns(&v, "model.num_attention_heads"));
        assert!(!concerns(&v, "model.num_query_groups"));
        assert!(!concerns(&v, "parallel.pp"));
    }

    #[test]
    fn names_match_whole_words_only() {
        assert!(mentions("num_layers (3) x", "num_layers"));
        assert!(!mentions("moe_num_layers", "num_layers"));
        assert!(!mentions("num_layers_x", "num_layers"));
    }

    #[test]
    fn violations_without_a_control_are_unplaced() {
        let p = Problems {
            violations: vec![
                Violation::new("parallel.order", "bad"),
                Violation::new("parallel.tp", "bad"),
                Violation::new("", "engine failed"),
            ],
        };
        let rest: Vec<_> = unplaced(Some(&p)).map(|v| v.field.as_str()).collect();
        assert_eq!(rest, ["parallel.order", ""]);
    }
}
