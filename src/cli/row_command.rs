//! The `parsim estimate` command that reproduces a search row: the flags the search was given
//! that `estimate` shares (configuration file, model, cluster and training settings, read back
//! from clap's own parse of this command line, so no list of flags is kept by hand) and the
//! mix's own flags ([`parsim::search::Mix::estimate_flags`]).

use super::config_args::{SourceArgs, TrainingArgs, WorkloadArgs};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory};
use parsim::config::Config;
use parsim::report::format::shell_quote;
use parsim::search::{Ranked, MIX_FLAGS};
use std::path::Path;

/// The search's flags that an `estimate` takes too, as typed.
#[derive(Debug, Clone, Default)]
pub struct UserFlags {
    words: Vec<String>,
}

impl UserFlags {
    /// The flags of this process's `parsim search` command line.
    pub fn of_search() -> UserFlags {
        let Ok(matches) = super::Cli::command().try_get_matches_from(std::env::args_os()) else {
            return UserFlags::default();
        };
        let Some(m) = matches.subcommand_matches("search") else {
            return UserFlags::default();
        };
        let mut shared = clap::Command::new("shared");
        shared = SourceArgs::augment_args(shared);
        shared = WorkloadArgs::augment_args(shared);
        shared = TrainingArgs::augment_args(shared);
        let mut words = Vec::new();
        for arg in shared.get_arguments() {
            let (id, Some(long)) = (arg.get_id().as_str(), arg.get_long()) else {
                continue;
            };
            // The GPU count is the row's own (a range search has many).
            if long == "gpus" || MIX_FLAGS.contains(&long) {
                continue;
            }
            if m.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            if !arg.get_action().takes_values() {
                words.push(format!("--{long}"));
                continue;
            }
            let Ok(Some(occurrences)) = m.try_get_raw_occurrences(id) else {
                continue;
            };
            for occurrence in occurrences {
                let values: Vec<String> = occurrence
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                match arg.get_value_delimiter() {
                    Some(d) => {
                        words.push(format!("--{long}"));
                        words.push(values.join(&d.to_string()));
                    }
                    None => {
                        for v in values {
                            words.push(format!("--{long}"));
                            words.push(v);
                        }
                    }
                }
            }
        }
        UserFlags { words }
    }

    /// The command that reproduces `r`, found by a search over `base`; `None` when no flags
    /// can (the reason is printed by [`UserFlags::explain`]).
    pub fn command(&self, r: &Ranked, base: &Config) -> Option<String> {
        let mut base = base.clone();
        base.cluster.num_gpus = r.estimate.config.cluster.num_gpus;
        if r.mix.flags_cannot_reproduce(&base).is_some() {
            return None;
        }
        let mut words = vec!["parsim".to_string(), "estimate".to_string()];
        words.extend(self.words.iter().cloned());
        words.push("--gpus".into());
        words.push(base.cluster.num_gpus.to_string());
        words.extend(r.mix.estimate_flags(&base));
        Some(
            words
                .iter()
                .map(|w| shell_quote(w))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    /// Sets the command of every row of `rows`.
    pub fn fill<'a>(&self, rows: impl IntoIterator<Item = &'a mut Ranked>, base: &Config) {
        for r in rows {
            r.command = self.command(r, base);
        }
    }

    /// Why a row has no command, for the text output.
    pub fn explain(r: &Ranked, base: &Config) -> String {
        r.mix
            .flags_cannot_reproduce(base)
            .map_or_else(String::new, |why| {
                format!("(no command: {why}; --write-configs DIR writes its configuration)")
            })
    }
}

/// The commands of a table's rows, numbered as the table numbers them.
pub fn commands_text(rows: &[Ranked], base: &Config) -> String {
    let mut out = String::from("each row as a command (it gives the row's figures):\n");
    for (i, r) in rows.iter().enumerate() {
        let text = r
            .command
            .clone()
            .unwrap_or_else(|| UserFlags::explain(r, base));
        out.push_str(&format!("  {:>2}  {text}\n", i + 1));
    }
    out
}

/// Writes each row's whole configuration to `dir/<prefix>-<rank>.toml` (`parsim estimate
/// --config FILE` reproduces the row) and returns the files written.
pub fn write_configs(
    dir: &Path,
    prefix: &str,
    rows: &[Ranked],
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("--write-configs {}", dir.display()))?;
    let mut written = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let path = dir.join(format!("{prefix}-{:02}.toml", i + 1));
        let text = format!(
            "# {} (search row {}): parsim estimate --config {}\n{}",
            r.label,
            i + 1,
            path.display(),
            r.estimate.config.to_toml()
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
