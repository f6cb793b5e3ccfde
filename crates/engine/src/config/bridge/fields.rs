//! Every field of a Megatron-Bridge configuration the import knows, and what it does with it:
//! one row a field in the data file fields.txt beside this one (read from Megatron-Bridge's
//! and Megatron-Core's dataclasses; its header names the files and commits), parsed by the
//! imports' shared table reader. A field in no row is refused by name.

use super::super::import::{read_rows, TableError};
use serde_json::Value;

/// What the import does with one field.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// The Megatron-LM flag the field configures: a switch when true, its values otherwise.
    Flag(&'static str),
    /// A switch given when the field is false.
    FlagOff(&'static str),
    /// A torch dtype given as the flag's word (`torch.bfloat16` -> `bf16`).
    FlagDtype(&'static str),
    /// Read by the import's code (`super::import` names each).
    Read,
    /// A `MixedPrecisionConfig` field, copied onto the same-named model, ddp and optimizer
    /// fields (`MixedPrecisionConfig.setup`).
    Precision,
    /// Changes neither memory nor step time: accepted, listed.
    NoEffect,
    /// A kernel fusion or communication-kernel detail of the same work: accepted, listed
    /// apart.
    Kernel,
    /// Modelled at the dataclass's default only (the value, as JSON).
    Default(Value),
    /// A section with rows of its own.
    Section,
    /// A section whose fields change neither memory nor step time: accepted whole, listed.
    NoEffectSection,
    /// Refused whenever set, with the reason.
    Unmodelled(&'static str),
}

/// The field table: `section.field | rule`, with the reasons as `@name = text` lines.
const TABLE: &str = include_str!("fields.txt");

/// Parses a field table in [`TABLE`]'s format.
pub fn parse_table(text: &'static str) -> Result<Vec<(&'static str, Rule)>, TableError> {
    read_rows("bridge/fields.txt", text, 2)?
        .into_iter()
        .map(|row| {
            let (path, rule) = (row.cells[0], row.cells[1]);
            let (kind, value) = rule.split_once(' ').unwrap_or((rule, ""));
            let flag = |v: &'static str| {
                if v.starts_with("--") && !v.contains(' ') {
                    Ok(v)
                } else {
                    Err(row.error(format!("'{v}' is not a --flag")))
                }
            };
            let rule = match (kind, row.reason) {
                ("flag", None) => Rule::Flag(flag(value)?),
                ("flag-off", None) => Rule::FlagOff(flag(value)?),
                ("flag-dtype", None) => Rule::FlagDtype(flag(value)?),
                ("read", None) => Rule::Read,
                ("precision", None) => Rule::Precision,
                ("no-effect", None) => Rule::NoEffect,
                ("kernel", None) => Rule::Kernel,
                ("section", None) => Rule::Section,
                ("no-effect-section", None) => Rule::NoEffectSection,
                ("default", None) => Rule::Default(
                    serde_json::from_str(value)
                        .map_err(|_| row.error(format!("default '{value}' is not a JSON value")))?,
                ),
                ("unmodelled", Some(why)) => Rule::Unmodelled(why),
                _ => return Err(row.error(format!("unknown rule '{rule}'"))),
            };
            Ok((path, rule))
        })
        .collect()
}

/// The rule of the field at `path` (`model.num_layers`), if the table has it.
pub fn rule(path: &str) -> Option<&'static Rule> {
    static FIELDS: std::sync::LazyLock<Vec<(&'static str, Rule)>> =
        std::sync::LazyLock::new(|| {
            parse_table(TABLE)
                .expect("the shipped Megatron-Bridge field table parses (unit-tested)")
        });
    FIELDS.iter().find(|(p, _)| *p == path).map(|(_, r)| r)
}

/// Every row of the shipped table (for the tests and the docs).
pub fn all() -> Vec<(&'static str, Rule)> {
    parse_table(TABLE).expect("the shipped Megatron-Bridge field table parses (unit-tested)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped table parses, lists no field twice, and every row's section is a
    /// `section` row (so the walker reaches it).
    #[test]
    fn the_shipped_table_parses_and_every_row_is_reachable() {
        let fields = all();
        let mut seen = std::collections::HashSet::new();
        for (path, _) in &fields {
            assert!(seen.insert(*path), "{path} twice");
            if let Some((parent, _)) = path.rsplit_once('.') {
                assert_eq!(rule(parent), Some(&Rule::Section), "{path}");
            }
        }
        assert_eq!(
            rule("model.moe_token_dropping"),
            Some(&Rule::Default(Value::Bool(false)))
        );
        assert_eq!(
            rule("model.add_bias_linear"),
            Some(&Rule::FlagOff("--disable-bias-linear"))
        );
    }

    /// Every flag the table translates to is one the Megatron import reads or refuses by
    /// name: nothing translated is silently ignored there.
    #[test]
    fn every_translated_flag_is_read_or_refused_by_the_megatron_import() {
        for (path, rule) in all() {
            if let Rule::Flag(f) | Rule::FlagOff(f) | Rule::FlagDtype(f) = rule {
                assert!(
                    super::super::super::megatron::knows_flag(f),
                    "{path}: {f} is neither read nor refused by the Megatron import"
                );
            }
        }
    }

    /// A row the table cannot hold is an error naming its line.
    #[test]
    fn malformed_rows_are_named_by_line() {
        let err = |t: &'static str| parse_table(t).unwrap_err();
        assert!(err("a | maybe").rule.contains("'maybe'"));
        assert!(err("a | flag x").rule.contains("'x'"));
        assert!(err("a | default nope").rule.contains("'nope'"));
        assert_eq!(err("\na | b | c").line, 2);
    }
}
