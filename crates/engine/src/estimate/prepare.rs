//! Building a [`Prepared`] in two steps, so that a search can stop early: the ledger and the
//! pipeline chunks first (enough for the memory lower bound), the per-stage costs only for
//! what may fit; the ledger and the network borrowed when many mixes share them. Also a lower
//! bound of the step shared by every pipeline split of one timed ledger.

use super::dp::dp_tail_s;
use super::{overlaps, stage_costs, EstimateError, Prepared};
use crate::comm::{step_collectives, StepCollective};
use crate::config::Resolved;
use crate::memory::{
    inflight_peak_bytes, inflight_peak_bytes_memo, same_blocks, updated_params, RankStaticMemo,
};
use crate::model::{chunks_per_rank, rank_params, ChunkContents, Ledger, LedgerSummary};
use crate::network::Network;
use crate::time::{Rates, TimingContext};
use std::borrow::Cow;

/// The training dtype's rates on the configuration's GPU.
pub(super) fn rates(r: &Resolved) -> Rates<'_> {
    let tr = &r.config.training;
    Rates {
        gpu: &r.gpu,
        peak_flops: peak_flops(r),
        element_bytes: tr.weight_bytes(),
        matmul_efficiency: r.gpu.matmul_efficiency_for(tr.precision),
    }
}

/// The dense peak the step is measured against (MFU): the training dtype's, else bf16's.
fn peak_flops(r: &Resolved) -> f64 {
    r.gpu
        .peak_flops_for(r.config.training.precision)
        .unwrap_or(r.gpu.peak_flops.bf16)
}

/// The op ledger of `r` with every block timed on `network`.
pub fn timed_ledger(r: &Resolved, network: &Network) -> (Ledger, LedgerSummary) {
    time_ledger(r, network, Ledger::build(r))
}

/// `ledger` (of `r`, or built from it and edited) with every block timed on `network`.
pub fn time_ledger(r: &Resolved, network: &Network, ledger: Ledger) -> (Ledger, LedgerSummary) {
    let tr = &r.config.training;
    let timing = TimingContext {
        rates: rates(r),
        network,
        overlaps: overlaps(r),
        cp_comm: r.config.parallel.cp_comm,
        step_sync: crate::time::step_sync_group(r.dp, r.config.parallel.pp),
        host: crate::op_cost::host_issue::HostIssue::of(tr.framework, tr.cuda_graphs)
            .with_launch_blocking(tr.launch_blocking)
            .with_dropless_moe(
                dropless_moe(&r.config.model),
                r.config.parallel.moe_token_dispatcher,
            ),
    };
    let s = LedgerSummary::timed(&ledger, tr.recompute, |b| {
        timing.block_times(b, tr.recompute)
    });
    (ledger, s)
}

/// Whether the model's MoE layers route without an expert capacity (Megatron-Core's
/// dropless default), so the tokens per expert are known only on the device. A capacity
/// factor is taken as Megatron-Bridge's token-drop setting, which pads every expert to its
/// capacity (src/megatron/bridge/training/utils/moe_token_drop.py, `apply_moe_token_drop`:
/// `moe_pad_expert_input_to_capacity = True`), so the host computes the sizes itself.
pub fn dropless_moe(m: &crate::config::ModelConfig) -> bool {
    m.num_experts > 0 && m.moe_capacity_factor <= 0.0
}

/// The most loaded rank's memory with one activation set in flight: a lower bound of its
/// peak under any schedule.
pub(super) fn memory_lower_bound(
    r: &Resolved,
    s: &LedgerSummary,
    ledger: &Ledger,
    chunks: &[Vec<ChunkContents>],
) -> u64 {
    inflight_peak_bytes(r, s, ledger, chunks, 1, false)
}

/// A lower bound of the step time of every pipeline split (vpp, first/last stage, layout,
/// slots) that shares the timed ledger `s`: the most loaded rank is busy for at least the
/// mean of the ranks' work, and that work adds up, microbatch by microbatch, to every block
/// of the model once (forward, both backward halves, recomputation and the communication
/// each block exposes). Data-parallel gathers, the tail, the optimizer and the pipeline's
/// fill only add to it. Rounded down by a relative 1e-9 so that a different order of the same
/// sums can never put it above a split's own bound.
pub fn split_free_lower_bound(r: &Resolved, s: &LedgerSummary) -> f64 {
    split_free_bound_of(
        split_free_per_microbatch_s(r, s),
        r.microbatches,
        r.config.parallel.pp,
    )
}

/// One microbatch's work over every block of the model once ([`split_free_lower_bound`]):
/// the same for every pipeline depth that shares the timed ledger `s`.
pub fn split_free_per_microbatch_s(r: &Resolved, s: &LedgerSummary) -> f64 {
    let whole = ChunkContents::whole_model(&r.config.model);
    whole
        .blocks(s)
        .map(|(b, n)| {
            let t = &b.times;
            n as f64
                * (t.fwd_s
                    + t.exposed_fwd_s()
                    + t.dgrad_s
                    + t.recompute_s
                    + t.exposed_bwd_s()
                    + t.wgrad_s)
        })
        .sum()
}

/// [`split_free_lower_bound`] from its per-microbatch work, `microbatches` and `pp`.
pub fn split_free_bound_of(per_microbatch_s: f64, microbatches: u32, pp: u32) -> f64 {
    let pp = f64::from(pp.max(1));
    let lb = f64::from(microbatches) * per_microbatch_s / pp * (1.0 - 1e-9);
    if lb.is_finite() {
        lb.max(0.0)
    } else {
        0.0
    }
}

/// What the mixes of one search run (the same resolved configuration but for the pipeline
/// split: vpp, schedule, first/last stage layers, slots) work out alike under one shared timed
/// ledger and network, kept from one mix to the next: the ranks' static memories, each
/// chunk's times, and each rank's step-level collectives, data-parallel tail and optimizer
/// step, all by what a chunk or rank holds. None of them reads the split.
#[derive(Default)]
pub struct RunMemo {
    statics: RankStaticMemo,
    chunk_times: Vec<(ChunkContents, super::ChunkTimes)>,
    ranks: Vec<RankAfter>,
}

/// A rank's chunks, its step-level collectives, and its (data-parallel tail, optimizer step)
/// seconds.
type RankAfter = (Vec<ChunkContents>, Vec<StepCollective>, (f64, f64));

impl RunMemo {
    /// True when nothing is kept yet.
    pub fn is_empty(&self) -> bool {
        self.statics.is_empty() && self.chunk_times.is_empty() && self.ranks.is_empty()
    }
}

/// The first step of a [`Prepared`]: the timed ledger and each pipeline rank's chunks.
pub struct Chunked<'a> {
    r: &'a Resolved,
    ledger: Cow<'a, Ledger>,
    s: Cow<'a, LedgerSummary>,
    chunks: Vec<Vec<ChunkContents>>,
}

impl<'a> Chunked<'a> {
    /// Splits the model over the pipeline ranks of `r`, with the timed ledger `ledger`, `s`
    /// ([`timed_ledger`]).
    pub fn new(r: &'a Resolved, ledger: Cow<'a, Ledger>, s: Cow<'a, LedgerSummary>) -> Chunked<'a> {
        Chunked {
            r,
            ledger,
            s,
            chunks: chunks_per_rank(r),
        }
    }

    /// As [`Prepared::memory_lower_bound`], before any timing.
    pub fn memory_lower_bound(&self) -> u64 {
        memory_lower_bound(self.r, &self.s, &self.ledger, &self.chunks)
    }

    /// [`Chunked::memory_lower_bound`] with the ranks' static memories from, and kept in,
    /// `memo` (a [`RunMemo`]: for the mixes of one run that share this timed ledger).
    pub fn memory_lower_bound_memo(&self, memo: &mut RunMemo) -> u64 {
        let (r, s, l) = (self.r, &*self.s, &*self.ledger);
        inflight_peak_bytes_memo(r, s, l, &self.chunks, 1, false, Some(&mut memo.statics))
    }

    /// The per-stage costs and what each rank does after its last backward, on `network`.
    pub fn prepare(self, network: Cow<'a, Network>) -> Result<Prepared<'a>, EstimateError> {
        self.prepare_with(network, None)
    }

    /// [`Chunked::prepare`] with chunk times and each rank's step-level collectives, tail and
    /// optimizer step taken from, and kept in, `memo` (a [`RunMemo`]: for the mixes of one run
    /// that share this timed ledger and `network`).
    pub fn prepare_memo(
        self,
        network: Cow<'a, Network>,
        memo: &mut RunMemo,
    ) -> Result<Prepared<'a>, EstimateError> {
        self.prepare_with(network, Some(memo))
    }

    /// [`Chunked::prepare_memo`], or with nothing kept past this mix (`None`: alike chunks and
    /// ranks are still worked out once within it).
    fn prepare_with(
        self,
        network: Cow<'a, Network>,
        memo: Option<&mut RunMemo>,
    ) -> Result<Prepared<'a>, EstimateError> {
        let mut own = RunMemo::default();
        let keep = memo.is_some();
        let memo = memo.unwrap_or(&mut own);
        let Chunked {
            r,
            ledger,
            s,
            chunks,
        } = self;
        let tr = &r.config.training;
        let rates = rates(r);
        let (chunk_times, costs) =
            stage_costs(r, &s, &ledger, &chunks, &network, &mut memo.chunk_times)?;
        // Ranks that hold the same blocks (the middle of a pipeline) issue the same step-level
        // collectives and have the same tail and optimizer step: each is worked out once.
        let mut step: Vec<Vec<StepCollective>> = Vec::new();
        let mut step_of: Vec<usize> = Vec::with_capacity(chunks.len());
        let mut after: Vec<(f64, f64)> = Vec::with_capacity(chunks.len());
        for (rank, ch) in chunks.iter().enumerate() {
            if let Some(same) = chunks[..rank].iter().position(|c| same_blocks(c, ch)) {
                step_of.push(step_of[same]);
                after.push(after[same]);
                continue;
            }
            if let Some((_, rank_step, done)) =
                memo.ranks.iter().find(|(k, _, _)| same_blocks(k, ch))
            {
                after.push(*done);
                step_of.push(step.len());
                step.push(rank_step.clone());
                continue;
            }
            let rank_step = step_collectives(r, &s, &ledger, ch);
            let p = rank_params(ch, &s);
            let updated = updated_params(r, &p);
            // The step also casts the updated weights for a low-precision recipe (once a
            // step, cached over the microbatches: model/low_precision.rs).
            let cast_bytes: u64 = ch
                .iter()
                .flat_map(|c| c.blocks(&s))
                .map(|(b, n)| b.quantized.step_bytes * n)
                .sum();
            let muon = crate::model::rank_muon(ch, &s);
            // CPU optimizer offload: the offloaded parameters step on the host
            // (src/memory/optimizer_offload.rs), the rest on the GPU.
            let offloaded = crate::memory::optimizer_offload::offloaded_params(r, updated);
            let on_gpu = updated - offloaded;
            let step_bytes = crate::model::optimizer_bytes(tr, on_gpu, muon.dense + muon.expert).1;
            let optimizer_s = rates.memory_s(step_bytes)
                + crate::op_cost::cast::kernel_s(&rates, cast_bytes)
                + muon_ns_s(r, &muon)
                + crate::memory::optimizer_offload::step_s(r, offloaded);
            let done = (
                dp_tail_s(r, &network, &ledger, &s, ch, &rank_step),
                optimizer_s,
            );
            after.push(done);
            if keep {
                memo.ranks.push((ch.clone(), rank_step.clone(), done));
            }
            step_of.push(step.len());
            step.push(rank_step);
        }
        Ok(Prepared {
            r,
            ledger,
            s,
            network,
            chunks,
            step,
            step_of,
            chunk_times,
            costs,
            after,
            peak: peak_flops(r),
        })
    }
}

/// Seconds of Muon's Newton-Schulz iterations on this rank (none under Adam): GEMMs at the
/// bf16 tensor-core rate (Megatron-Bridge's `muon_fp32_matmul_prec = "medium"` lets fp32
/// matmuls run in bf16) and the profile's matmul efficiency.
fn muon_ns_s(r: &Resolved, m: &crate::model::muon::MuonSums) -> f64 {
    if r.config.training.optimizer != crate::config::Optimizer::Muon || m.ns_flops <= 0.0 {
        return 0.0;
    }
    let peak = r.gpu.peak_flops.bf16 * r.gpu.matmul_efficiency_for(crate::config::Precision::Bf16);
    m.ns_flops / peak
}

/// A second lower bound of the step for the schedules that run stage s < pp on rank s and
/// keep each rank's actions in sequence (GPipe, 1F1B, ZB-H1, interleaved 1F1B), simulated in
/// full. Rank r starts only after the first microbatch's forward has passed the stages
/// before r; every forward and input gradient of its chunks precedes the last microbatch's
/// input gradient on its first chunk (stage r), whose gradient then passes back through the
/// stages before r to rank 0, which still runs that microbatch's weight gradient (fused into
/// the backward but for ZB-H1), its data-parallel tail and its optimizer step. Hops only add.
/// 0 where it does not apply (the other bound stands).
/// `schedule` stands for the configuration's own: GPipe, 1F1B and ZB-H1 place and cost a
/// split alike, so one [`Prepared`] serves all three.
pub(super) fn drain_lower_bound(p: &Prepared<'_>, schedule: crate::config::ScheduleKind) -> f64 {
    use crate::config::ScheduleKind;
    let r = p.r;
    let par = &r.config.parallel;
    let pp = par.pp as usize;
    let m = r.microbatches;
    let fused = match schedule {
        ScheduleKind::Gpipe | ScheduleKind::OneFOneB | ScheduleKind::Interleaved1F1B => true,
        ScheduleKind::ZbH1 => false,
        _ => return 0.0,
    };
    let t = &p.chunk_times;
    let placed = p.chunks.len() == pp
        && p.chunks.iter().enumerate().all(|(rank, ch)| {
            ch.iter().any(|c| c.stage == rank)
                && ch.iter().all(|c| c.stage >= rank && c.stage < t.len())
        });
    if pp < 2 || !placed || !crate::schedule::simulates_in_full(schedule, par.pp, m) {
        return 0.0;
    }
    let b = |s: usize| t[s].input_grad + if fused { t[s].weight_grad } else { 0.0 };
    let (tail, opt) = p.after.first().copied().unwrap_or((0.0, 0.0));
    let w0 = if fused { 0.0 } else { t[0].weight_grad };
    let mut chain = 0.0; // forward and input gradient over the stages before rank r's first
    let mut best: f64 = 0.0;
    for (rank, ch) in p.chunks.iter().enumerate() {
        let busy: f64 = ch.iter().map(|c| t[c.stage].fwd + b(c.stage)).sum();
        best = best.max(chain + f64::from(m) * busy);
        chain += t[rank].fwd + b(rank);
    }
    let lb = (best + w0 + tail + opt) * (1.0 - 1e-9);
    if lb.is_finite() {
        lb
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Layer};
    use crate::layout::Layout;

    fn resolved(parallel: serde_json::Value) -> Resolved {
        let cfg = Config::from_layers(&[Layer::overrides(serde_json::json!({
            "model": {"preset": "llama3-8b"},
            "cluster": {"num_gpus": 64, "gpus_per_node": 8},
            "parallel": parallel,
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 64}
        }))])
        .expect("config");
        Resolved::new(cfg).expect("valid")
    }

    /// A run's memo (one timed ledger, mixes differing only in their pipeline split) gives each
    /// mix the memory lower bound and in-flight peaks it gets without one, whether the memo
    /// holds the mix's ranks already (the second pass) or not; the memo is filled, then used.
    #[test]
    fn run_memo_gives_the_bounds_worked_out_afresh() {
        // Llama-3-8B's 32 layers over pp 4: even, uneven ends, and interleaved.
        let splits = [
            serde_json::json!({"tp": 2, "pp": 4, "zero": 1}),
            serde_json::json!({"tp": 2, "pp": 4, "zero": 1, "first_stage_layers": 5, "last_stage_layers": 9}),
            serde_json::json!({"tp": 2, "pp": 4, "zero": 1, "first_stage_layers": 7, "last_stage_layers": 7}),
            serde_json::json!({"tp": 2, "pp": 4, "zero": 1, "vpp": 2, "schedule": "interleaved-1f1b"}),
            serde_json::json!({"tp": 2, "pp": 4, "zero": 1, "first_stage_layers": 10, "last_stage_layers": 6}),
        ];
        let runs: Vec<Resolved> = splits.into_iter().map(resolved).collect();
        let network = Network::new(&Layout::of(&runs[0]), &runs[0].gpu);
        let (ledger, s) = timed_ledger(&runs[0], &network);
        let mut memo = RunMemo::default();
        let mut statics = RankStaticMemo::default();
        for pass in 0..2 {
            for r in &runs {
                let c = Chunked::new(r, Cow::Borrowed(&ledger), Cow::Borrowed(&s));
                let fresh = c.memory_lower_bound();
                assert!(fresh > 0);
                assert_eq!(c.memory_lower_bound_memo(&mut memo), fresh, "pass {pass}");
                for (sets, split) in [(3, false), (1, true), (5, false), (3, false)] {
                    let alone = inflight_peak_bytes(r, &s, &ledger, &c.chunks, sets, split);
                    let kept = inflight_peak_bytes_memo(
                        r,
                        &s,
                        &ledger,
                        &c.chunks,
                        sets,
                        split,
                        Some(&mut statics),
                    );
                    assert_eq!(kept, alone, "pass {pass}, {sets} sets, split {split}");
                }
            }
        }
        assert!(!memo.is_empty() && !statics.is_empty());
    }
}
