//! When no mix fits, search names what removed the last candidates, one test per kind of
//! filter: a pinned degree (a constraint), memory (with the candidate that misses by least,
//! checked against every candidate's own estimate), a configuration rule, the divisibility
//! rules that give no candidate at all, and a deadline.

use crate::common;
use assert_cmd::cargo::cargo_bin_cmd;
use common::non_numbers;
use parsim::config::{Config, Layer, Resolved};
use parsim::search::{enumerate, search, Constraint, NoFit, SearchResult, SearchSpec};
use serde_json::{json, Value};
use std::sync::atomic::AtomicBool;

fn spec(v: Value, constraints: &[&str]) -> SearchSpec {
    SearchSpec {
        base: Config::from_layers(&[Layer::overrides(v)]).unwrap(),
        mbs_max: 4,
        top: 3,
        constraints: constraints
            .iter()
            .map(|c| Constraint::parse(c).unwrap())
            .collect(),
        exhaustive: false,
    }
}

fn run(spec: &SearchSpec) -> SearchResult {
    search(spec, &|_, _| {}, &AtomicBool::new(false)).unwrap()
}

fn no_fit(r: &SearchResult) -> &NoFit {
    assert!(r.top.is_empty() && !r.interrupted);
    r.no_fit.as_ref().expect("an empty search says why")
}

/// `parsim search ARGS`: its status and stdout.
fn cli(args: &[&str]) -> (Option<i32>, String) {
    let out = cargo_bin_cmd!("parsim")
        .arg("search")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
    )
}

/// tp = 3 divides neither 8 GPUs nor 32 heads: the constraint removes every candidate, and
/// the fastest mix without it (the same search, unconstrained) is what it stood in front of.
#[test]
fn a_pinned_degree_no_mix_has_removes_the_last_candidates() {
    let base = json!({"model": {"preset": "llama3-8b"}, "cluster": {"num_gpus": 8}});
    let r = run(&spec(base.clone(), &["tp=3"]));
    let n = no_fit(&r);
    assert_eq!(n.removed_by_constraints, r.candidates);
    assert_eq!(n.constraints[0].removed, r.candidates);
    assert_eq!(n.removed_last_by, ["tp=3"]);
    let free = run(&SearchSpec {
        top: parsim::search::POOL,
        ..spec(base, &[])
    });
    assert_eq!(n.fastest_without_constraints, Some(free.top[0].mix));
    // Every fitting mix has tp != 3, so the constraint alone excludes each of them.
    let c = &n.constraints[0];
    assert_eq!(c.fitting_removed, free.top.len() as u64);
    assert_eq!(c.fitting_removed_alone, c.fitting_removed);
    let (code, out) = cli(&[
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--constraint",
        "tp=3",
    ]);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("removed last by the constraint tp=3"), "{out}");
}

/// Llama 3 8B on one H100 fits no way: memory removed the last candidates, and the closest
/// is the candidate whose own estimate is the least, over the usable memory.
#[test]
fn memory_removes_the_last_candidates_with_the_closest_named() {
    let base = json!({"model": {"preset": "llama3-8b"}, "cluster": {"num_gpus": 1}});
    let s = spec(base, &["zero<=1"]);
    let r = run(&s);
    let n = no_fit(&r);
    assert_eq!(n.removed_last_by, ["memory"]);
    let closest = n.closest.as_ref().expect("a closest candidate");
    assert!(closest.per_gpu_max_bytes > closest.usable_bytes);
    // Every candidate the constraint keeps, estimated on its own: none needs less.
    let least = enumerate(&s.base, s.mbs_max)
        .iter()
        .filter(|m| m.zero <= 1)
        .filter_map(|m| {
            let e = parsim::estimate::estimate(&Resolved::new(m.apply(&s.base)).ok()?).ok()?;
            Some(e.memory.per_gpu_max_bytes)
        })
        .min()
        .unwrap();
    assert_eq!(closest.per_gpu_max_bytes, least);
    let (code, out) = cli(&["--model", "llama3-8b", "--gpus", "1"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("closest to fitting:") && out.contains("removed last by memory"),
        "{out}"
    );
}

/// FP8 on an A100 (no FP8 tensor cores): the precision rule refuses every candidate.
#[test]
fn a_configuration_rule_removes_the_last_candidates() {
    let base = json!({"model": {"preset": "llama3-8b"}, "cluster": {"num_gpus": 8, "gpu": "a100-80g"},
                      "training": {"precision": "fp8"}});
    let r = run(&spec(base, &[]));
    let n = no_fit(&r);
    assert_eq!(n.removed_last_by, ["training.precision"]);
    assert_eq!(n.rules[0].removed, r.candidates);
    assert!(
        n.rules[0].example.contains("FP8 tensor cores"),
        "{:?}",
        n.rules
    );
}

/// One attention head (tp = 1 only), 2 layers (pp <= 2), a sequence of 7 (no CP: 7 does not
/// split into 2 x cp chunks) and a global batch of 1 (dp = 1) on 8 GPUs: of the 20 ways to
/// split 8 GPUs into tp x cp x pp x dp (the ordered factorisations of 2^3 into four), none
/// passes the divisibility rules, and the answer names them with their counts.
#[test]
fn the_divisibility_rules_leave_no_candidate() {
    let base = json!({"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 1,
                                "num_query_groups": 1, "ffn_hidden_size": 128, "vocab_size": 100},
                      "cluster": {"num_gpus": 8},
                      "training": {"seq_length": 7, "global_batch_size": 1}});
    let r = run(&spec(base, &[]));
    let n = no_fit(&r);
    assert_eq!(r.candidates, 0);
    // C(3 + 3, 3) = 20 ordered ways to spread the three factors of 2 over four degrees.
    assert_eq!(n.splits, 20);
    let count = |field: &str| {
        n.splits_skipped
            .iter()
            .find(|c| c.field == field)
            .map_or(0, |c| c.removed)
    };
    // tp > 1: splits with tp in {2, 4, 8}: 10 (those of the other three degrees over the rest).
    assert_eq!(count("parallel.tp"), 10);
    // tp = 1, cp > 1: 6; tp = cp = 1: pp 4 or 8 exceeds the 2 layers (2); dp > 1 with pp <= 2: 2.
    assert_eq!(count("training.seq_length"), 6);
    assert_eq!(count("parallel.pp"), 2);
    assert_eq!(count("training.global_batch_size"), 2);
    assert_eq!(n.removed_last_by.len(), 4);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(non_numbers(&v), None);
}

/// A deadline no count meets: the answer names the closest count and by how much it is late.
#[test]
fn a_deadline_no_count_meets_names_the_closest() {
    let out = cargo_bin_cmd!("parsim")
        .args(["search", "--model", "llama3-8b", "--gpus", "8..16"])
        .args(["--train-tokens", "1T", "--deadline", "1d"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("none finishes by the deadline; the closest is"),
        "{text}"
    );
    assert!(text.contains("days late"), "{text}");
}
