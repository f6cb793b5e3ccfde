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
