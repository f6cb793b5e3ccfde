//! `parsim schedule` end to end: the JSON shape, written files, and clear errors with a
//! nonzero exit (never a panic) on bad input.

use assert_cmd::cargo::cargo_bin_cmd;
use predicates::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn json_has_exactly_the_documented_shape() {
    let out = cargo_bin_cmd!("parsim")
        .args(["schedule", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        keys(&doc),
        set(&[
            "schedule",
            "pp",
            "vpp",
            "microbatches",
            "makespan",
            "bubble_fraction",
            "ranks"
        ])
    );
    // the default: pp 4, vpp 2, 8 microbatches, interleaved-1f1b
    assert_eq!(doc["schedule"], "interleaved-1f1b");
    assert_eq!(doc["pp"], 4);
    assert_eq!(doc["vpp"], 2);
    assert_eq!(doc["microbatches"], 8);
    assert!(doc["makespan"].as_f64().unwrap() > 0.0);
    let ranks = doc["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    let mut total = 0;
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(keys(rank), set(&["rank", "peak_inflight", "actions"]));
        assert_eq!(rank["rank"], r);
        for a in rank["actions"].as_array().unwrap() {
            assert_eq!(
                keys(a),
                set(&["kind", "stage", "microbatch", "start", "end"])
            );
            assert!(["F", "B", "I", "W"].contains(&a["kind"].as_str().unwrap()));
            assert!(
                a["microbatch"].as_u64().unwrap() < 8,
                "0-based microbatches"
            );
            let stage = a["stage"].as_u64().unwrap();
            assert!(stage < 8);
            assert_eq!(stage % 4, r as u64, "interleaved: stage s on rank s mod pp");
            assert!(a["end"].as_f64().unwrap() >= a["start"].as_f64().unwrap());
            total += 1;
        }
    }
    // one F and one B per (microbatch, stage): 2 * 8 * 8
    assert_eq!(total, 128);
}

#[test]
fn dualpipe_json_has_split_backwards_and_shared_slot_starts() {
    let out = cargo_bin_cmd!("parsim")
        .args(["schedule", "--schedule", "dualpipe-v", "--json", "--w", "1"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    let kinds: BTreeSet<String> = doc["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["actions"].as_array().unwrap().clone())
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, set(&["F", "B", "I", "W"]));
    // an overlapped slot: an F immediately followed by a B with the same start
    let acts = doc["ranks"][0]["actions"].as_array().unwrap();
    assert!(acts
        .windows(2)
        .any(|w| w[0]["kind"] == "F" && w[1]["kind"] == "B" && w[0]["start"] == w[1]["start"]));
}

#[test]
fn compare_prints_a_table_and_json_array() {
    cargo_bin_cmd!("parsim")
        .args([
            "schedule",
            "--compare",
            "1f1b,interleaved-1f1b,zb-h1,zb-v,dualpipe-v",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("dualpipe-v").and(predicate::str::contains("makespan")));
    let out = cargo_bin_cmd!("parsim")
        .args(["schedule", "--compare", "1f1b,zb-v", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(doc.as_array().unwrap().len(), 2);
}

#[test]
fn files_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("a.png");
    let svg = dir.path().join("a.svg");
    let trace = dir.path().join("a.json");
    cargo_bin_cmd!("parsim")
        .args(["schedule", "--size", "900x300", "--png"])
        .arg(&png)
        .arg("--svg")
        .arg(&svg)
        .arg("--chrome-trace")
        .arg(&trace)
        .assert()
        .success();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 900);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 300);
    assert!(std::fs::metadata(&svg).unwrap().len() > 1000);
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(!t["traceEvents"].as_array().unwrap().is_empty());
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let out = cargo_bin_cmd!("parsim")
        .arg("schedule")
        .args(args)
        .assert()
        .failure()
        .get_output()
        .clone();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: missing '{n}' in: {stderr}");
    }
}

#[test]
fn bad_inputs_give_clear_errors() {
    // Megatron: microbatches must be a multiple of pp with the default group size
    fails_with(
        &[
            "--schedule",
            "interleaved-1f1b",
            "--pp",
            "4",
            "--microbatches",
            "6",
        ],
        &["parallel.pp", "microbatches", "multiple"],
    );
    fails_with(
        &["--schedule", "zb-v", "--vpp", "3"],
        &["parallel.vpp", "2"],
    );
    fails_with(
        &["--schedule", "1f1b", "--vpp", "2"],
        &["parallel.vpp", "1"],
    );
    fails_with(
        &[
            "--schedule",
            "dualpipe-v",
            "--pp",
            "4",
            "--microbatches",
            "6",
        ],
        &["2 * pp", "microbatches"],
    );
    fails_with(&["--pp", "0"], &["parallel.pp"]);
    fails_with(&["--f=-1"], &["non-negative"]);
    fails_with(&["--schedule", "zero-bubble"], &["unknown value"]);
    fails_with(&["--size", "12"], &["WIDTHxHEIGHT"]);
}

/// `--config FILE --compare A,B` runs each schedule on the file's configuration with the
/// engine's stage costs; each row equals `--config` on a file that sets that schedule (and
/// the chunks per rank it takes).
#[test]
fn config_compares_schedules_on_its_own_costs() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string("tests/fixtures/executor_small.toml").unwrap();
    let out = cargo_bin_cmd!("parsim")
        .args([
            "schedule",
            "--config",
            "tests/fixtures/executor_small.toml",
            "--compare",
            "1f1b,zb-v",
            "--json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let docs: Value = serde_json::from_slice(&out).unwrap();
    let docs = docs.as_array().unwrap();
    assert_eq!(docs.len(), 2);
    for (doc, (schedule, vpp)) in docs.iter().zip([("1f1b", 1), ("zb-v", 2)]) {
        let file = dir.path().join(format!("{schedule}.toml"));
        let mut table: toml::Table = base.parse().unwrap();
        let par = table
            .entry("parallel")
            .or_insert(toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap();
        par.insert("schedule".into(), toml::Value::String(schedule.into()));
        par.insert("vpp".into(), toml::Value::Integer(vpp));
        std::fs::write(&file, toml::to_string(&table).unwrap()).unwrap();
        let one = cargo_bin_cmd!("parsim")
            .args(["schedule", "--config", file.to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        let alone: Value = serde_json::from_slice(&one.stdout).unwrap();
        assert_eq!(doc["schedule"], schedule);
        assert_eq!(doc["makespan"], alone["makespan"], "{schedule}");
    }
}
