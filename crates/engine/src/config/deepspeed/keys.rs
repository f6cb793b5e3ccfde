//! Every key a DeepSpeed configuration may hold, and what the import does with it: one row a
//! key in the data file keys.txt beside this one (read from DeepSpeed's own config code; its
//! header names the files), parsed by the imports' shared table reader.
//!
//! A key is mapped (it lands in the override layer), has no effect on memory or step time
//! (accepted, listed in one note), is modelled only at DeepSpeed's default (any other value is
//! refused by name), or is refused whenever it turns something on that parsim does not model.
//! A key in no row is not DeepSpeed's and is refused.

use super::super::import::{read_rows, TableError};

/// What the import does with one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Read into the override layer (`super::import` names each).
    Mapped,
    /// Changes neither memory nor step time: accepted and listed.
    NoEffect,
    /// A section whose contents change neither memory nor step time (logging, monitors,
    /// checkpoint engines, the scheduler): accepted whole and listed.
    NoEffectSection,
    /// Modelled at DeepSpeed's default only; another value is refused with the reason.
    DefaultOnly(Default, &'static str),
    /// Refused whenever present, with the reason.
    Unmodelled(&'static str),
    /// A section refused when its `enabled` is true (accepted, and listed, when false).
    UnlessDisabled(&'static str),
    /// A section with rows of its own.
    Section,
    /// An offload section: accepted at `device` "none", refused otherwise with the reason.
    Offload(&'static str),
    /// The optimizer's offload section: accepted at `device` "none", mapped at "cpu" (CPU
    /// optimizer offload, src/memory/optimizer_offload.rs), refused at "nvme" with the reason.
    OffloadCpu(&'static str),
}

/// DeepSpeed's default of a [`Rule::DefaultOnly`] key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    Bool(bool),
    Num(f64),
    /// The key's default is None: any value given sets something.
    Null,
}

/// The key table: `JSON path | rule`, with the reasons as `@name = text` lines.
const TABLE: &str = include_str!("keys.txt");

/// Parses a key table in [`TABLE`]'s format.
pub fn parse_table(text: &'static str) -> Result<Vec<(&'static str, Rule)>, TableError> {
    read_rows("deepspeed/keys.txt", text, 2)?
        .into_iter()
        .map(|row| {
            let (path, rule) = (row.cells[0], row.cells[1]);
            let (kind, value) = rule.split_once(' ').unwrap_or((rule, ""));
            let rule = match (kind, row.reason) {
                ("mapped", None) => Rule::Mapped,
                ("no-effect", None) => Rule::NoEffect,
                ("no-effect-section", None) => Rule::NoEffectSection,
                ("section", None) => Rule::Section,
                ("default", Some(why)) => Rule::DefaultOnly(
                    match value {
                        "true" => Default::Bool(true),
                        "false" => Default::Bool(false),
                        "null" => Default::Null,
                        n => Default::Num(n.parse().map_err(|_| {
                            row.error(format!(
                                "default '{n}' is not true, false, null or a number"
                            ))
                        })?),
                    },
                    why,
                ),
                ("unmodelled", Some(why)) => Rule::Unmodelled(why),
                ("unless-disabled", Some(why)) => Rule::UnlessDisabled(why),
                ("offload", Some(why)) => Rule::Offload(why),
                ("offload-cpu", Some(why)) => Rule::OffloadCpu(why),
                _ => return Err(row.error(format!("unknown rule '{rule}'"))),
            };
            Ok((path, rule))
        })
        .collect()
}

/// The rule of the key at `path` (dotted: `zero_optimization.stage`), if DeepSpeed has it.
pub fn rule(path: &str) -> Option<Rule> {
    static KEYS: std::sync::LazyLock<Vec<(&'static str, Rule)>> = std::sync::LazyLock::new(|| {
        parse_table(TABLE).expect("the shipped DeepSpeed key table parses (unit-tested)")
    });
    KEYS.iter().find(|(p, _)| *p == path).map(|(_, r)| *r)
}

/// The offload sections' `device` values DeepSpeed knows (offload_config.py
/// `OffloadDeviceEnum`).
pub const OFFLOAD_DEVICES: [&str; 3] = ["none", "cpu", "nvme"];

/// The keys of the optimizer's offload section (`DeepSpeedZeroOffloadOptimizerConfig`,
/// deepspeed/runtime/zero/offload_config.py) and whether each changes what parsim models
/// under CPU offload: `ratio` (a partial offload, read by ZeRO-3's optimizer only) does and is
/// modelled at 1 only; the NVMe path and its pipelining are for `device` "nvme", pinned host
/// buffers and `fast_init` change host memory and start-up only.
pub const OFFLOAD_OPTIMIZER_KEYS: [&str; 8] = [
    "device",
    "nvme_path",
    "buffer_count",
    "pin_memory",
    "pipeline_read",
    "pipeline_write",
    "fast_init",
    "ratio",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped table parses, lists no path twice, and every row's section is a `section`
    /// row (so the walker reaches it).
    #[test]
    fn the_shipped_table_parses_and_every_row_is_reachable() {
        let keys = parse_table(TABLE).unwrap();
        let mut seen = std::collections::HashSet::new();
        for (path, _) in &keys {
            assert!(seen.insert(*path), "{path} twice");
            if let Some((parent, _)) = path.rsplit_once('.') {
                assert_eq!(rule(parent), Some(Rule::Section), "{path}");
            }
        }
        // 143 rows: 59 top-level keys, 53 of zero_optimization, 5 each of bf16 and bfloat16,
        // 9 of fp16, 3 each of optimizer and data_types, 6 of activation_checkpointing.
        assert_eq!(keys.len(), 59 + 53 + 5 + 5 + 9 + 3 + 3 + 6);
        assert_eq!(
            rule("zero_optimization.sub_group_size"),
            Some(Rule::DefaultOnly(
                Default::Num(1e9),
                "the optimizer step's fp32 sub-groups of another size are not modelled"
            ))
        );
    }

    /// A row the table cannot hold is an error naming its line and the rule.
    #[test]
    fn malformed_rows_are_named_by_line() {
        let err = |t: &'static str| parse_table(t).unwrap_err();
        assert!(err("a | maybe").rule.contains("'maybe'"));
        assert!(err("a | unmodelled").rule.contains("'unmodelled'"));
        assert!(err("@w = x\na | default lots @w").rule.contains("'lots'"));
        assert_eq!(err("\na | b | c").line, 2);
    }
}
