//! Snapshots of the CLI's human (non-JSON) output: the whole text of each command is compared
//! with the `.snap` file under `tests/snapshots/`, so a change to any table, line or figure
//! shows up as a reviewable diff (`cargo insta review`, or `INSTA_UPDATE=always cargo test
//! --test cli` to accept every change at once).
//!
//! Timings, rates and paths differ between runs and machines: [`cli_snapshot!`] replaces them
//! with placeholders before comparing.

use assert_cmd::cargo::cargo_bin_cmd;

/// Runs `parsim ARGS` and returns its exit code, stdout and stderr as one text.
fn run(args: &[&str]) -> String {
    let out = cargo_bin_cmd!("parsim")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("the parsim binary runs");
    format!(
        "args: parsim {}\nexit: {}\n----- stdout -----\n{}----- stderr -----\n{}",
        args.join(" "),
        out.status.code().map_or("signal".into(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    )
}

/// Filters for what changes from run to run: elapsed times and rates, and paths.
fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    s.set_snapshot_path("../snapshots");
    s.add_filter(
        r"in \d+(\.\d+)? s \(\d+ candidates/s\)",
        "in [ELAPSED] s ([RATE] candidates/s)",
    );
    s.add_filter(&regex_escape(env!("CARGO_MANIFEST_DIR")), "[ROOT]");
    s.add_filter(r"(/tmp|/var/folders)/[^\s:]+", "[TEMP]");
    s
}

/// `text` with the regex metacharacters escaped (for a literal path filter).
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Snapshots the output of `parsim ARGS...` as `NAME`, with [`settings`]' filters.
macro_rules! cli_snapshot {
    ($name:expr, [$($arg:expr),* $(,)?]) => {{
        let text = run(&[$($arg),*]);
        settings().bind(|| insta::assert_snapshot!($name, text));
    }};
}

#[test]
fn estimate_default() {
    cli_snapshot!("estimate_default", ["estimate"]);
}

#[test]
fn estimate_pipeline_interleaved() {
    cli_snapshot!(
        "estimate_pipeline_interleaved",
        [
            "estimate",
            "--gpus",
            "32",
            "--tp",
            "4",
            "--pp",
            "4",
            "--vpp",
            "2",
            "--schedule",
            "interleaved-1f1b",
            "--gbs",
            "64"
        ]
    );
}

#[test]
fn estimate_moe_expert_parallel() {
    cli_snapshot!(
        "estimate_moe_expert_parallel",
        [
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "2",
            "--pp",
            "4",
            "--ep",
            "8",
            "--gbs",
            "64"
        ]
    );
}

#[test]
fn estimate_context_parallel() {
    cli_snapshot!(
        "estimate_context_parallel",
        [
            "estimate",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--cp",
            "2",
            "--cp-comm",
            "zigzag",
            "--seq",
            "32768",
            "--gbs",
            "16"
        ]
    );
}

#[test]
fn estimate_validation_error() {
    cli_snapshot!("estimate_validation_error", ["estimate", "--tp", "3"]);
}

#[test]
fn layout_groups() {
    cli_snapshot!(
        "layout_groups",
        ["layout", "--tp", "8", "--cp", "2", "--gpus", "16", "--gbs", "1"]
    );
}

#[test]
fn layout_one_rank() {
    cli_snapshot!(
        "layout_one_rank",
        ["layout", "--tp", "2", "--pp", "2", "--gpus", "16", "--gbs", "8", "--rank", "5"]
    );
}

#[test]
fn schedule_ascii() {
    cli_snapshot!("schedule_ascii", ["schedule"]);
}

#[test]
fn schedule_compare_table() {
    cli_snapshot!(
        "schedule_compare_table",
        [
            "schedule",
            "--compare",
            "1f1b,interleaved-1f1b,zb-h1,zb-v,dualpipe-v"
        ]
    );
}

#[test]
fn search_small() {
    // Exhaustive, so the counts do not depend on which thread finds the leaders first.
    cli_snapshot!(
        "search_small",
        [
            "search",
            "--gpus",
            "8",
            "--gbs",
            "64",
            "--seq",
            "4096",
            "--mbs-max",
            "2",
            "--top",
            "3",
            "--exhaustive"
        ]
    );
}

#[test]
fn filters_hide_timings_and_paths() {
    let text = format!(
        "{} in 0.81 s (8988 candidates/s) {}/tests",
        "7308 candidates",
        env!("CARGO_MANIFEST_DIR")
    );
    settings().bind(|| {
        insta::assert_snapshot!(
            text,
            @"7308 candidates in [ELAPSED] s ([RATE] candidates/s) [ROOT]/tests"
        );
    });
}
