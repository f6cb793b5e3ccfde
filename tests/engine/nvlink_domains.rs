//! NVL72 racks as they are deployed: a GB200/GB300 node is a compute tray of 4 GPUs by default,
//! and the NVLink domain follows the job's size (one domain for a job of at most a rack of 72,
//! whole racks of 72, else whole racks of 64, 16 of the 18 trays, as NVIDIA schedules jobs
//! larger than a rack, else the node with a warning); a given size always wins, and the
//! estimate's header, its JSON, `parsim layout` and `parsim search` say which.
//!
//! The expected sizes are worked by hand from NVIDIA's figures (a rack is 18 trays of 4 GPUs,
//! 72 on one NVLink fabric; jobs larger than a rack run on 64 of them), not from the code.

use super::common::{est, resolve};
use assert_cmd::cargo::cargo_bin_cmd;
use parsim::config::DomainRule;
use parsim::layout::Layout;
use serde_json::{json, Value};

/// Llama-3-8B at TP 2 on `n` GPUs of `gpu` (one sequence of 2048 per data-parallel rank).
fn job(gpu: &str, n: u32) -> Value {
    json!({"cluster": {"gpu": gpu, "num_gpus": n}, "parallel": {"tp": 2},
           "training": {"global_batch_size": n / 2, "seq_length": 2048}})
}

/// On both NVL72 profiles: 4 GPUs per node, and the domain by the job's size. 256 GPUs fill
/// no whole rack of 72 (256 = 3 x 72 + 40) but 4 racks of 64; 128 fills 2 of 64; 2,048 fills
/// 32 of 64 (2,048 = 28 x 72 + 32); 144 fills 2 racks of 72; 72 and 8 sit in one rack; 100
/// fills neither (100 = 72 + 28 = 64 + 36), so each tray is its own domain and a warning
/// names the field. The configuration holds the size where it is not the tray.
#[test]
fn nvl72_jobs_take_trays_of_four_and_a_domain_by_their_size() {
    use DomainRule::*;
    for gpu in ["gb200", "gb300"] {
        for (n, size, rule) in [
            (256, 64, PartialRacks),
            (128, 64, PartialRacks),
            (2048, 64, PartialRacks),
            (144, 72, WholeRacks),
            (72, 72, OneRack),
            (8, 8, OneRack),
            (100, 4, NodeFallback),
        ] {
            let r = resolve(job(gpu, n));
            let label = format!("{gpu} x {n}");
            assert_eq!(r.config.cluster.gpus_per_node, Some(4), "{label}");
            assert_eq!(r.nvlink_domain.size, size, "{label}");
            assert_eq!(r.nvlink_domain.rule, rule, "{label}");
            assert_eq!(Layout::of(&r).nvlink_domain_size, size, "{label}");
            assert_eq!(
                r.config.cluster.nvlink_domain_size,
                (size != 4).then_some(size),
                "{label}"
            );
            let warned = r
                .warnings
                .iter()
                .any(|w| w.contains("cluster.nvlink_domain_size"));
            assert_eq!(warned, rule == NodeFallback, "{label}: {:?}", r.warnings);
        }
    }
    // Racks of 64 on 256 GPUs: ranks 0-63 share a domain, rank 64 starts the next.
    let l = Layout::of(&resolve(job("gb200", 256)));
    assert_eq!(
        (l.domain_of(63), l.domain_of(64), l.domain_of(255)),
        (0, 1, 3)
    );
    assert_eq!((l.node_of(3), l.node_of(4)), (0, 1));
}

/// Every other profile keeps its node of 8 as the domain, and the estimate says nothing new
/// (no `nvlink_domain` in its JSON, the header as before).
#[test]
fn profiles_without_racks_keep_the_node() {
    for gpu in [
        "a100-80g", "h100-sxm", "h200", "b200", "b300", "mi300x", "mi355x",
    ] {
        let r = resolve(job(gpu, 64));
        assert_eq!(r.config.cluster.gpus_per_node, Some(8), "{gpu}");
        assert_eq!(r.nvlink_domain.size, 8, "{gpu}");
        assert_eq!(r.nvlink_domain.rule, DomainRule::Node, "{gpu}");
        assert_eq!(r.config.cluster.nvlink_domain_size, None, "{gpu}");
    }
    let e = est(job("h100-sxm", 64));
    let v = serde_json::to_value(&e).unwrap();
    assert!(v.get("nvlink_domain").is_none(), "{}", v["nvlink_domain"]);
    let text = parsim::report::table::estimate_text(&e);
    assert!(
        text.starts_with("parsim estimate: llama3-8b on 64 x h100-sxm (8 per node)\n"),
        "{text}"
    );
}

/// A given domain or node size wins over the profile's: racks of 128 on 256 GB200s are taken
/// as given (and said so); 8 GPUs per node on the same job keep racks of 64 (8 of 9 nodes).
#[test]
fn a_given_size_wins() {
    let mut given = job("gb200", 256);
    given["cluster"]["nvlink_domain_size"] = json!(128);
    let r = resolve(given);
    assert_eq!(
        (r.nvlink_domain.size, r.nvlink_domain.rule),
        (128, DomainRule::Given)
    );
    assert!(r.nvlink_domain.reason.contains("set to 128 GPUs"));
    let mut eight = job("gb200", 256);
    eight["cluster"]["gpus_per_node"] = json!(8);
    let r = resolve(eight);
    assert_eq!(r.config.cluster.gpus_per_node, Some(8));
    assert_eq!(
        (r.nvlink_domain.size, r.nvlink_domain.rule),
        (64, DomainRule::PartialRacks)
    );
    assert!(
        r.nvlink_domain.reason.contains("8 of 9 nodes"),
        "{}",
        r.nvlink_domain.reason
    );
}

/// The estimate says how the domain was chosen: its JSON's `nvlink_domain` (size, rule,
/// reason, and the warning of a fallback, which `warnings` also carries) and its header.
#[test]
fn the_estimate_says_how_the_domain_was_chosen() {
    let e = est(job("gb200", 256));
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["config"]["cluster"]["gpus_per_node"], 4);
    assert_eq!(v["config"]["cluster"]["nvlink_domain_size"], 64);
    assert_eq!(v["nvlink_domain"]["size"], 64);
    assert_eq!(v["nvlink_domain"]["rule"], "partial_racks");
    let reason = v["nvlink_domain"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("automatic: racks of 64, 16 of 18 nodes each"),
        "{reason}"
    );
    assert!(v["nvlink_domain"].get("warning").is_none());
    let text = parsim::report::table::estimate_text(&e);
    assert!(
        text.starts_with(
            "parsim estimate: llama3-8b on 256 x gb200 (4 per node; NVLink domain: automatic: racks of 64"
        ),
        "{text}"
    );
    assert!(!text.contains("NVLink domain 0"), "{text}");

    let e = est(job("gb200", 100));
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["nvlink_domain"]["rule"], "node_fallback");
    assert_eq!(v["nvlink_domain"]["size"], 4);
    let warning = v["nvlink_domain"]["warning"].as_str().unwrap();
    assert!(
        warning.starts_with(
            "cluster.nvlink_domain_size: 100 GPUs fill no whole gb200 racks of 72 or 64"
        ),
        "{warning}"
    );
    assert!(e.warnings.iter().any(|w| w == warning), "{:?}", e.warnings);
    assert!(v["config"]["cluster"].get("nvlink_domain_size").is_none());
}

fn parsim(args: &[&str]) -> (Option<i32>, String) {
    let out = cargo_bin_cmd!("parsim").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `parsim search` prints the choice above its table, and the fallback's warning: before,
/// the warning reached `estimate` and `--json` only. `parsim layout` says the same.
#[test]
fn search_and_layout_print_the_domain_and_its_warning() {
    let common = [
        "--model",
        "llama3-8b",
        "--gpu",
        "gb200",
        "--seq",
        "2048",
        "--top",
        "1",
    ];
    let (code, out) = parsim(&[&["search", "--gpus", "100", "--gbs", "100"], &common[..]].concat());
    assert!(matches!(code, Some(0 | 3)), "{code:?}\n{out}");
    assert!(out.contains("x gb200 (4 per node)"), "{out}");
    assert!(
        out.contains("warning: cluster.nvlink_domain_size: 100 GPUs fill no whole gb200 racks"),
        "{out}"
    );
    let (code, out) = parsim(&[&["search", "--gpus", "128", "--gbs", "128"], &common[..]].concat());
    assert!(matches!(code, Some(0 | 3)), "{code:?}\n{out}");
    assert!(
        out.contains("NVLink domain: automatic: racks of 64"),
        "{out}"
    );
    assert!(
        !out.contains("warning: cluster.nvlink_domain_size"),
        "{out}"
    );

    let (code, out) = parsim(&[
        "layout", "--gpu", "gb200", "--gpus", "256", "--gbs", "256", "--tp", "2",
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("4 GPUs per node"), "{out}");
    assert!(out.contains("NVLink domains of 64 GPUs"), "{out}");
    assert!(
        out.contains("NVLink domain: automatic: racks of 64"),
        "{out}"
    );
}
