//! Megatron-LM (and NeMo's Megatron) launch import: a command line or launch script becomes one
//! override layer shaped like a configuration file, so it merges and validates like any other
//! source. [`to_megatron_args`] writes the reverse.
//!
//! The script describes the whole run, so where Megatron has a default that differs from
//! parsim's (tp 1, no sequence parallelism, fp32 without `--bf16`, no recompute, no distributed
//! optimizer, no overlaps), the layer carries Megatron's. Model fields Megatron defaults
//! (GeLU, LayerNorm, learned positions, biases, tied embeddings, dropout 0.1, padding to 128)
//! are set only when the script gives the model's shape (`--num-layers` or `--hidden-size`).
//! Every flag that has no counterpart is named in [`MegatronImport::ignored`].

mod flag_table;
mod flags;
mod nemo;
mod optimizer_state;
mod precision;
mod print;
mod sharding;
mod shell;
mod values;

pub use print::to_megatron_args;

use super::error::ConfigError;
use serde_json::{Map, Value};

/// The result of reading a launch: the override layer and what did not carry over.
#[derive(Debug, Clone, PartialEq)]
pub struct MegatronImport {
    /// An override layer (`{"model": {...}, "parallel": {...}, ...}`).
    pub layer: Value,
    /// Flags with no counterpart in parsim, as written (e.g. `--lr`).
    pub ignored: Vec<String>,
    /// Variables and substitutions the script does not resolve (e.g. `$NUM_NODES`).
    pub unresolved: Vec<String>,
    /// Approximations and values taken from elsewhere, one sentence each.
    pub notes: Vec<String>,
}

impl MegatronImport {
    /// One warning line per kind of loss (empty when everything carried over).
    pub fn warnings(&self) -> Vec<String> {
        let what = "Megatron flag(s) with no parsim counterpart";
        let mut out: Vec<String> = super::import::listed("ignored", what, &self.ignored)
            .into_iter()
            .collect();
        if !self.unresolved.is_empty() {
            out.push(format!(
                "could not resolve {} (set them in the script or pass the values as flags)",
                self.unresolved.join(", ")
            ));
        }
        out.extend(self.notes.iter().cloned());
        out
    }
}

/// Reads a Megatron-LM launch: a script (`torchrun ... pretrain_gpt.py ARGS`, evaluated as
/// bash runs it: variables, arrays and appends, conditions, loops, functions;
/// [`shell`]) or a bare argument list; NeMo's Hydra overrides
/// (`model.tensor_model_parallel_size=2`, `trainer.devices=8`) are read as the Megatron flags
/// they configure. `origin` names it in errors.
pub fn import(text: &str, origin: &str) -> Result<MegatronImport, ConfigError> {
    let script = shell::parse(text);
    let (mut launcher, mut args) = pick_command(&script.commands);
    let mut var_notes = Vec::new();
    if !args.iter().any(|a| a.text.starts_with("--")) {
        // A file that only sets variables (Megatron-LM's examples/post_training/modelopt/conf/
        // files: `MODEL_ARGS="..."`, run by a launcher elsewhere): its `*ARGS` variables are
        // the arguments, in the order they are set.
        let (from_vars, names) = args_from_variables(&script.assignments);
        if !from_vars.is_empty() {
            var_notes.push(format!(
                "no training command: the arguments are the variables {}",
                names.join(", ")
            ));
            args = from_vars.into_iter().map(plain_arg).collect();
            // The tokenizer such a file names in a variable (the modelopt conf files'
            // TOKENIZER_MODEL), for the vocabulary.
            if !args.iter().any(|a| a.text == "--tokenizer-model") {
                let tokenizer = script
                    .assignments
                    .iter()
                    .rev()
                    .find(|(n, v)| n == "TOKENIZER_MODEL" && v.len() == 1)
                    .map(|(_, v)| v[0].clone());
                if let Some(t) = tokenizer {
                    args.push(plain_arg("--tokenizer-model".into()));
                    args.push(plain_arg(t));
                }
            }
        }
    }
    var_notes.extend(script.notes.iter().cloned());
    var_notes.extend(environment_notes(&args));
    let args: Vec<String> = args.into_iter().map(|a| a.text).collect();
    // What the training command's words hold unresolved (not a `mkdir "$(dirname ...)"`).
    let mut unresolved = script.unresolved;
    unresolved.retain(|u| launcher.iter().chain(&args).any(|w| w.contains(u.as_str())));
    unresolved.sort();
    unresolved.dedup();
    let nemo = nemo::take_overrides(&args);
    launcher.extend(nemo.launcher);
    let mut state = flags::State::default();
    state.launcher(&launcher);
    for (flag, values) in split_flags(&nemo.rest).into_iter().chain(nemo.flags) {
        state
            .apply(&flag, &values)
            .map_err(|message| ConfigError::Import {
                origin: origin.to_string(),
                message: format!("{flag}: {message}"),
            })?;
    }
    let finished = state.finish().map_err(|message| ConfigError::Import {
        origin: origin.to_string(),
        message,
    })?;
    var_notes.extend(finished.notes);
    Ok(MegatronImport {
        layer: finished.layer,
        ignored: finished.ignored,
        unresolved,
        notes: var_notes,
    })
}

/// Reads a list of Megatron-LM flags (`("--num-layers", ["32"])`) as a launch of them would
/// be read: the other imports that speak Megatron-Core's field names (Megatron-Bridge's
/// configuration) reuse the flags' mapping. The error of a flag names it; `flag_error` turns
/// it into the caller's error, given the flag and the message.
pub(crate) fn import_flags<E>(
    flags: &[(String, Vec<String>)],
    flag_error: impl Fn(&str, String) -> E,
    finish_error: impl Fn(String) -> E,
) -> Result<MegatronImport, E> {
    let mut state = flags::State::default();
    for (flag, values) in flags {
        state
            .apply(flag, values)
            .map_err(|message| flag_error(flag, message))?;
    }
    let finished = state.finish().map_err(finish_error)?;
    Ok(MegatronImport {
        layer: finished.layer,
        ignored: finished.ignored,
        unresolved: Vec::new(),
        notes: finished.notes,
    })
}

/// True when the Megatron import reads `flag` (spelled with dashes) or refuses it by name.
#[cfg(test)]
pub(crate) fn knows_flag(flag: &str) -> bool {
    flags::reads(flag) || flag_table::REFUSED.iter().any(|(f, _)| *f == flag)
}

fn plain_arg(text: String) -> shell::Arg {
    shell::Arg {
        text,
        env: Default::default(),
    }
}

/// One note per flag the import reads whose value came from a variable the script does not
/// set (its default, or the environment) or from the script's own arguments.
fn environment_notes(args: &[shell::Arg]) -> Vec<String> {
    let mut notes = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let (flag, inline) = match a.text.split_once('=') {
            Some((f, _)) if f.starts_with("--") => (f.to_string(), true),
            _ => (a.text.clone(), false),
        };
        i += 1;
        if !flag.starts_with("--") {
            if nemo::is_override(&a.text) && !a.env.is_empty() {
                notes.push(format!(
                    "{}: read from {}",
                    a.text,
                    shell::describe_env(&a.env)
                ));
            }
            continue;
        }
        let mut env = if inline {
            a.env.clone()
        } else {
            Default::default()
        };
        let mut values = Vec::new();
        while !inline && i < args.len() && !args[i].text.starts_with("--") {
            env.extend(args[i].env.iter().cloned());
            values.push(args[i].text.as_str());
            i += 1;
        }
        if !env.is_empty() && flags::reads(&flag.replace('_', "-")) {
            let shown = if inline {
                a.text.clone()
            } else {
                format!("{flag} {}", values.join(" "))
            };
            notes.push(format!(
                "{}: read from {}",
                shown.trim_end(),
                shell::describe_env(&env)
            ));
        }
    }
    notes
}

/// The words of the variables named `*ARGS` that hold `--flags`, in the order they are set
/// (a variable set twice counts at its last setting), and their names.
fn args_from_variables(assignments: &[(String, Vec<String>)]) -> (Vec<String>, Vec<String>) {
    let mut chosen: Vec<(String, Vec<String>)> = Vec::new();
    for (name, words) in assignments {
        if name.ends_with("ARGS") && words.iter().any(|w| w.starts_with("--")) {
            chosen.retain(|(n, _)| n != name);
            chosen.push((name.clone(), words.clone()));
        }
    }
    let names = chosen.iter().map(|(n, _)| n.clone()).collect();
    (chosen.into_iter().flat_map(|(_, w)| w).collect(), names)
}

/// The launcher words (before the training script) and the training script's arguments. The
/// training script is the last `pretrain*.py` (else any `*.py`) command; without one, every
/// word from the first `--flag` or Hydra override on is an argument.
fn pick_command(commands: &[Vec<shell::Arg>]) -> (Vec<String>, Vec<shell::Arg>) {
    let find = |pred: &dyn Fn(&str) -> bool| {
        commands.iter().rev().find_map(|words| {
            let i = words.iter().position(|w| pred(&w.text))?;
            let launcher = words[..i].iter().map(|w| w.text.clone()).collect();
            Some((launcher, words[i + 1..].to_vec()))
        })
    };
    let file_name = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
    if let Some(found) = find(&|w| {
        let name = file_name(w);
        name.starts_with("pretrain") && name.ends_with(".py")
    }) {
        return found;
    }
    if let Some(found) = find(&|w| w.ends_with(".py")) {
        return found;
    }
    let all: Vec<shell::Arg> = commands.iter().flatten().cloned().collect();
    let start = all.iter().position(|w| {
        w.text.starts_with("--") || w.text.starts_with("model.") || w.text.starts_with("trainer.")
    });
    (
        Vec::new(),
        start.map_or_else(Vec::new, |i| all[i..].to_vec()),
    )
}

/// Splits arguments into `(--flag, values)`; `--flag=value` is accepted.
fn split_flags(args: &[String]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for arg in args {
        if arg.starts_with("--") {
            match arg.split_once('=') {
                Some((f, v)) => out.push((f.to_string(), vec![v.to_string()])),
                None => out.push((arg.clone(), Vec::new())),
            }
        } else if let Some((_, values)) = out.last_mut() {
            values.push(arg.clone());
        }
    }
    out
}

/// Puts `value` at `section.key` of the layer `m`.
pub(crate) fn put(m: &mut Map<String, Value>, section: &str, key: &str, value: Value) {
    let sec = m
        .entry(section)
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(sec) = sec {
        sec.insert(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests;
