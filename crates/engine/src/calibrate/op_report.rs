//! `parsim calibrate --report`'s op-class table and `--ops-png`'s points: the op timings the
//! measurement lines carry (`ops`) against the time a profile predicts for the same ops,
//! before the fit (the profile as given) and after it (the fitted profile). Each op is priced
//! by the estimate's own op-cost function ([`crate::op_cost`]): the profile's rate tables
//! where they cover it, the time model's analytic models elsewhere.

use crate::config::GpuProfile;
use crate::network::Network;
use crate::op_cost::key_cost;
use parsim_plan::op_timing::{OpKey, OpTiming};
use serde::Serialize;

/// The op classes, in the order the report lists them.
pub use parsim_plan::op_timing::OP_CLASSES as CLASSES;

/// The seconds of one call of `key` that `gpu` predicts ([`key_cost`], over `network`, the
/// profile's links), as its class measures them: the device time without the per-call overhead
/// (the timings hold host time as their own class, `host_gap`), and for the host gap the
/// overhead alone (the measured gap where the profile has one, else
/// `efficiency.kernel_overhead_s`). `None` where the model prices nothing: a banded mask (its
/// work is not in the key), a GEMM dtype with no peak, a wait.
pub fn predict_op_s(gpu: &GpuProfile, network: &Network, key: &OpKey) -> Option<f64> {
    let cost = key_cost(gpu, network, key)?;
    Some(match key {
        OpKey::HostGap => cost.overhead_s,
        _ => cost.device_s,
    })
}

/// One profile's prediction of a class's timings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Predicted {
    /// Seconds predicted for the timings it predicts (calls x seconds per call).
    pub predicted_s: f64,
    /// Measured seconds of those same timings.
    pub measured_s: f64,
    /// Timings it does not predict ([`predict_op_s`] is `None`).
    pub unpredicted: usize,
}

impl Predicted {
    /// predicted / measured - 1 over the predicted timings; `None` when they measured no time
    /// (the report prints "n/a").
    pub fn error(&self) -> Option<f64> {
        (self.measured_s > 0.0).then(|| self.predicted_s / self.measured_s - 1.0)
    }
}

/// One op class of the report: what the lines measured and what each profile predicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassRow {
    pub class: &'static str,
    /// Timings of the class in the lines; 0: the class is absent from them.
    pub timings: usize,
    /// Seconds of all its timings (calls included).
    pub measured_s: f64,
    /// The profile as given.
    pub before: Predicted,
    /// The fitted profile.
    pub after: Predicted,
}

/// One timing on the scatter plot: seconds per call, measured and predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpPoint {
    pub class: &'static str,
    pub measured_s: f64,
    pub before_s: Option<f64>,
    pub after_s: Option<f64>,
}

/// The op-class comparison of `timings` (every line's `ops` together) under `before` and
/// `after`: a row per class of [`CLASSES`] (absent ones with no timings) and a point per
/// timing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpReport {
    pub rows: Vec<ClassRow>,
    pub points: Vec<OpPoint>,
}

/// Adds a timing to one profile's prediction of its class.
fn add(p: &mut Predicted, t: &OpTiming, per_call_s: Option<f64>) {
    match per_call_s {
        Some(s) => {
            p.predicted_s += s * t.calls as f64;
            p.measured_s += t.total_s;
        }
        None => p.unpredicted += 1,
    }
}

/// Compares `timings` with what `before` and `after` predict for them (see [`OpReport`]).
pub fn compare(timings: &[OpTiming], before: &GpuProfile, after: &GpuProfile) -> OpReport {
    let (net_before, net_after) = (Network::of_links(before), Network::of_links(after));
    let mut rows: Vec<ClassRow> = CLASSES
        .iter()
        .map(|&class| ClassRow {
            class,
            timings: 0,
            measured_s: 0.0,
            before: Predicted::default(),
            after: Predicted::default(),
        })
        .collect();
    let mut points = Vec::with_capacity(timings.len());
    for t in timings {
        let class = t.key.class();
        let Some(row) = rows.iter_mut().find(|r| r.class == class) else {
            continue;
        };
        let (b, a) = (
            predict_op_s(before, &net_before, &t.key),
            predict_op_s(after, &net_after, &t.key),
        );
        row.timings += 1;
        row.measured_s += t.total_s;
        add(&mut row.before, t, b);
        add(&mut row.after, t, a);
        points.push(OpPoint {
            class,
            measured_s: t.mean_s(),
            before_s: b,
            after_s: a,
        });
    }
    OpReport { rows, points }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::layout::{GroupKind, Layout};
    use parsim_plan::op_timing::{CollectiveKind, MaskKind, Pass, Placement};

    fn predict(gpu: &GpuProfile, key: &OpKey) -> Option<f64> {
        predict_op_s(gpu, &Network::of_links(gpu), key)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs()
    }

    fn collective(op: CollectiveKind, n: u32, placement: Placement) -> OpKey {
        OpKey::Collective {
            op,
            bytes: 1_000_000_000,
            group_size: n,
            placement,
        }
    }

    /// The CPU profile's analytic model (its rate tables taken out, no NCCL generation) by
    /// hand: a memory-bound op of 1e9 bytes at hbm_bytes_per_s x efficiency.memory_bound; an
    /// intra-node all-reduce over 2 ranks of 1e9 bytes moves 2 x 1/2 of it on the bus
    /// (nccl-tests) over the link's bandwidth times its efficiency, plus its latency; an
    /// inter-node all-gather over 4 ranks, one per node, 3/4 of it over the network link; the
    /// host gap is the kernel overhead.
    #[test]
    fn the_analytic_model_times_memory_and_collectives_by_their_formulas() {
        let mut gpu = GpuProfile::load("cpu").unwrap();
        gpu.tables = Default::default();
        assert_eq!(gpu.links.nccl, None);
        let e = &gpu.efficiency;
        let mem = predict(
            &gpu,
            &OpKey::Memory {
                bytes: 1_000_000_000,
            },
        )
        .unwrap();
        assert!(close(mem, 1e9 / (gpu.hbm_bytes_per_s * e.memory_bound)));
        let ar = collective(CollectiveKind::AllReduce, 2, Placement::IntraNode);
        let l = &gpu.links.intra_node;
        let expect = 1e9 / (l.bandwidth_bytes_per_s * l.efficiency) + l.latency_s;
        assert!(close(predict(&gpu, &ar).unwrap(), expect));
        let ag = collective(CollectiveKind::AllGather, 4, Placement::InterNode);
        let l = &gpu.links.inter_node;
        let expect = 0.75e9 / (l.bandwidth_bytes_per_s * l.efficiency) + l.latency_s;
        assert!(close(predict(&gpu, &ag).unwrap(), expect));
        assert_eq!(predict(&gpu, &OpKey::HostGap), Some(e.kernel_overhead_s));
    }

    /// Attention as the estimate times it, by hand from the FLOP count: causal self-attention
    /// over 16 heads of 4096 positions at d = 128 is 4 x 16 x 4096^2 x 128 / 2 FLOPs forward
    /// (FlashAttention-2's count). On H100 (the profile names FlashAttention-3) the forward
    /// runs at the published kernel's rate at that length and mask, the backward 2.5 x those
    /// FLOPs at the backward's rate; on a profile with no published kernel (the CPU's, its
    /// tables taken out) at efficiency.attention of the bf16 peak, the backward twice the
    /// forward's FLOPs (the ledger's count, which the efficiency was fitted in).
    #[test]
    fn attention_is_timed_at_the_published_kernel_or_the_attention_efficiency() {
        let key = |pass| OpKey::Attention {
            batch_heads: 16,
            q_len: 4096,
            kv_len: 4096,
            head_dim: 128,
            mask: MaskKind::Causal,
            pass,
            kernel: "flash_mma".into(),
        };
        let flops = 4.0 * 16.0 * 4096.0 * 4096.0 * 128.0 / 2.0;
        let h100 = GpuProfile::load("h100-sxm").unwrap();
        let name = h100.attention_kernel.as_deref().unwrap();
        let k = crate::attention_rates::attention_kernel(name).unwrap();
        let fwd = flops / k.forward_flops_per_s(4096, true, 128);
        let bwd = 2.5 * flops / k.backward_flops_per_s(4096, true, 128);
        assert!(close(predict(&h100, &key(Pass::Forward)).unwrap(), fwd));
        assert!(close(predict(&h100, &key(Pass::Backward)).unwrap(), bwd));
        let mut cpu = GpuProfile::load("cpu").unwrap();
        cpu.tables = Default::default();
        assert_eq!(cpu.attention_kernel, None);
        let rate = cpu.peak_flops.bf16 * cpu.efficiency.attention;
        assert!(close(
            predict(&cpu, &key(Pass::Forward)).unwrap(),
            flops / rate
        ));
        assert!(close(
            predict(&cpu, &key(Pass::Backward)).unwrap(),
            2.0 * flops / rate
        ));
    }

    /// On a profile with an NCCL generation (H100) a measured collective is priced as the
    /// estimate prices the same group: an intra-node all-gather over 8 ranks as the TP group of
    /// an 8-GPU node, an inter-node all-reduce over 2 ranks as a DP group with one member per
    /// node (tp 8 fills each node), both read off a layout by the estimate's network.
    #[test]
    fn collectives_are_priced_as_the_estimate_prices_the_same_group() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        assert!(gpu.links.nccl.is_some());
        let layout = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 2, 1, 8).unwrap();
        let net = crate::network::Network::new(&layout, &gpu);
        assert_eq!(net.geometry(GroupKind::Dp).per_node, 1);
        for (op, n, placement, kind) in [
            (
                CollectiveKind::AllGather,
                8,
                Placement::IntraNode,
                GroupKind::Tp,
            ),
            (
                CollectiveKind::AllReduce,
                2,
                Placement::InterNode,
                GroupKind::Dp,
            ),
        ] {
            let got = predict(&gpu, &collective(op, n, placement)).unwrap();
            let want = net.collective_s(kind, op, 1_000_000_000, n);
            assert!(close(got, want), "{op:?}: {got} vs {want}");
        }
    }

    /// An absent class has no timings; a class measured in zero seconds has no error
    /// (the report prints "n/a"), never NaN.
    #[test]
    fn absent_classes_and_zero_time_have_no_error() {
        let gpu = GpuProfile::load("cpu").unwrap();
        let t = OpTiming {
            key: OpKey::HostGap,
            calls: 3,
            total_s: 0.0,
        };
        let r = compare(&[t], &gpu, &gpu);
        assert_eq!(r.rows.len(), CLASSES.len());
        let gap = r.rows.iter().find(|r| r.class == "host_gap").unwrap();
        assert_eq!((gap.timings, gap.after.error()), (1, None));
        assert!(r
            .rows
            .iter()
            .filter(|r| r.class != "host_gap")
            .all(|r| r.timings == 0 && r.before.error().is_none()));
    }
}
