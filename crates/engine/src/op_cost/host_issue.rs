//! What the host spends to issue a block's kernels under a framework
//! (calibration/data/host-overhead.json, each figure with its source): the CPU time of one
//! eager call (Python, autograd, the dispatcher, the launch), how many such calls each ledger
//! op and each layer's own code are in that framework, and a CUDA graph replacing a captured
//! layer's issue with one launch. Under `CUDA_LAUNCH_BLOCKING=1` the host waits out every
//! kernel, so nothing it does hides under the device.
//! [`BlockIssue`] collects a block's calls per pass and runs them through the issue queue
//! ([`super::issue`]) for the time the device waits on the host.

use super::issue::{steady_idle_s, Issued};
use crate::config::{Framework, TokenDispatcher};
use crate::model::{Op, OpKind, Phase};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const TABLE_JSON: &str = include_str!("../../../../calibration/data/host-overhead.json");

/// A measured figure: the point used and the range its sources span.
#[derive(Debug, Clone, Deserialize)]
pub struct Figure {
    pub value: f64,
    pub range: [f64; 2],
    pub source: String,
}

/// Host calls (forward, backward) of an op of each kind, where the framework's table does
/// not name the op.
#[derive(Debug, Clone, Deserialize)]
pub struct KindCalls {
    pub matmul: [u32; 2],
    pub memory_bound: [u32; 2],
    pub fused_attention: [u32; 2],
    pub unfused_attention: [u32; 2],
    pub collective: [u32; 2],
}

/// One framework's host calls per ledger op.
#[derive(Debug, Clone, Deserialize)]
pub struct FrameworkCalls {
    pub stack: String,
    pub source: String,
    /// Where in the framework's code the calls were counted.
    pub counted: String,
    /// Ledger op name -> (forward, backward) calls.
    pub calls: BTreeMap<String, [u32; 2]>,
    /// Calls (forward, backward) of a layer's own code beside its ops.
    pub block: [u32; 2],
    pub calls_by_kind: KindCalls,
    /// Where the host waits for the device in a dropless MoE layer.
    #[serde(default)]
    pub dropless_moe_syncs: Vec<MoeSync>,
}

/// A point of a dropless MoE layer where the host reads the tokens per expert from the device
/// to size what follows (the framework's code: a `.tolist()`, `.item()` or stream
/// synchronisation), so it waits for everything issued before and cannot run ahead across it.
#[derive(Debug, Clone, Deserialize)]
pub struct MoeSync {
    /// The ledger op whose calls wait.
    pub op: String,
    /// The token dispatchers (`parallel.moe_token_dispatcher`) that wait here.
    pub dispatchers: Vec<String>,
    /// Waits (forward, backward).
    pub syncs: [u32; 2],
    /// The file and function that read the counts.
    pub code: String,
}

/// The data file.
#[derive(Debug, Clone, Deserialize)]
pub struct HostOverheadTable {
    pub sources: BTreeMap<String, String>,
    pub host_per_call_s: Figure,
    pub graph_launch_s: Figure,
    /// Per launch under `CUDA_LAUNCH_BLOCKING=1`: the kernel's start and its completion
    /// reaching the host, beyond the launch call and the kernel.
    pub blocking_sync_s: Figure,
    pub frameworks: BTreeMap<String, FrameworkCalls>,
}

/// The shipped table; `None` only if the file does not parse (a test keeps it parsing).
pub fn table() -> Option<&'static HostOverheadTable> {
    static TABLE: OnceLock<Option<HostOverheadTable>> = OnceLock::new();
    TABLE
        .get_or_init(|| serde_json::from_str(TABLE_JSON).ok())
        .as_ref()
}

/// How a configuration's host issues its kernels.
#[derive(Debug, Clone, Copy)]
pub struct HostIssue<'a> {
    /// The framework's calls per op; `None`: issue is free (the device-only time model).
    calls: Option<&'a FrameworkCalls>,
    /// Host seconds per call.
    pub per_call_s: f64,
    /// Host seconds of one CUDA graph replay, where the layers run as graphs.
    pub graph_launch_s: Option<f64>,
    /// Host seconds each launch waits beyond its kernel, where every launch blocks until its
    /// kernel ends (`training.launch_blocking`); `None`: launches are asynchronous.
    pub blocking_sync_s: Option<f64>,
    /// Host seconds of one device-to-host read the host waits for (the device's completion
    /// reaching the host), where dropless MoE routing syncs the host with the device
    /// ([`FrameworkCalls::dropless_moe_syncs`]); `None`: no such sync.
    pub moe_sync_s: Option<f64>,
    /// The token dispatcher, which decides where the dropless layer syncs.
    pub dispatcher: TokenDispatcher,
}

impl HostIssue<'static> {
    /// Free issue: the device never waits on the host.
    pub const NONE: HostIssue<'static> = HostIssue {
        calls: None,
        per_call_s: 0.0,
        graph_launch_s: None,
        blocking_sync_s: None,
        moe_sync_s: None,
        dispatcher: TokenDispatcher::AllToAll,
    };

    /// `framework`'s issue at the table's figures; with `cuda_graphs`, each block's pass is
    /// one graph replay.
    pub fn of(framework: Framework, cuda_graphs: bool) -> HostIssue<'static> {
        let Some(t) = table() else {
            return HostIssue::NONE;
        };
        HostIssue {
            calls: t.frameworks.get(framework.name()),
            per_call_s: t.host_per_call_s.value,
            graph_launch_s: cuda_graphs.then_some(t.graph_launch_s.value),
            blocking_sync_s: None,
            moe_sync_s: None,
            dispatcher: TokenDispatcher::AllToAll,
        }
    }

    /// This issue with every launch blocking until its kernel ends (`CUDA_LAUNCH_BLOCKING=1`)
    /// where `on`, at the table's round trip per launch.
    pub fn with_launch_blocking(self, on: bool) -> HostIssue<'static> {
        HostIssue {
            blocking_sync_s: table()
                .filter(|_| on && self.calls.is_some())
                .map(|t| t.blocking_sync_s.value),
            ..self
        }
    }

    /// This issue with the host waiting for the device wherever the framework reads dropless
    /// MoE routing's tokens per expert on the host under `dispatcher` (`on`: the model routes
    /// without an expert capacity), each read a kernel completion reaching the host (the
    /// table's `blocking_sync_s`: the same round trip a blocking launch waits).
    pub fn with_dropless_moe(self, on: bool, dispatcher: TokenDispatcher) -> HostIssue<'static> {
        HostIssue {
            moe_sync_s: table()
                .filter(|_| on && self.calls.is_some())
                .map(|t| t.blocking_sync_s.value),
            dispatcher,
            ..self
        }
    }
}

impl HostIssue<'_> {
    /// The host's waits for the device (forward, backward) before `op`'s calls.
    fn op_syncs(&self, op: &Op) -> (u32, u32) {
        let (Some(k), Some(_)) = (self.calls, self.moe_sync_s) else {
            return (0, 0);
        };
        k.dropless_moe_syncs
            .iter()
            .filter(|s| {
                s.op == op.name && s.dispatchers.iter().any(|d| d == self.dispatcher.as_str())
            })
            .fold((0, 0), |(f, b), s| (f + s.syncs[0], b + s.syncs[1]))
    }

    /// Calls (forward, backward) of `op`, given which of its passes do work: none for a pass
    /// that does none; a matmul's backward counts only the gradients it computes.
    fn op_calls(&self, op: &Op, (fwd, dgrad, wgrad): (f64, f64, f64)) -> (u32, u32) {
        let Some(k) = self.calls else {
            return (0, 0);
        };
        let by_kind = &k.calls_by_kind;
        let (base, calls) = match op.kind {
            OpKind::Matmul { .. } => (by_kind.matmul, 1),
            OpKind::Attention { fused, ring, .. } => {
                let kind = if fused {
                    by_kind.fused_attention
                } else {
                    by_kind.unfused_attention
                };
                (kind, ring.map_or(1, |r| r.blocks.max(1)))
            }
            OpKind::MemoryBound { .. } | OpKind::Quantize { .. } => (by_kind.memory_bound, 1),
        };
        let [f, mut b] = k.calls.get(op.name).copied().unwrap_or(base);
        // A matmul computing one of its two gradients (a frozen weight) makes about half the
        // backward's calls.
        if matches!(op.kind, OpKind::Matmul { .. }) && (dgrad > 0.0) != (wgrad > 0.0) {
            b = b.div_ceil(2);
        }
        let on = |s: f64, n: u32| if s > 0.0 { n * calls } else { 0 };
        (on(fwd, f), on(dgrad + wgrad, b))
    }
}

/// The calls of one block's passes as the host issues them: forward, backward (in reverse
/// op order) and the forward that recomputation reruns in the backward.
#[derive(Debug, Clone, Default)]
pub struct BlockIssue {
    fwd: Vec<Issued>,
    bwd: Vec<Issued>,
    recompute: Vec<Issued>,
}

/// The device's time waiting on the host in each of a block's passes, per microbatch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostWait {
    pub fwd_s: f64,
    pub bwd_s: f64,
    pub recompute_s: f64,
}

impl BlockIssue {
    /// `op`'s calls, whose device seconds are (forward, input gradient, weight gradient);
    /// `rerun`: recomputation reruns its forward.
    /// The host first waits for the device where the op needs a device value on the host
    /// ([`HostIssue::with_dropless_moe`]).
    pub fn op(&mut self, host: &HostIssue, op: &Op, device: (f64, f64, f64), rerun: bool) {
        let (kf, kb) = host.op_calls(op, device);
        let (sf, sb) = host.op_syncs(op);
        let sync = Issued {
            host_s: host.moe_sync_s.unwrap_or(0.0),
            device_s: 0.0,
            host_waits: true,
        };
        let fwd = Issued {
            host_s: f64::from(kf) * host.per_call_s,
            device_s: device.0,
            host_waits: false,
        };
        for _ in 0..if device.0 > 0.0 { sf } else { 0 } {
            self.fwd.push(sync);
            if rerun {
                self.recompute.push(sync);
            }
        }
        self.fwd.push(fwd);
        if rerun {
            self.recompute.push(fwd);
        }
        self.bwd.push(Issued {
            host_s: f64::from(kb) * host.per_call_s,
            device_s: device.1 + device.2,
            host_waits: false,
        });
        // After the op's backward in the list, which runs reversed: before it.
        for _ in 0..if device.1 + device.2 > 0.0 { sb } else { 0 } {
            self.bwd.push(sync);
        }
    }

    /// A collective of `phase` of the op last added, leaving `exposed_s` on the compute
    /// stream: issued after the op's forward, or after its backward (which runs the ops in
    /// reverse order).
    pub fn collective(&mut self, host: &HostIssue, phase: Phase, exposed_s: f64, rerun: bool) {
        let Some(k) = host.calls else {
            return;
        };
        let [kf, kb] = k.calls_by_kind.collective;
        let n = match phase {
            Phase::Forward => kf,
            Phase::Backward => kb,
        };
        let call = Issued {
            host_s: f64::from(n) * host.per_call_s,
            device_s: exposed_s,
            host_waits: false,
        };
        match phase {
            Phase::Forward => {
                self.fwd.push(call);
                if rerun {
                    self.recompute.push(call);
                }
            }
            // Before the op's backward here: the list is reversed to run.
            Phase::Backward => self.bwd.insert(self.bwd.len().saturating_sub(1), call),
        }
    }

    /// The device's wait on the host in each pass, in the steady state of many alike blocks
    /// back to back ([`steady_idle_s`]); as one graph replay per pass under CUDA graphs.
    /// A pass with work also runs the layer's own code first (the framework's `block` calls;
    /// a recomputation rerunning every op, activation checkpointing, runs the forward's).
    /// With blocking launches the host never runs ahead: the device waits every host call
    /// and each launch's round trip ([`blocking_idle_s`]).
    pub fn wait(mut self, host: &HostIssue) -> HostWait {
        let Some(k) = host.calls else {
            return HostWait::default();
        };
        self.bwd.reverse();
        let whole_rerun = self.recompute.len() == self.fwd.len();
        let idle = |calls: &mut Vec<Issued>, block_calls: u32| {
            if calls.iter().all(|c| c.device_s <= 0.0 && c.host_s <= 0.0) {
                return 0.0;
            }
            let block = Issued {
                host_s: f64::from(block_calls) * host.per_call_s,
                device_s: 0.0,
                host_waits: false,
            };
            calls.insert(0, block);
            if let Some(launch_s) = host.graph_launch_s {
                // A captured graph replays without the host: no call and no read in it.
                for c in calls.iter_mut() {
                    c.host_s = 0.0;
                    c.host_waits = false;
                }
                calls.insert(
                    0,
                    Issued {
                        host_s: launch_s,
                        device_s: 0.0,
                        host_waits: false,
                    },
                );
            }
            match host.blocking_sync_s {
                Some(sync_s) => blocking_idle_s(calls, sync_s, host.graph_launch_s.is_some()),
                None => steady_idle_s(calls),
            }
        };
        let [block_fwd, block_bwd] = k.block;
        let block_rerun = if whole_rerun { block_fwd } else { 0 };
        HostWait {
            fwd_s: idle(&mut self.fwd, block_fwd),
            bwd_s: idle(&mut self.bwd, block_bwd),
            recompute_s: idle(&mut self.recompute, block_rerun),
        }
    }
}

/// The device's idle time over `calls` when every launch blocks until its kernel ends
/// (`CUDA_LAUNCH_BLOCKING=1`): the host issues a call only after the previous kernel has
/// finished and its completion has reached the host, so every host second and every launch's
/// `sync_s` round trip is idle device time. A call with device work is taken as one launch
/// (an op's further kernels are not counted, so this is the least such a pass waits); under a
/// CUDA graph the pass is one launch.
pub fn blocking_idle_s(calls: &[Issued], sync_s: f64, graphed: bool) -> f64 {
    let host_s: f64 = calls.iter().map(|c| c.host_s).sum();
    let launches = calls.iter().filter(|c| c.device_s > 0.0).count();
    let launches = if graphed { launches.min(1) } else { launches };
    host_s + launches as f64 * sync_s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data file parses, names a table for every framework parsim models, and each
    /// point lies inside the range its sources measured; every source a figure cites exists.
    #[test]
    fn the_table_covers_every_framework_within_its_ranges() {
        let t = table().expect("calibration/data/host-overhead.json parses");
        for f in Framework::ALL {
            let k = t
                .frameworks
                .get(f.name())
                .unwrap_or_else(|| panic!("no {} table", f.name()));
            assert!(
                t.sources.contains_key(&k.source),
                "{}: {}",
                f.name(),
                k.source
            );
        }
        for fig in [&t.host_per_call_s, &t.graph_launch_s, &t.blocking_sync_s] {
            assert!(
                fig.range[0] <= fig.value && fig.value <= fig.range[1],
                "{fig:?}"
            );
            assert!(t.sources.keys().any(|s| fig.source.contains(s.as_str())));
        }
    }

    fn matmul() -> Op {
        Op::new(
            "mlp.fc1",
            OpKind::Matmul {
                m: 1024,
                n: 1024,
                k: 1024,
            },
        )
    }

    /// Megatron-DeepSpeed's apex LayerNorm is four calls forward (the fused function and three
    /// `.contiguous()`) and three backward (its table); a matmul two forward (the TP region's
    /// function and F.linear) and three backward (dgrad, wgrad, bias gradient), two when it
    /// computes only the input gradient (a frozen weight), none for a pass without work.
    #[test]
    fn calls_per_op_follow_the_framework_table() {
        let host = HostIssue::of(Framework::Deepspeed, false);
        let norm = Op::new("attn.norm", OpKind::MemoryBound { bytes: 1 << 20 });
        assert_eq!(host.op_calls(&norm, (1.0, 1.0, 0.0)), (4, 3));
        let mm = matmul();
        assert_eq!(host.op_calls(&mm, (1.0, 1.0, 1.0)), (2, 3));
        assert_eq!(host.op_calls(&mm, (1.0, 1.0, 0.0)), (2, 2));
        assert_eq!(host.op_calls(&mm, (0.0, 0.0, 0.0)), (0, 0));
        assert_eq!(HostIssue::NONE.op_calls(&mm, (1.0, 1.0, 1.0)), (0, 0));
    }

    /// Short kernels, by hand: a block of ten 1 us matmuls under Megatron-DeepSpeed issues
    /// its own 10 calls and 2 per matmul forward (host 30 calls), 16 and 3 per matmul backward
    /// (46 calls against 2 us each of device time); once the host is behind, the device waits
    /// host - device per pass: 30 c - 10 us forward, 46 c - 20 us backward. Long kernels: no
    /// wait. A CUDA graph replaces each pass's calls with one launch, so the wait falls.
    #[test]
    fn cuda_graphs_lower_the_issue_term() {
        let eager = HostIssue::of(Framework::Deepspeed, false);
        let graphed = HostIssue::of(Framework::Deepspeed, true);
        let c = eager.per_call_s;
        let block = |host: &HostIssue, device_s: f64| {
            let mut b = BlockIssue::default();
            for _ in 0..10 {
                b.op(host, &matmul(), (device_s, device_s, device_s), false);
            }
            b.wait(host)
        };
        let short = block(&eager, 1e-6);
        assert!(
            (short.fwd_s - (30.0 * c - 10e-6)).abs() < 1e-12,
            "{short:?}"
        );
        assert!(
            (short.bwd_s - (46.0 * c - 20e-6)).abs() < 1e-12,
            "{short:?}"
        );
        assert_eq!(short.recompute_s, 0.0);
        assert_eq!(block(&eager, 1e-3), HostWait::default());
        let g = block(&graphed, 1e-6);
        let launch = graphed.graph_launch_s.unwrap();
        assert!(
            g.fwd_s < short.fwd_s && g.fwd_s <= launch,
            "{g:?} vs {short:?}"
        );
        assert!(
            g.bwd_s < short.bwd_s && g.bwd_s <= launch,
            "{g:?} vs {short:?}"
        );
        assert_eq!(block(&HostIssue::NONE, 1e-6), HostWait::default());
    }

    /// Full recomputation reruns the forward's calls and the layer's own forward code in the
    /// backward; with nothing rerun the recomputation waits nothing.
    #[test]
    fn a_whole_rerun_pays_the_forward_issue_again() {
        let host = HostIssue::of(Framework::Deepspeed, false);
        let mut b = BlockIssue::default();
        for _ in 0..10 {
            b.op(&host, &matmul(), (1e-6, 1e-6, 1e-6), true);
        }
        let w = b.wait(&host);
        assert!((w.recompute_s - w.fwd_s).abs() < 1e-15, "{w:?}");
    }

    /// A dropless MoE layer under Megatron-Core, by hand from the table (c = 20 us a call, the
    /// read's round trip s = 2.9 us): the layer's own 4 calls, a 1 ms QKV matmul (2 calls),
    /// the dispatch (1 call, 10 us), fc1 and fc2 (2 calls, 50 us each). Eager, the host (220
    /// us) runs far ahead of the device (1110 us): no wait. With the flex dispatcher the host
    /// waits for the QKV to end before the dispatch and for the dispatch before fc1: per
    /// forward it waits s + 20 (the dispatch's issue) + s + 40 (fc1's), fc2's issue hides
    /// under fc1, and the host ends only 60 us ahead, so the next layer's own calls and QKV
    /// (120 us) wait 60 more: 125.8 us. With the all-to-all dispatcher only the first read:
    /// s + 20, then fc1's issue (40) beside the dispatch's 10 us waits 30, and 60 as before:
    /// 112.9 us. A capacity (no read) or CUDA graphs: no wait; the backward reads nothing.
    #[test]
    fn dropless_moe_waits_for_the_device_at_each_read() {
        use crate::config::TokenDispatcher;
        let layer = |host: &HostIssue| {
            let mut b = BlockIssue::default();
            let mm = |name: &'static str| Op::new(name, matmul().kind);
            let dispatch = Op::new("moe.dispatch", OpKind::MemoryBound { bytes: 1 << 20 });
            for (op, s) in [
                (mm("attn.qkv"), 1e-3),
                (dispatch, 10e-6),
                (mm("moe.experts.fc1"), 50e-6),
                (mm("moe.experts.fc2"), 50e-6),
            ] {
                b.op(host, &op, (s, s, s), false);
            }
            b.wait(host)
        };
        let eager = HostIssue::of(Framework::MegatronCore, false);
        let (c, s) = (eager.per_call_s, 2.9e-6);
        assert_eq!(c, 20e-6);
        assert_eq!(layer(&eager), HostWait::default());
        let flex = eager.with_dropless_moe(true, TokenDispatcher::Flex);
        assert_eq!(flex.moe_sync_s, Some(s));
        let w = layer(&flex);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(w.fwd_s, s + c + s + 2.0 * c + 3.0 * c), "{w:?}");
        assert_eq!(w.bwd_s, layer(&eager).bwd_s);
        let a2a = layer(&eager.with_dropless_moe(true, TokenDispatcher::AllToAll));
        assert!(
            close(a2a.fwd_s, s + c + (2.0 * c - 10e-6) + 3.0 * c),
            "{a2a:?}"
        );
        let capped = eager.with_dropless_moe(false, TokenDispatcher::Flex);
        assert_eq!(layer(&capped), HostWait::default());
        let graphed = HostIssue::of(Framework::MegatronCore, true)
            .with_dropless_moe(true, TokenDispatcher::Flex);
        assert!(layer(&graphed).fwd_s <= graphed.graph_launch_s.unwrap());
    }

    /// A BLOOM tr11 decoder layer under Megatron-DeepSpeed at TP 8 with CUDA_LAUNCH_BLOCKING=1,
    /// by hand from the table (megatron/model/transformer.py's calls): forward attn.norm 4,
    /// qkv 2, core 27, proj 2, proj_bias 1, dropout 2, mlp.norm 4, fc1 2, act 2, fc2 2,
    /// fc2_bias 1, dropout 2 = 51 calls, 2 TP all-reduces 1 each and the layer's own 10: 63
    /// calls of 20 us = 1.26 ms, and 14 launches (12 ops, 2 all-reduces) of 2.9 us = 40.6 us
    /// (the table names the core's calls; its kind does not matter here).
    /// Backward: 3+3+22+3+1+2+3+3+2+3+1+2 = 48, 2 all-reduces, 16 of its own: 66 calls = 1.32 ms
    /// and 14 launches. Its kernels are long (milliseconds at hidden 14336), so without
    /// blocking the device never waits; with it the device waits exactly those sums.
    #[test]
    fn blocking_launches_wait_every_call_and_round_trip() {
        let eager = HostIssue::of(Framework::Deepspeed, false);
        let blocking = eager.with_launch_blocking(true);
        let (c, sync) = (eager.per_call_s, blocking.blocking_sync_s.unwrap());
        assert_eq!((c, sync), (20e-6, 2.9e-6));
        let layer = |host: &HostIssue| {
            let mut b = BlockIssue::default();
            let mm = |name: &'static str| Op::new(name, matmul().kind);
            let mem = |name: &'static str| Op::new(name, OpKind::MemoryBound { bytes: 1 << 30 });
            for (op, all_reduce) in [
                (mem("attn.norm"), false),
                (mm("attn.qkv"), false),
                (mem("attn.core"), false),
                (mm("attn.proj"), true),
                (mem("attn.proj_bias"), false),
                (mem("attn.dropout"), false),
                (mem("mlp.norm"), false),
                (mm("mlp.fc1"), false),
                (mem("mlp.act"), false),
                (mm("mlp.fc2"), true),
                (mem("mlp.fc2_bias"), false),
                (mem("mlp.dropout"), false),
            ] {
                b.op(host, &op, (2e-3, 1e-3, 1e-3), false);
                if all_reduce {
                    b.collective(host, Phase::Forward, 1e-3, false);
                }
                if op.name == "attn.qkv" || op.name == "mlp.fc1" {
                    b.collective(host, Phase::Backward, 1e-3, false);
                }
            }
            b.wait(host)
        };
        assert_eq!(layer(&eager), HostWait::default());
        let w = layer(&blocking);
        assert!((w.fwd_s - (63.0 * c + 14.0 * sync)).abs() < 1e-12, "{w:?}");
        assert!((w.bwd_s - (66.0 * c + 14.0 * sync)).abs() < 1e-12, "{w:?}");
    }
}
