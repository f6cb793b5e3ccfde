//! Issue #33: NCCL's tuning model (src/network/nccl.rs) against published nccl-tests
//! small-message times, 8 B to 256 KiB, where nccl-tests' time column is the collective's
//! latency. The rows are calibration/data/nccl-tests.json's "latencies": NVIDIA's DGX H100
//! sample (8 GPUs, one node) and dstack's Crusoe run (2 nodes x 8 A100 on InfiniBand), out-of-place
//! times, one process per GPU, NCCL choosing the algorithm.
//!
//! Every row is predicted with the model as it ships. A row is asserted within 15% unless the
//! data file marks it "unmatched" with the reason, which says where the miss lies, and its own
//! bound, "unmatched_bound": the row's error when it was marked, rounded down to a whole
//! percent, plus two points. Those rows are asserted to still miss 15% (a model change that
//! fixes one shows up here) and to stay within their own bound (one that makes a known miss
//! worse fails: the reason covers the miss it describes, not a larger one). The misses:
//! 8-16 B on the H100 node, where NCCL's own ring/LL constants (15.0 us) sit 13-15% above the
//! run; 256 KiB on the H100 node, where parsim's chunk-pipeline term (`PIPELINE_OVERHEAD_S`, set
//! on Azure's one-process `-g 8` tables) adds 6.5 us that this run does not show; the A100
//! pair of nodes from 512 B on, where NCCL's model (parsim adds nothing across nodes) stays at
//! 25-39 us against 30-51 us measured on cloud VMs with SR-IOV HCAs.
//! `cargo test -p parsim-cli --test calibration nccl_latency -- --nocapture` prints model vs published per
//! row, and the median and worst error.

use parsim::model::CollectiveKind;
use parsim::network::nccl::{Algorithm, CollectiveModel, Fabric};
use serde_json::Value;

use crate::nccl_rows;

const TOLERANCE: f64 = 0.15;
/// The small-message range the latency rows cover: 8 B to 256 KiB.
const MAX_BYTES: f64 = (256u64 << 10) as f64;

/// One published time against the model: prints the row and returns the relative error of
/// the predicted time.
fn check(row: &Value) -> f64 {
    let n = row["gpus"].as_u64().unwrap() as u32;
    let nodes = row["nodes"].as_u64().unwrap() as u32;
    let system = row["system"].as_str().unwrap();
    let bytes = row["bytes"].as_f64().unwrap();
    let want_us = row["time_us"].as_f64().unwrap();
    assert!(row["source"].as_str().unwrap().starts_with("https://"));
    assert!(!row["where"].as_str().unwrap().is_empty());
    assert!((8.0..=MAX_BYTES).contains(&bytes), "{bytes} B out of range");
    assert!(
        row["nccl_proto"].is_null(),
        "NCCL_PROTO is not modelled: {row}"
    );
    let pred = nccl_rows::predict(row, bytes);
    let got_us = pred.time_s * 1e6;
    let err = got_us / want_us - 1.0;
    let mark = if row["unmatched"].is_string() {
        "unmatched"
    } else {
        ""
    };
    println!(
        "{system:<15} {:<10} {n:>3} GPUs {nodes} nodes {:>7} B  published {want_us:>6.2} us  model {got_us:>6.2} us ({:?}/{:?})  {:+6.1}% {mark}",
        row["collective"].as_str().unwrap(),
        bytes as u64,
        pred.algorithm,
        pred.protocol,
        100.0 * err
    );
    err
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        0.5 * (v[m - 1] + v[m])
    }
}

#[test]
fn published_small_message_latencies_within_15_percent() {
    let text = std::fs::read_to_string("calibration/data/nccl-tests.json").unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let rows = v["latencies"].as_array().expect("latencies");
    let (mut matched, mut unmatched) = (Vec::new(), Vec::new());
    for row in rows {
        let err = check(row).abs();
        match row["unmatched"].as_str() {
            Some(why) => {
                assert!(!why.is_empty());
                // Still a miss: a model change that brings it within 15% should un-mark it.
                assert!(err > TOLERANCE, "marked unmatched but within 15%: {row}");
                // No worse than when it was marked, with its reason.
                let bound = row["unmatched_bound"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("an unmatched row needs its own bound: {row}"));
                assert!(
                    bound > TOLERANCE && bound < 1.0,
                    "unmatched_bound {bound} must lie between 15% and 100%: {row}"
                );
                assert!(
                    err <= bound,
                    "error {:.1}% beyond the row's own bound {:.1}%: {row}",
                    100.0 * err,
                    100.0 * bound
                );
                unmatched.push(err);
            }
            None => {
                assert!(
                    row.get("unmatched_bound").is_none(),
                    "a bound without a reason: {row}"
                );
                assert!(err <= TOLERANCE, "error {err} on {row}");
                matched.push(err);
            }
        }
    }
    let all: Vec<f64> = matched.iter().chain(&unmatched).copied().collect();
    println!(
        "{} published times: {} within 15% (median {:.1}%, worst {:.1}%); all rows median {:.1}%, worst {:.1}%",
        all.len(),
        matched.len(),
        100.0 * median(matched.clone()),
        100.0 * matched.iter().copied().fold(0.0, f64::max),
        100.0 * median(all.clone()),
        100.0 * all.iter().copied().fold(0.0, f64::max),
    );
    // Most rows are checked: the unmatched ones are the exception, each with its reason.
    assert!(matched.len() >= 18 && unmatched.len() <= 10, "{matched:?}");
}

/// Latency grows with the group as NCCL's model has it: a ring's with its 2(n-1) steps, a
/// tree's across nodes with log2 of the node count; so for tiny messages NCCL takes the tree
/// across nodes and the model's time at 8 B grows from 2 to 64 nodes by 2 log2 steps of the
/// network hop, not linearly.
#[test]
fn small_message_latency_grows_with_ranks_as_nccl_models_it() {
    let h100 = Fabric::dgx_h100();
    let t_us = |n: u32, nodes: u32, a: Option<Algorithm>| {
        let m = CollectiveModel::new(&h100, CollectiveKind::AllReduce, n, nodes);
        let p = match a {
            Some(a) => m.predict_with(8.0, a),
            None => m.predict(8.0),
        };
        p.unwrap().time_s * 1e6
    };
    // Ring/LL inside a node: 0.6 us per step, 2(n-1) steps.
    let (r2, r8) = (
        t_us(2, 1, Some(Algorithm::Ring)),
        t_us(8, 1, Some(Algorithm::Ring)),
    );
    assert!(((r8 - r2) - 12.0 * 0.6).abs() < 0.1, "{r2} {r8}");
    // Across nodes the ring grows with every rank, the tree with log2(nodes).
    let ring_16 = t_us(16, 2, Some(Algorithm::Ring));
    let ring_512 = t_us(512, 64, Some(Algorithm::Ring));
    let tree_16 = t_us(16, 2, None);
    let tree_512 = t_us(512, 64, None);
    assert!(ring_512 > 20.0 * ring_16, "{ring_16} {ring_512}");
    // Tree/LL: 2 x 5 us network hop per doubling of the node count (log2 64 - log2 2 = 5).
    assert!(
        ((tree_512 - tree_16) - 5.0 * 2.0 * 5.0).abs() < 0.5,
        "{tree_16} {tree_512}"
    );
}
