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

/// A published recipe's degrees (tp, cp, pp, vpp, ep, micro batch), as the search names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Degrees {
    pub tp: u32,
    pub cp: u32,
    pub pp: u32,
    pub vpp: u32,
    pub ep: u32,
    pub mbs: u64,
}

/// What `search` makes of a recipe over `base` with its degrees pinned (plus ZeRO-1 as
/// Megatron's distributed optimizer, the P2P ring for CP, and `extra` pins): whether the
/// recipe's degrees are among the enumerated mixes, and the best step time found.
pub fn search_recipe(base: &Config, d: Degrees, extra: &[String]) -> (bool, Option<f64>) {
    use parsim::search::{enumerate, search, Constraint, SearchSpec};
    use std::sync::atomic::AtomicBool;
    // ZeRO-1 (Megatron's distributed optimizer) unless `extra` pins another stage.
    let zero: u8 = extra
        .iter()
        .find_map(|p| p.strip_prefix("zero="))
        .map_or(1, |z| z.parse().expect("zero pin"));
    let mut pins = vec![
        format!("tp={}", d.tp),
        format!("cp={}", d.cp),
        format!("pp={}", d.pp),
        format!("ep={}", d.ep),
        format!("mbs={}", d.mbs),
        "cp_comm=p2p".to_string(),
    ];
    if !extra.iter().any(|p| p.starts_with("zero=")) {
        pins.push("zero=1".to_string());
    }
    pins.extend(extra.iter().cloned());
    let spec = SearchSpec {
        base: base.clone(),
        mbs_max: d.mbs,
        top: 1,
        constraints: pins.iter().map(|p| Constraint::parse(p).unwrap()).collect(),
        exhaustive: false,
    };
    let enumerated = enumerate(base, d.mbs).iter().any(|m| {
        (m.tp, m.cp, m.pp, m.vpp, m.ep, m.mbs, m.zero)
            == (d.tp, d.cp, d.pp, d.vpp, d.ep, d.mbs, zero)
    });
    let found = search(&spec, &|_, _| {}, &AtomicBool::new(false)).unwrap();
    (
        enumerated,
        found.top.first().map(|b| b.estimate.time.step_s),
    )
}

/// When the recipe fits, the search must rank first a mix no slower than it.
pub fn assert_search_no_slower(label: &str, recipe: &Estimate, best: Option<f64>) {
    if recipe.memory.fits {
        let best = best.unwrap_or_else(|| panic!("{label}: no mix found"));
        assert!(
            best <= recipe.time.step_s * (1.0 + 1e-9),
            "{label}: search {best} s, recipe {} s",
            recipe.time.step_s
        );
    }
}
