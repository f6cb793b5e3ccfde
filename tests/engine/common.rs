//! Helpers to build resolved configurations in tests.

use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::{estimate, Estimate, GroupInfo};
use parsim::layout::GroupKind;
use serde_json::Value;

/// Resolves the defaults overlaid with a JSON document.
pub fn resolve(overlay: Value) -> Resolved {
    let cfg = Config::from_layers(&[Layer::overrides(overlay)]).expect("config loads");
    Resolved::new(cfg).expect("config validates")
}

/// Estimates the defaults overlaid with a JSON document.
pub fn est(overlay: Value) -> Estimate {
    estimate(&resolve(overlay)).expect("estimate")
}

/// A single-GPU configuration of a preset (no parallelism).
pub fn single(preset: &str) -> Value {
    serde_json::json!({
        "model": {"preset": preset},
        "cluster": {"num_gpus": 1},
        "parallel": {"tp": 1, "sp": false},
        "training": {"global_batch_size": 1, "seq_length": 2048}
    })
}

/// The estimate's communication entry of group kind `kind`.
pub fn group_info(e: &Estimate, kind: GroupKind) -> &GroupInfo {
    e.communication
        .groups
        .iter()
        .find(|g| g.group == kind)
        .unwrap_or_else(|| panic!("no {kind} group"))
}
