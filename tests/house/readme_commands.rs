//! Every command the README (and docs/planning.md and docs/calibration.md) shows runs as written:
//! each line of a ```sh block that starts with `cargo run --release -- ` (with its `\`
//! continuation lines) runs with this build's `parsim` binary in place of `cargo run --release
//! --`, in a scratch directory whose entries link to the repository's, so written files
//! (`--png schedules.png`, `> parsim.1`) land in the scratch directory. A command passes when it
//! exits 0, or N where its line ends with a comment `# exits N`. Each document is its own test
//! with its own scratch directory (so the documents run in parallel); its commands run in order
//! there, so one may read what an earlier one of the same document wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const PREFIX: &str = "cargo run --release -- ";
const DOCUMENTS: &[&str] = &["README.md", "docs/planning.md", "docs/calibration.md"];

/// One documented command: where it is, its words, redirections and expected exit code.
#[derive(Debug)]
struct DocCommand {
    origin: String,
    text: String,
    args: Vec<String>,
    stdin: Option<String>,
    stdout: Option<String>,
    exit_code: i32,
}

/// The commands of one Markdown document's ```sh blocks, in order.
fn commands(doc: &str, text: &str) -> Vec<DocCommand> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = !in_sh && trimmed == "```sh";
            continue;
        }
        if !in_sh || !trimmed.starts_with(PREFIX) {
            continue;
        }
        let mut joined = String::new();
        let mut current = trimmed.to_string();
        while let Some(head) = current.strip_suffix('\\') {
            joined.push_str(head);
            joined.push(' ');
            current = lines
                .next()
                .map_or_else(String::new, |(_, l)| l.trim().to_string());
        }
        joined.push_str(&current);
        out.push(parse(&format!("{doc}:{}", i + 1), &joined));
    }
    out
}

/// Splits a command line into words (single and double quotes, a trailing `# comment`,
/// `< FILE` and `> FILE`).
fn parse(origin: &str, line: &str) -> DocCommand {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut comment = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => {
                comment = chars.by_ref().collect();
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '|' | ';' | '&' | '$' | '`') => {
                panic!("{origin}: the README test does not run shell syntax '{c}': {line}")
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    let words: Vec<String> = words[PREFIX.split_whitespace().count()..].to_vec();
    let mut args = Vec::new();
    let (mut stdin, mut stdout) = (None, None);
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "<" => stdin = it.next(),
            ">" => stdout = it.next(),
            _ => args.push(w),
        }
    }
    let exit_code = comment
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[0] == "exits" || w[0] == "exit")
        .and_then(|w| {
            w[1].trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .unwrap_or(0);
    DocCommand {
        origin: origin.to_string(),
        text: line.to_string(),
        args,
        stdin,
        stdout,
        exit_code,
    }
}

/// A scratch directory with a link to every top-level entry of the repository but the build
/// output, so relative paths resolve and nothing is written into the repository.
fn scratch(repo: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        link(&entry.path(), &dir.path().join(&name));
    }
    dir
}

#[cfg(unix)]
fn link(from: &Path, to: &Path) {
    std::os::unix::fs::symlink(from, to).unwrap();
}

#[cfg(not(unix))]
fn link(from: &Path, to: &Path) {
    if from.is_file() {
        std::fs::copy(from, to).unwrap();
    }
}

fn run(cmd: &DocCommand, dir: &Path) -> Result<(), String> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_parsim"));
    c.args(&cmd.args).current_dir(dir).stderr(Stdio::piped());
    c.stdin(match &cmd.stdin {
        Some(f) => Stdio::from(std::fs::File::open(dir.join(f)).map_err(|e| e.to_string())?),
        None => Stdio::null(),
    });
    c.stdout(match &cmd.stdout {
        Some(f) => Stdio::from(std::fs::File::create(dir.join(f)).map_err(|e| e.to_string())?),
        None => Stdio::null(),
    });
    let out = c.output().map_err(|e| e.to_string())?;
    match out.status.code() {
        Some(code) if code == cmd.exit_code => Ok(()),
        code => Err(format!(
            "{}: `{}` exited {code:?}, expected {}\n{}",
            cmd.origin,
            cmd.text,
            cmd.exit_code,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// Runs one document's commands in order in a scratch directory of its own (documents run as
/// separate tests, so in parallel; a command reads only what an earlier one of its own document
/// wrote). Returns the scratch directory and how many commands ran.
fn run_document(doc: &str) -> (tempfile::TempDir, usize) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = scratch(&repo);
    let text = std::fs::read_to_string(repo.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let cmds = commands(doc, &text);
    let failures: Vec<String> = cmds
        .iter()
        .filter_map(|cmd| run(cmd, dir.path()).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    (dir, cmds.len())
}

#[test]
fn every_readme_command_runs_as_written() {
    let (dir, count) = run_document(DOCUMENTS[0]);
    assert!(count >= 10, "only {count} commands found in the README");
    assert!(
        dir.path().join("schedules.png").is_file(),
        "the schedule example writes its PNG in the scratch directory"
    );
}

#[test]
fn every_planning_guide_command_runs_as_written() {
    let (_dir, count) = run_document(DOCUMENTS[1]);
    assert!(
        count >= 10,
        "only {count} commands found in {}",
        DOCUMENTS[1]
    );
}

#[test]
fn every_calibration_guide_command_runs_as_written() {
    let (_dir, count) = run_document(DOCUMENTS[2]);
    assert!(
        count >= 3,
        "only {count} commands found in {}",
        DOCUMENTS[2]
    );
}

#[test]
fn commands_are_extracted_with_continuations_comments_and_exit_codes() {
    let md =
        "```sh\n# a comment\ncargo run --release -- estimate --tp 2 \\\n    --pp 2   # two lines\n\
              cargo run --release -- man > parsim.1\ncargo test\n\
              cargo run --release -- estimate --gpus 1 --tp 8  # exits 2\n```\n\
              ```text\ncargo run --release -- not-run\n```\n";
    let cmds = commands("x.md", md);
    assert_eq!(cmds.len(), 3);
    assert_eq!(cmds[0].args, ["estimate", "--tp", "2", "--pp", "2"]);
    assert_eq!(cmds[0].origin, "x.md:3");
    assert_eq!(cmds[1].args, ["man"]);
    assert_eq!(cmds[1].stdout.as_deref(), Some("parsim.1"));
    assert_eq!((cmds[0].exit_code, cmds[2].exit_code), (0, 2));
}
