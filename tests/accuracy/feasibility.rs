//! Feasibility against published runs: a run labelled out of memory is predicted not to fit
//! at its own settings. The labels are read straight from the published table, the verdicts
//! from `parsim validate`'s rows (each an estimate of the row's printed settings).

use parsim::validate::{self, Options, Outcome, Source};
use serde_json::Value;

/// The BLOOM tr11 rows labelled `"oom": true` in the data file, by index.
fn bloom_oom_rows() -> Vec<usize> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/data/published-runs-2026.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let table = doc["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["source"]
                .as_str()
                .unwrap()
                .starts_with("BigScience BLOOM")
        })
        .unwrap();
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, r)| r["oom"].as_bool() == Some(true))
        .map(|(i, _)| i)
        .collect()
}

/// Every BLOOM tr11 sweep that ran out of memory (TP 8 with the whole model on one stage, TP 2
/// over 6 stages) is predicted not to fit, with its ZeRO-1 optimizer, DeepSpeed's reduce
/// bucket and step copies and the allocator's reserve.
#[test]
fn bloom_runs_that_ran_out_of_memory_do_not_fit() {
    let ooms = bloom_oom_rows();
    assert!(!ooms.is_empty());
    let report = validate::run(
        &Options {
            sources: vec![Source::BloomTr11],
            every: 1,
        },
        &|_, _| {},
    )
    .unwrap();
    for i in ooms {
        let row = report.rows.iter().find(|r| r.index == i).unwrap();
        match &row.outcome {
            Outcome::Predicted(p) => assert!(
                !p.fits,
                "{}: ran out of memory, predicted to fit at {:.1} GiB",
                row.label,
                p.peak_bytes as f64 / (1u64 << 30) as f64
            ),
            other => panic!("{}: {other:?}", row.label),
        }
    }
}
