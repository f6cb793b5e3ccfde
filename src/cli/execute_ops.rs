//! `execute --profile-ops`: the op-class summary of the slowest rank (the step ends with it):
//! per class, calls and seconds per timed step, the share of the step, and the rate achieved
//! (FLOP/s for GEMMs and attention, B/s for memory-bound ops, bus bandwidth for collectives
//! as nccl-tests defines it). docs/calibration.md describes the records it summarises.

use comfy_table::{presets, CellAlignment, Table};
use parsim::report::format::{bytes, flops, seconds};
use parsim_plan::op_timing::{OpKey, OpTiming, Pass, RateUnit, OP_CLASSES};
use parsim_plan::run_report::RankReport;
use serde::Serialize;
use std::collections::BTreeMap;

/// One op class of the summary.
#[derive(Debug, Serialize)]
pub struct OpClassOut {
    pub class: String,
    /// Calls and seconds per timed step.
    pub calls: f64,
    pub time_s: f64,
    /// The class's seconds over the rank's mean step.
    pub share: f64,
    /// FLOP/s (`gemm`, `attention ...`), B/s (`memory`), bus B/s (collectives); absent where
    /// the work is unknown (host gap, banded attention only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    pub rate_unit: &'static str,
}

/// One class's sums: calls, seconds, and the work (FLOPs or bytes) of the calls whose work
/// is known with the seconds they took.
#[derive(Default)]
struct Sums {
    calls: u64,
    total_s: f64,
    work: f64,
    work_s: f64,
    unit: &'static str,
}

/// The summary of `ranks`' slowest rank over `timed` steps (`None` when nothing was profiled).
pub fn summary(ranks: &[RankReport], timed: usize) -> Option<(u32, Vec<OpClassOut>)> {
    let slowest = ranks
        .iter()
        .filter(|r| !r.ops.is_empty())
        .max_by(|a, b| a.median_step_s().total_cmp(&b.median_step_s()))?;
    let steps = timed.max(1) as f64;
    let step_s = slowest.step_s.iter().sum::<f64>() / steps;
    let mut classes: BTreeMap<(usize, String), Sums> = BTreeMap::new();
    for t in &slowest.ops {
        let e = classes.entry(class_of(&t.key)).or_default();
        e.unit = unit_name(&t.key);
        e.calls += t.calls;
        e.total_s += t.total_s;
        if let Some(w) = work(t) {
            e.work += w;
            e.work_s += t.total_s;
        }
    }
    let rows = classes
        .into_iter()
        .map(|((_, class), e)| OpClassOut {
            class,
            calls: e.calls as f64 / steps,
            time_s: e.total_s / steps,
            share: if step_s > 0.0 {
                e.total_s / steps / step_s
            } else {
                0.0
            },
            rate: (e.work > 0.0 && e.work_s > 0.0).then(|| e.work / e.work_s),
            rate_unit: e.unit,
        })
        .collect();
    Some((slowest.rank, rows))
}

/// The summary row a key counts in: its order in the table (its class's among
/// [`OP_CLASSES`]) and name.
fn class_of(k: &OpKey) -> (usize, String) {
    let order = OP_CLASSES.iter().position(|&c| c == k.class()).unwrap_or(0);
    let name = match k {
        OpKey::Attention { pass, kernel, .. } => {
            let p = match pass {
                Pass::Forward => "forward",
                Pass::Backward => "backward",
            };
            format!("attention {p} ({kernel})")
        }
        OpKey::Collective { op, .. } => op.as_str().into(),
        OpKey::HostGap => "host gap".into(),
        _ => k.class().into(),
    };
    (order, name)
}

/// How the summary names a rate unit.
fn unit_name(k: &OpKey) -> &'static str {
    match k.rate_unit() {
        Some(RateUnit::Flops) => "FLOP/s",
        Some(RateUnit::Bytes) => "B/s",
        Some(RateUnit::BusBytes) => "bus B/s",
        None => "",
    }
}

/// The work of a record's calls in its rate's unit: [`OpKey::work`] (FLOPs, bytes moved or
/// nccl-tests' bus bytes) times the calls.
fn work(t: &OpTiming) -> Option<f64> {
    Some(t.key.work()?.0 * t.calls as f64)
}

/// The summary as a table.
pub fn text(rank: u32, rows: &[OpClassOut]) -> String {
    let mut t = Table::new();
    t.load_style(presets::UTF8_BORDERS_ONLY);
    t.set_header(vec!["op class", "calls", "time", "share", "rate"]);
    for r in rows {
        let rate = match r.rate {
            Some(x) if r.rate_unit == "FLOP/s" => format!("{}/s", flops(x)),
            Some(x) if r.rate_unit == "B/s" => format!("{}/s", bytes(x)),
            Some(x) => format!("{}/s bus", bytes(x)),
            None => "-".into(),
        };
        t.add_row(vec![
            r.class.clone(),
            format!("{:.1}", r.calls),
            seconds(r.time_s),
            format!("{:.1}%", r.share * 100.0),
            rate,
        ]);
    }
    for i in 1..5 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    format!("op classes of rank {rank} (the slowest), per timed step:\n{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsim_plan::op_timing::{CollectiveKind, MaskKind, Placement};

    #[test]
    fn work_follows_the_published_counts() {
        let t = |key| OpTiming {
            key,
            calls: 2,
            total_s: 1.0,
        };
        // 2mnk per GEMM.
        let g = t(OpKey::Gemm {
            m: 4,
            n: 5,
            k: 6,
            dtype: parsim_plan::DType::F32,
        });
        assert_eq!(work(&g), Some(2.0 * 2.0 * 4.0 * 5.0 * 6.0));
        // Causal self-attention of 4 positions: half the 16 pairs (FlashAttention-2's count),
        // 4 d FLOPs each forward.
        let a = t(OpKey::Attention {
            batch_heads: 3,
            q_len: 4,
            kv_len: 4,
            head_dim: 8,
            mask: MaskKind::Causal,
            pass: Pass::Forward,
            kernel: "cpu".into(),
        });
        assert_eq!(work(&a), Some(2.0 * 3.0 * 8.0 * 4.0 * 8.0));
        // nccl-tests: an all-reduce over 4 ranks moves 2 x 3/4 of its buffer per rank.
        let c = t(OpKey::Collective {
            op: CollectiveKind::AllReduce,
            bytes: 1000,
            group_size: 4,
            placement: Placement::IntraNode,
        });
        assert_eq!(work(&c), Some(2.0 * 1500.0));
        assert_eq!(work(&t(OpKey::HostGap)), None);
    }
}
