//! What each split of the GPUs can try: the micro batch sizes, the pipeline arrangements of
//! the layers over pp ranks, and the expert-parallel sizes (the knobs the enumeration turns
//! inside a split, and whose absence skips a split, search/grid.rs).

use super::balance;
use super::mix::Slots;
use crate::config::{Config, ScheduleKind};

/// The divisors of `n` in increasing order, in O(sqrt n).
pub(super) fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d <= n / d {
        if n % d == 0 {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// The micro batch sizes tried: powers of two up to `mbs_max`, and `mbs_max` itself when it
/// is not one (a recipe's micro batch of 3), never above the global batch (a larger one
/// cannot divide it), so a huge `--mbs-max` neither wraps nor loops.
pub(super) fn micro_batches(mbs_max: u64, gbs: u64) -> impl Iterator<Item = u64> {
    let most = mbs_max.min(gbs);
    (0..u64::BITS)
        .map(|i| 1u64 << i)
        .take_while(move |&b| b <= most)
        .chain((most == mbs_max && !mbs_max.is_power_of_two()).then_some(mbs_max))
}

/// One pipeline arrangement: (vpp, schedule, first-stage layers, last-stage layers, slots).
type Pipe = (u32, ScheduleKind, Option<u32>, Option<u32>, Slots);

/// Every pipeline arrangement of `layers` over `pp` ranks: even splits with every vpp that
/// divides them (interleaved) and the V schedules; Megatron-style uneven first/last stages;
/// and the balanced splits that count the embedding and/or the loss as a layer slot, with
/// every vpp those allow (Llama-3-405B's 126 layers + 2 slots over pp 16); and, where none of
/// those splits exists, interleaving with short end stages ([`balance::short_end_stages`]).
pub(super) fn pipelines(layers: u32, pp: u32, ends: Option<balance::EndCosts>) -> Vec<Pipe> {
    let none = Slots::default();
    if pp == 1 {
        return vec![(1, ScheduleKind::OneFOneB, None, None, none)];
    }
    let mut pipes = Vec::new();
    let mut splits: Vec<(Option<u32>, Option<u32>)> = Vec::new();
    if layers % pp == 0 {
        splits.push((None, None));
    } else if pp >= 3 {
        // Megatron-style: middle stages take ceil(L/p), the ends share the rest.
        let mid = layers.div_ceil(pp);
        let rest = layers as i64 - (pp as i64 - 2) * mid as i64;
        if rest >= 2 {
            let f = (rest / 2) as u32;
            splits.push((Some(f), Some(rest as u32 - f)));
        }
    }
    // The split that balances the stages' FLOPs when the output layer and loss (and the
    // embedding) are counted: the middle stages share the rest as evenly as they can.
    if let Some(fl) = ends.and_then(|e| balance::balanced_split(layers, pp, e)) {
        let even = layers % pp == 0 && fl == (layers / pp, layers / pp);
        if !even && !splits.contains(&(Some(fl.0), Some(fl.1))) {
            splits.push((Some(fl.0), Some(fl.1)));
        }
    }
    for &(f, l) in &splits {
        for k in [
            ScheduleKind::Gpipe,
            ScheduleKind::OneFOneB,
            ScheduleKind::ZbH1,
        ] {
            pipes.push((1, k, f, l, none));
        }
    }
    if layers % pp == 0 {
        let per = layers / pp;
        for v in (2..=per).filter(|v| per % v == 0) {
            pipes.push((v, ScheduleKind::Interleaved1F1B, None, None, none));
        }
        if per % 2 == 0 {
            pipes.push((2, ScheduleKind::ZbV, None, None, none));
            pipes.push((2, ScheduleKind::DualPipeV, None, None, none));
        }
    }
    for (embedding, loss) in [(true, true), (true, false), (false, true)] {
        let slots_n = layers + embedding as u32 + loss as u32;
        if slots_n % pp != 0 {
            continue;
        }
        let per = slots_n / pp;
        let slots = Slots { embedding, loss };
        // A stage holding only the embedding or only the loss is allowed; one that would
        // hold both (a single slot on a single stage) is not.
        for v in (1..=per).filter(|v| per % v == 0) {
            let k = if v == 1 {
                ScheduleKind::OneFOneB
            } else {
                ScheduleKind::Interleaved1F1B
            };
            pipes.push((v, k, None, None, slots));
        }
    }
    // Interleaving at every vpp the splits above do not give (Kimi K2's 61 layers on pp 4 x
    // vpp 4; DeepSeek-V3's 61 and its MTP layer on pp 2 x vpp 8, where the slot split gives
    // only vpp 31): Megatron-Core's explicit layouts whose end virtual stages are short, the
    // MTP layers on the last. For a Mix with vpp > 1, first/last are the end virtual stages'
    // layers (Mix::apply writes the layout).
    for v in 2..=layers / pp {
        if pipes.iter().any(|p| p.0 == v) {
            continue;
        }
        if let Some((first, last)) = balance::short_end_stages(layers, pp * v) {
            pipes.push((
                v,
                ScheduleKind::Interleaved1F1B,
                Some(first),
                Some(last),
                none,
            ));
        }
    }
    pipes
}

/// The ep sizes to try over `stage_ranks` (tp x cp x dp) ranks: on Megatron-Core's expert
/// grid (expert_tp x ep x expert dp over a pipeline stage's ranks), the divisors of
/// `stage_ranks` / expert_tp that divide the experts, so ep may exceed dp; 1 for a dense model.
pub(super) fn expert_parallel_sizes(base: &Config, stage_ranks: u64) -> Vec<u64> {
    let m = &base.model;
    let etp = u64::from(base.parallel.etp());
    if !m.is_moe() || etp == 0 || stage_ranks % etp != 0 {
        return if m.is_moe() { Vec::new() } else { vec![1] };
    }
    divisors(stage_ranks / etp)
        .into_iter()
        .filter(|e| u64::from(m.num_experts) % e == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules::pipeline_layout;
    use crate::config::{Config, Layer};

    #[test]
    fn deepseek_v3s_pp2_vpp8_layout_is_enumerated_with_its_mtp_layer() {
        // Megatron-Bridge's DeepSeek-V3 recipe on 256 GB200/GB300 (pp 2 x vpp 8):
        // set_deepseek_v3_pipeline_model_parallel_layout's 16-stage layout
        // `Et*4|(t*4|)*14,tmL`. The slot splits give pp 2 only vpp 1 and 31 (62 / 2 = 31
        // slots a rank), so vpp 8 comes from the short-end-stage family, the MTP on the last.
        let pipes = pipelines(61, 2, None);
        assert!(pipes.iter().any(|p| p.0 == 8
            && p.1 == ScheduleKind::Interleaved1F1B
            && (p.2, p.3) == (Some(4), Some(1))));
        let base = Config::from_layers(&[Layer::overrides(serde_json::json!({
            "model": {"preset": "deepseek-v3", "mtp_num_layers": 1},
            "cluster": {"gpu": "gb300", "num_gpus": 256, "gpus_per_node": 4},
            "training": {"precision": "mxfp8", "seq_length": 4096, "global_batch_size": 4096}
        }))])
        .unwrap();
        let published = pipeline_layout::parse("Et*4|(t*4|)*14,tmL").unwrap();
        let found = super::super::enumerate(&base, 1)
            .into_iter()
            .filter(|m| (m.tp, m.pp, m.vpp, m.ep) == (1, 2, 8, 32))
            .filter_map(|m| m.apply(&base).parallel.pipeline_layout)
            .any(|l| pipeline_layout::parse(&l).unwrap() == published);
        assert!(found, "no pp 2 x vpp 8 mix with the published layout");
    }
}
