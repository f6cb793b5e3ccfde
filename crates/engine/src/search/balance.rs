//! Cost-balanced uneven pipeline splits. The first pipeline stage also runs the embedding and
//! the last one the output layer and the loss, so an even layer split leaves the last stage the
//! slowest (for Llama-3-70B on pp 8 the output layer costs about 1.3 layers); Megatron-Core lets
//! a run move layers off it (`--decoder-last-pipeline-num-layers`,
//! `--pipeline-model-parallel-layout`). The search tries the split that balances the stages'
//! model FLOPs, and the simulation then decides whether it is faster.

use crate::config::{Config, ParallelConfig, Resolved};
use crate::model::Ledger;

/// The embedding's and the output layer's (with the loss) cost, in units of one mean layer's
/// model FLOPs (forward + input gradient + weight gradient).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndCosts {
    pub embedding: f64,
    pub output: f64,
}

/// The end costs of `base`'s model, from its op ledger built without any parallelism (FLOPs
/// ratios do not depend on the split). `None` when that configuration does not resolve.
pub fn end_costs(base: &Config) -> Option<EndCosts> {
    let mut c = base.clone();
    c.parallel = ParallelConfig {
        tp: 1,
        sp: false,
        ..ParallelConfig::default()
    };
    c.cluster.num_gpus = 1;
    c.cluster.gpus_per_node = Some(1);
    c.training.micro_batch_size = 1;
    c.training.global_batch_size = 1;
    let r = Resolved::new(c).ok()?;
    let ledger = Ledger::build(&r);
    let m = &r.config.model;
    let layers = m.num_layers as f64;
    let moe_layers = m.num_moe_layers() as f64;
    let dense = ledger.dense.model_flops().total();
    let moe = ledger.moe.as_ref().map_or(0.0, |b| b.model_flops().total());
    let mean_layer = if ledger.variants.is_empty() {
        ((layers - moe_layers) * dense + moe_layers * moe) / layers
    } else {
        // Windowed layers apart: the mean over every decoder layer of the model.
        let whole = crate::model::ChunkContents::whole_model(m);
        let decoder = crate::model::ChunkContents {
            embedding: false,
            output: false,
            mtp_layers: 0,
            ..whole
        };
        decoder
            .ledger_blocks(&ledger)
            .map(|(b, n)| n as f64 * b.model_flops().total())
            .sum::<f64>()
            / layers
    };
    let per_layer = |f: f64| f / mean_layer;
    let costs = EndCosts {
        embedding: per_layer(ledger.embedding.model_flops().total()),
        output: per_layer(ledger.output.model_flops().total()),
    };
    (mean_layer > 0.0 && costs.embedding.is_finite() && costs.output.is_finite()).then_some(costs)
}

/// The stage costs of a split with `first` layers on the first stage, `last` on the last and
/// the rest spread over the middle stages as evenly as possible (later stages take the extra
/// layer: under 1F1B stage i holds p - i microbatches' activations, so a later stage pays less
/// memory for it): `None` when some stage would hold no layer.
pub fn stage_layers(layers: u32, pp: u32, first: u32, last: u32) -> Option<Vec<u32>> {
    if pp < 2 || first == 0 || last == 0 || first + last > layers {
        return None;
    }
    let middle = pp - 2;
    let rest = layers - first - last;
    if middle == 0 {
        return (rest == 0).then(|| vec![first, last]);
    }
    if rest < middle {
        return None;
    }
    let (base, extra) = (rest / middle, rest % middle);
    let mut v = Vec::with_capacity(pp as usize);
    v.push(first);
    v.extend((0..middle).map(|i| base + (i >= middle - extra) as u32));
    v.push(last);
    Some(v)
}

/// The (first, last) stage layer counts whose split has the cheapest most expensive stage
/// (the pipeline runs at its slowest stage's pace); among those the most even one (least
/// sum of squared stage costs), then the one with the fewest layers on the first stage (it
/// holds the most microbatches' activations under 1F1B).
pub fn balanced_split(layers: u32, pp: u32, ends: EndCosts) -> Option<(u32, u32)> {
    let mut best: Option<(f64, f64, u32, u32)> = None;
    for first in 1..=layers {
        for last in 1..=layers - first {
            let Some(split) = EvenMiddle::of(layers, pp, first, last) else {
                continue;
            };
            let w = split.worst(ends);
            // The sum of squares only breaks a tie of the worst stage.
            if best.is_some_and(|(bw, _, _, _)| w > bw + 1e-9) {
                continue;
            }
            let sq = split.squares(ends);
            let better = match best {
                None => true,
                Some((bw, bsq, _, _)) => w < bw - 1e-9 || (w <= bw + 1e-9 && sq < bsq - 1e-9),
            };
            if better {
                best = Some((w, sq, first, last));
            }
        }
    }
    best.map(|(_, _, f, l)| (f, l))
}

/// [`stage_layers`]' split without its list: the first and last stages' layers, and the
/// middle stages' `base` layers, the last `extra` of them one more. [`balanced_split`] weighs
/// every (first, last), so it reads each split's worst stage and sum of squared costs from
/// these without building a list per split. A stage's cost, in layer units, is its layers
/// plus the embedding's cost on the first and the output layer's on the last.
struct EvenMiddle {
    first: u32,
    last: u32,
    middle: u32,
    base: u32,
    extra: u32,
}

impl EvenMiddle {
    /// As [`stage_layers`] (`None` where it gives none).
    fn of(layers: u32, pp: u32, first: u32, last: u32) -> Option<EvenMiddle> {
        if pp < 2 || first == 0 || last == 0 || first + last > layers {
            return None;
        }
        let middle = pp - 2;
        let rest = layers - first - last;
        if (middle == 0 && rest != 0) || rest < middle {
            return None;
        }
        // No middle stage: no middle layers.
        let base = rest.checked_div(middle).unwrap_or(0);
        let extra = rest.checked_rem(middle).unwrap_or(0);
        Some(EvenMiddle {
            first,
            last,
            middle,
            base,
            extra,
        })
    }

    /// The middle stages' layers, in stage order.
    fn middle_layers(&self) -> impl Iterator<Item = u32> + '_ {
        let (m, e) = (self.middle, self.extra);
        (0..m).map(move |i| self.base + u32::from(i >= m - e))
    }

    /// Each stage's cost in layer units, in stage order.
    fn costs(&self, ends: EndCosts) -> impl Iterator<Item = f64> + '_ {
        let first = self.first as f64 + ends.embedding + 0.0;
        let last = self.last as f64 + 0.0 + ends.output;
        std::iter::once(first)
            .chain(self.middle_layers().map(|l| l as f64 + 0.0 + 0.0))
            .chain(std::iter::once(last))
    }

    /// The most expensive stage's cost (the middle's largest stage is its last).
    fn worst(&self, ends: EndCosts) -> f64 {
        let first = self.first as f64 + ends.embedding + 0.0;
        let last = self.last as f64 + 0.0 + ends.output;
        let middle = self
            .middle_layers()
            .last()
            .map_or(0.0, |l| l as f64 + 0.0 + 0.0);
        [first, middle, last].into_iter().fold(0.0, f64::max)
    }

    /// The sum of squared stage costs, in stage order.
    fn squares(&self, ends: EndCosts) -> f64 {
        self.costs(ends).map(|c| c * c).sum()
    }
}

/// Megatron-Core's layout string for a split (`E` embedding, `t` layer, `L` loss, `|` between
/// stages), e.g. `Et*11|t*10|t*10|t*9L`.
/// Megatron-Core layouts for interleaving when `layers` does not split evenly over `stages`
/// virtual stages: every stage holds `ceil(layers / stages)` but the last, which gives up the
/// shortfall (it also runs the output layer and the loss) and keeps at least one layer.
/// Kimi K2's recipes on GB200 and GB300 are this shape: 61 layers as `Et*4|(t*4|)*14tL` on
/// 16 stages. Returns the (first, last) stages' layers, `None` when the last stage cannot
/// absorb the shortfall. (Layouts that also shorten the first stage, such as `Et|(tt|)*30L`,
/// are left to `parallel.pipeline_layout`: each would add candidates to every search.)
pub fn short_end_stages(layers: u32, stages: u32) -> Option<(u32, u32)> {
    if stages < 2 || layers < stages || layers % stages == 0 {
        return None;
    }
    let per = layers.div_ceil(stages);
    let short = per * stages - layers;
    (short < per).then(|| (per, per - short))
}

/// The explicit layout holding `split[s]` layers on stage s, the embedding on the first and
/// `mtp` MTP layers and the loss on the last (Megatron-Core's `pipeline_model_parallel_layout`,
/// DeepSeek-V3's `...|t*1mL`).
pub fn layout_string(split: &[u32], mtp: u32) -> String {
    let n = split.len();
    split
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let e = if i == 0 { "E" } else { "" };
            let end = if i + 1 == n {
                format!("{}L", "m".repeat(mtp as usize))
            } else {
                String::new()
            };
            format!("{e}t*{l}{end}")
        })
        .collect::<Vec<_>>()
        .join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every composition of `layers` into `pp` positive parts (brute force, small cases).
    fn compositions(layers: u32, pp: u32) -> Vec<Vec<u32>> {
        if pp == 1 {
            return vec![vec![layers]];
        }
        (1..layers)
            .flat_map(|h| {
                compositions(layers - h, pp - 1)
                    .into_iter()
                    .map(move |mut t| {
                        t.insert(0, h);
                        t
                    })
            })
            .collect()
    }

    /// Each stage's cost in layer units, from the split's list.
    fn stage_costs(split: &[u32], ends: EndCosts) -> impl Iterator<Item = f64> + '_ {
        let n = split.len();
        split.iter().enumerate().map(move |(i, &l)| {
            l as f64
                + if i == 0 { ends.embedding } else { 0.0 }
                + if i + 1 == n { ends.output } else { 0.0 }
        })
    }

    /// The most expensive stage of a split, in layer units.
    fn worst_stage(split: &[u32], ends: EndCosts) -> f64 {
        stage_costs(split, ends).fold(0.0, f64::max)
    }

    /// The split read without its list gives, to the bit, the costs, worst stage and sum of
    /// squares of [`stage_layers`]' list, and exists exactly where the list does.
    #[test]
    fn the_split_without_its_list_is_the_list() {
        let ends = EndCosts {
            embedding: 0.37,
            output: 2.9,
        };
        let mut compared = 0;
        for layers in 1..=40 {
            for pp in 0..=9 {
                for first in 0..=layers + 1 {
                    for last in 0..=layers + 1 {
                        let list = stage_layers(layers, pp, first, last);
                        let split = EvenMiddle::of(layers, pp, first, last);
                        assert_eq!(
                            list.is_some(),
                            split.is_some(),
                            "{layers} {pp} {first} {last}"
                        );
                        let (Some(list), Some(split)) = (list, split) else {
                            continue;
                        };
                        let bits =
                            |c: Vec<f64>| c.into_iter().map(f64::to_bits).collect::<Vec<_>>();
                        assert_eq!(
                            bits(split.costs(ends).collect()),
                            bits(stage_costs(&list, ends).collect())
                        );
                        assert_eq!(
                            split.worst(ends).to_bits(),
                            worst_stage(&list, ends).to_bits()
                        );
                        let sq: f64 = stage_costs(&list, ends).map(|c| c * c).sum();
                        assert_eq!(split.squares(ends).to_bits(), sq.to_bits());
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 10_000, "{compared}");
    }

    #[test]
    fn the_balanced_split_is_as_good_as_the_best_of_all_splits() {
        // The middle stages carry no end cost, so spreading them evenly loses nothing: the
        // first/last search must reach the optimum over every composition.
        for (layers, pp) in [(8, 3), (10, 4), (12, 4), (9, 5), (7, 2)] {
            for ends in [
                EndCosts {
                    embedding: 0.0,
                    output: 1.3,
                },
                EndCosts {
                    embedding: 0.1,
                    output: 2.7,
                },
                EndCosts {
                    embedding: 0.0,
                    output: 0.0,
                },
            ] {
                let (f, l) = balanced_split(layers, pp, ends).unwrap();
                let got = worst_stage(&stage_layers(layers, pp, f, l).unwrap(), ends);
                let best = compositions(layers, pp)
                    .iter()
                    .map(|c| worst_stage(c, ends))
                    .fold(f64::INFINITY, f64::min);
                assert!(
                    (got - best).abs() < 1e-9,
                    "{layers} layers pp {pp} {ends:?}: {got} vs {best}"
                );
            }
        }
    }

    #[test]
    fn without_end_costs_the_even_split_is_kept() {
        let zero = EndCosts {
            embedding: 0.0,
            output: 0.0,
        };
        assert_eq!(balanced_split(80, 8, zero), Some((10, 10)));
        assert_eq!(stage_layers(80, 8, 10, 10).unwrap(), vec![10; 8]);
    }

    #[test]
    fn the_layout_string_parses_back_to_the_split() {
        let split = stage_layers(80, 8, 11, 8).unwrap();
        assert_eq!(split.iter().sum::<u32>(), 80);
        let s = layout_string(&split, 0);
        assert_eq!(s, "Et*11|t*10|t*10|t*10|t*10|t*10|t*11|t*8L");
        let stages = crate::config::rules::pipeline_layout::parse(&s).unwrap();
        let decoder: Vec<u32> = stages.iter().map(|st| st.decoder).collect();
        assert_eq!(decoder, split);
    }

    #[test]
    fn short_end_stages_give_kimi_k2s_published_layout() {
        // Megatron-Bridge's Kimi K2 recipes on GB200/GB300: 61 layers as `Et*4|(t*4|)*14tL`
        // (pp 4 x vpp 4).
        assert_eq!(short_end_stages(61, 16), Some((4, 1)));
        assert_eq!(
            layout_string(
                &[4].repeat(15).into_iter().chain([1]).collect::<Vec<_>>(),
                0
            ),
            format!("Et*4|{}t*1L", "t*4|".repeat(14))
        );
        // 32 stages would need the first stage short too: not this family's.
        assert_eq!(short_end_stages(61, 32), None);
        // An even split is not this family's.
        assert_eq!(short_end_stages(64, 16), None);
    }

    #[test]
    fn short_end_stages_hold_every_layer_with_no_stage_above_the_middle() {
        for stages in 2..40u32 {
            for layers in 1..200u32 {
                let Some((first, last)) = short_end_stages(layers, stages) else {
                    continue;
                };
                let per = layers.div_ceil(stages);
                assert_eq!(
                    first + (stages - 2) * per + last,
                    layers,
                    "{layers}/{stages}"
                );
                assert!(
                    first >= 1 && first <= per && last < per,
                    "{layers}/{stages}"
                );
                // The first gives up layers only once the last holds none.
                assert!(first == per || last == 0, "{layers}/{stages}");
            }
        }
    }
}
