//! Search answers a user can act on: every row's printed `parsim estimate` command, run as
//! printed, gives the row's step time to the bit (dense, context-parallel, uneven pipeline and
//! MoE searches); the CSV and JSON carry the command and the pipeline split; the table shows a
//! token budget's run; the ranking says when the model does not tell its rows apart; and only
//! the schedules the framework runs are offered.

use assert_cmd::cargo::cargo_bin_cmd;

/// Llama-3-70B on 64 H100s, 128 sequences of 8,192 a step: a planner's first search.
const LLAMA3_70B_64: [&str; 8] = [
    "--model",
    "llama3-70b",
    "--gpus",
    "64",
    "--seq",
    "8192",
    "--gbs",
    "128",
];

/// `head`, the 70B workload, then `tail`.
fn with_70b<'a>(head: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    [head, &LLAMA3_70B_64[..], tail].concat()
}

fn parsim(args: &[&str]) -> std::process::Output {
    cargo_bin_cmd!("parsim").args(args).output().unwrap()
}

fn stdout(args: &[&str]) -> String {
    let out = parsim(args);
    assert!(
        out.status.success(),
        "parsim {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The words of a printed command (the shell's single quotes undone).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut w = String::new();
    let mut quoted = false;
    let mut in_word = false;
    for c in command.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            ' ' if !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut w));
                }
                in_word = false;
            }
            c => {
                w.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(w);
    }
    out
}

/// The fields of one CSV line (RFC 4180 quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut f = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                f.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut f)),
            c => f.push(c),
        }
    }
    out.push(f);
    out
}

/// Runs every row's command of `search ARGS --json` and compares its step time's bits.
fn every_command_reproduces(args: &[&str]) -> usize {
    let mut full = vec!["search"];
    full.extend_from_slice(args);
    full.push("--json");
    let v: serde_json::Value = serde_json::from_str(&stdout(&full)).unwrap();
    let mut rows = 0;
    for list in ["top", "best_per_schedule", "best_per_zero"] {
        for r in v[list].as_array().unwrap() {
            let command = r["command"]
                .as_str()
                .expect("every row carries its command");
            let w = words(command);
            assert_eq!(&w[..2], ["parsim", "estimate"], "{command}");
            let mut run: Vec<&str> = w[1..].iter().map(String::as_str).collect();
            run.push("--json");
            let e: serde_json::Value = serde_json::from_str(&stdout(&run)).unwrap();
            let (want, got) = (
                r["time"]["step_s"].as_f64().unwrap(),
                e["time"]["step_s"].as_f64().unwrap(),
            );
            assert_eq!(want.to_bits(), got.to_bits(), "{}: {command}", r["label"]);
            rows += 1;
        }
    }
    rows
}

#[test]
fn dense_rows_reproduce_to_the_bit() {
    let n = every_command_reproduces(&[
        "--model",
        "llama3-8b",
        "--gpus",
        "16",
        "--seq",
        "4096",
        "--gbs",
        "64",
        "--top",
        "4",
    ]);
    assert!(n >= 4);
}

#[test]
fn context_parallel_rows_reproduce_to_the_bit() {
    // The search's cp exchange (a2a, zigzag) is not the estimate's default (p2p): the command
    // names it.
    let n = every_command_reproduces(&[
        "--model",
        "llama3-8b",
        "--gpus",
        "16",
        "--seq",
        "32768",
        "--gbs",
        "16",
        "--top",
        "4",
        "--constraint",
        "cp>=2",
    ]);
    assert!(n >= 4);
}

#[test]
fn uneven_pipeline_rows_reproduce_to_the_bit() {
    // Llama-3-70B's 80 layers over pp 8 with short ends: the middle stages differ by a layer,
    // which only an explicit --pipeline-layout gives (first/last stage layers are refused).
    let args = with_70b(
        &[],
        &[
            "--top",
            "6",
            "--constraint",
            "pp=8",
            "--constraint",
            "vpp=1",
            "--all-schedules",
        ],
    );
    let full = [&["search"][..], &args, &["--json"]].concat();
    let v: serde_json::Value = serde_json::from_str(&stdout(&full)).unwrap();
    assert!(
        v["top"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["command"].as_str().unwrap().contains("--pipeline-layout")),
        "an uneven split among the rows"
    );
    assert!(every_command_reproduces(&args) >= 6);
}

#[test]
fn moe_rows_reproduce_to_the_bit() {
    let n = every_command_reproduces(&[
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "32",
        "--seq",
        "4096",
        "--gbs",
        "128",
        "--top",
        "4",
        "--constraint",
        "ep>=2",
    ]);
    assert!(n >= 4);
}

/// A framework whose overlap defaults depend on the ZeRO stage (DeepSpeed overlaps only at
/// stage 3): the command writes the switches the row was evaluated with.
#[test]
fn deepspeed_rows_reproduce_to_the_bit() {
    every_command_reproduces(&[
        "--model",
        "llama3-8b",
        "--gpus",
        "16",
        "--seq",
        "4096",
        "--gbs",
        "64",
        "--top",
        "4",
        "--framework",
        "deepspeed",
    ]);
}

/// The CSV carries each row's command and its pipeline split as the configuration holds it;
/// the label names DP and each stage's layers; `--write-configs` writes configurations that
/// `estimate --config` reads back to the same step time.
#[test]
fn csv_carries_the_command_and_the_split_and_configs_read_back() {
    let args = with_70b(
        &["search"],
        &[
            "--top",
            "3",
            "--constraint",
            "pp=8",
            "--constraint",
            "vpp=1",
            "--all-schedules",
        ],
    );
    let mut csv_args = args.clone();
    csv_args.push("--csv");
    let csv = stdout(&csv_args);
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in ["command", "pipeline_layout", "first_stage_layers", "dp"] {
        assert!(header.contains(&col), "{col} in {header:?}");
    }
    let at = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let rows: Vec<Vec<String>> = lines.map(csv_fields).collect();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{r:?}");
        assert!(r[at("command")].starts_with("parsim estimate"), "{r:?}");
        // The split is in the CSV: an explicit layout where the command has one.
        let layout = &r[at("pipeline_layout")];
        assert_eq!(
            !layout.is_empty(),
            r[at("command")].contains("--pipeline-layout"),
            "{r:?}"
        );
    }
    assert!(rows.iter().any(|r| !r[at("pipeline_layout")].is_empty()));

    let dir = tempfile::tempdir().unwrap();
    let mut write = args.clone();
    let d = dir.path().to_str().unwrap();
    write.extend(["--json", "--write-configs", d]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&write)).unwrap();
    for (i, r) in v["top"].as_array().unwrap().iter().enumerate() {
        let label = r["label"].as_str().unwrap();
        let dp = r["config"]["parallel"]["dp"].as_u64().unwrap();
        assert!(
            label.contains(&format!(" dp{dp} ")) && label.contains("recompute="),
            "{label}"
        );
        let file = dir.path().join(format!("rank-{:02}.toml", i + 1));
        let e: serde_json::Value = serde_json::from_str(&stdout(&[
            "estimate",
            "--config",
            file.to_str().unwrap(),
            "--json",
        ]))
        .unwrap();
        assert_eq!(
            e["time"]["step_s"].as_f64().unwrap().to_bits(),
            r["time"]["step_s"].as_f64().unwrap().to_bits(),
            "{label}"
        );
    }
}

/// `--train-tokens` without `--objective` shows each row's run (wall days, cost) in the table,
/// the total as 2T, and no note on stderr.
#[test]
fn a_token_budget_shows_the_run_beside_each_row() {
    let out = parsim(&[
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--seq",
        "4096",
        "--gbs",
        "32",
        "--top",
        "3",
        "--train-tokens",
        "2T",
        "--gpu-hour-price",
        "2",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("2T tokens") && !text.contains("2000000000000"),
        "{text}"
    );
    assert!(
        text.contains("wall days") && text.contains("cost $"),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).is_empty());
    // The first row's wall days: the same as its own estimate's run section.
    let v: serde_json::Value = serde_json::from_str(&stdout(&[
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--seq",
        "4096",
        "--gbs",
        "32",
        "--top",
        "1",
        "--train-tokens",
        "2T",
        "--gpu-hour-price",
        "2",
        "--json",
    ]))
    .unwrap();
    let command = v["top"][0]["command"].as_str().unwrap().to_string();
    let w = words(&command);
    let mut run: Vec<&str> = w[1..].iter().map(String::as_str).collect();
    run.push("--json");
    let e: serde_json::Value = serde_json::from_str(&stdout(&run)).unwrap();
    let days = format!("{:.2}", e["run"]["wall_days"].as_f64().unwrap());
    assert!(text.contains(&days), "{days} in {text}");
}

/// When the rows after #1 lie inside #1's step-time interval, the text says the model does
/// not tell them apart, naming how many (counted here from the JSON figures).
#[test]
fn a_ranking_inside_the_models_error_says_so() {
    let args = with_70b(&["search"], &["--top", "8"]);
    let mut j = args.clone();
    j.push("--json");
    let v: serde_json::Value = serde_json::from_str(&stdout(&j)).unwrap();
    let top = v["top"].as_array().unwrap();
    let p90 = top[0]["time"]["step_s_p90"].as_f64().unwrap();
    let inside = top
        .iter()
        .take_while(|r| r["time"]["step_s"].as_f64().unwrap() <= p90)
        .count();
    assert!(inside >= 2, "the case has rows inside the band");
    let text = stdout(&args);
    let rows = if inside == top.len() {
        format!("all {inside} mixes listed")
    } else {
        format!("#1 to #{inside}")
    };
    assert!(
        text.contains(&format!("note: {rows} lie within"))
            && text.contains("does not tell them apart"),
        "{text}"
    );
}

/// Megatron-Core runs 1F1B and interleaved 1F1B only (Megatron-LM's get_forward_backward_func):
/// its search offers no other schedule and says which framework runs them; FSDP's
/// (torch.distributed.pipelining) offers all.
#[test]
fn only_the_frameworks_schedules_are_offered() {
    let base = with_70b(&["search"], &["--top", "10", "--json"]);
    let schedules = |extra: &[&str]| -> Vec<String> {
        let mut a = base.clone();
        a.extend_from_slice(extra);
        let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
        ["top", "best_per_schedule", "best_per_zero"]
            .iter()
            .flat_map(|l| v[*l].as_array().unwrap().clone())
            .filter(|r| r["config"]["parallel"]["pp"].as_u64() > Some(1))
            .map(|r| {
                r["config"]["parallel"]["schedule"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let megatron = schedules(&[]);
    assert!(!megatron.is_empty());
    assert!(
        megatron
            .iter()
            .all(|s| s == "1f1b" || s == "interleaved-1f1b"),
        "{megatron:?}"
    );
    let all = schedules(&["--all-schedules"]);
    assert!(
        all.iter().any(|s| s.starts_with("zb") || s == "dualpipe-v"),
        "{all:?}"
    );
    let text = stdout(&base[..base.len() - 1]);
    assert!(
        text.contains("gpipe, zb-h1, zb-v, dualpipe-v need --framework fsdp"),
        "{text}"
    );
}
