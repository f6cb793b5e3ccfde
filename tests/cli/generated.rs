//! What clap generates: shell completions, the man page, and defaults shown in `--help`.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;

fn parsim() -> assert_cmd::Command {
    cargo_bin_cmd!("parsim")
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        parsim()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(
                predicate::str::contains("estimate").and(predicate::str::contains("megatron-args")),
            );
    }
}

#[test]
fn man_page_is_roff() {
    parsim()
        .arg("man")
        .assert()
        .success()
        .stdout(predicate::str::contains(".TH").and(predicate::str::contains("estimate")));
}

#[test]
fn help_shows_defaults() {
    parsim()
        .args(["estimate", "--help"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("[default from config: 8]")
                .and(predicate::str::contains("[default from config: 8192]")),
        );
}

/// `--help` lists what the engine's registries hold: every shipped GPU profile and every model
/// preset (derived from them, so a new one shows without touching the CLI).
#[test]
fn help_lists_every_profile_and_preset() {
    let out = parsim().args(["estimate", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for name in parsim::config::GpuProfile::shipped_names() {
        assert!(
            help.contains(name),
            "--help lacks the profile {name}:\n{help}"
        );
    }
    for name in parsim::config::presets::PRESET_NAMES {
        assert!(
            help.contains(name),
            "--help lacks the preset {name}:\n{help}"
        );
    }
}
