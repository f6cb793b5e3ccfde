//! torchtitan's pipeline settings: the schedule (torch.distributed.pipelining's names), the
//! stages per rank, and how the layers split over the stages
//! (torchtitan/distributed/pipeline_parallel.py: `pipeline_llm`,
//! `generate_llm_fqn_per_model_part`).

use super::job::Job;
use super::parallelism::Degrees;
use super::{Out, TorchtitanError};
use crate::config::megatron::put;
use crate::config::pipeline_layout::accounted_stage_layers;
use crate::config::ScheduleKind;
use serde_json::{json, Map, Value};

const SCHEDULE: &str = "parallelism.pipeline_parallel_schedule";
const FIRST: &str = "parallelism.pipeline_parallel_first_stage_less_layers";
const LAST: &str = "parallelism.pipeline_parallel_last_stage_less_layers";
const PER_STAGE: &str = "parallelism.pipeline_parallel_layers_per_stage";

/// A schedule: torch's name (matched without case, as `get_schedule_class` does) and parsim's
/// schedule, or why parsim has none. `multi`: a `PipelineScheduleMulti` (several stages a rank).
struct Schedule {
    torch: &'static str,
    parsim: Result<ScheduleKind, &'static str>,
    multi: bool,
}

/// torch.distributed.pipelining's schedules (torch/distributed/pipelining/schedules.py).
const SCHEDULES: &[Schedule] = &[
    Schedule {
        torch: "GPipe",
        parsim: Ok(ScheduleKind::Gpipe),
        multi: false,
    },
    Schedule {
        torch: "1F1B",
        parsim: Ok(ScheduleKind::OneFOneB),
        multi: false,
    },
    Schedule {
        torch: "Interleaved1F1B",
        parsim: Ok(ScheduleKind::Interleaved1F1B),
        multi: true,
    },
    Schedule {
        torch: "ZBVZeroBubble",
        parsim: Ok(ScheduleKind::ZbV),
        multi: true,
    },
    Schedule {
        torch: "DualPipeV",
        parsim: Ok(ScheduleKind::DualPipeV),
        multi: true,
    },
    Schedule {
        torch: "LoopedBFS",
        parsim: Err("parsim has no breadth-first looped schedule"),
        multi: true,
    },
    Schedule {
        torch: "InterleavedZeroBubble",
        parsim: Err("parsim's zero-bubble ZB-H1 runs one model chunk per rank, not interleaved"),
        multi: true,
    },
    Schedule {
        torch: "PipelineScheduleSingle",
        parsim: Err("a schedule read from a CSV file is not modelled"),
        multi: false,
    },
    Schedule {
        torch: "PipelineScheduleMulti",
        parsim: Err("a schedule read from a CSV file is not modelled"),
        multi: true,
    },
];

/// Puts the pipeline settings of `job` with `pp` ranks over a model of `layers` decoder
/// layers into `layer`: `parallel.pp`, `vpp`, `schedule`, and the split (Megatron-Core's
/// embedding/loss slots where torchtitan's split is theirs, else an explicit layout).
pub fn put_pipeline(
    job: &Job,
    d: &Degrees,
    layers: u32,
    out: &mut Out,
) -> Result<(), TorchtitanError> {
    let (pp, layer) = (d.pp, &mut out.layer);
    put(layer, "parallel", "pp", json!(pp));
    if pp == 1 {
        return Ok(());
    }
    let name = job.string(SCHEDULE).unwrap_or_default();
    let schedule = SCHEDULES
        .iter()
        .find(|s| s.torch.eq_ignore_ascii_case(&name))
        .ok_or_else(|| {
            let known: Vec<&str> = SCHEDULES.iter().map(|s| s.torch).collect();
            job.invalid(
                SCHEDULE,
                format!(
                    "unknown schedule '{name}' (torch.distributed.pipelining has {})",
                    known.join(", ")
                ),
            )
        })?;
    let kind = schedule
        .parsim
        .map_err(|reason| job.unmodelled(SCHEDULE, reason))?;
    let weight = |path: &str| -> Result<u32, TorchtitanError> {
        job.int(path)
            .and_then(|w| u32::try_from(w).ok())
            .ok_or_else(|| job.invalid(path, "must be 0 or more layers"))
    };
    let (first, last) = (weight(FIRST)?, weight(LAST)?);
    let effective = u64::from(layers) + u64::from(first) + u64::from(last);
    let stages_per_rank = match job.int(PER_STAGE) {
        None => 1 + u32::from(schedule.multi),
        Some(per) if per >= 1 => {
            let stages = effective.div_ceil(per as u64);
            if stages % u64::from(pp) != 0 {
                return Err(job.invalid(
                    PER_STAGE,
                    format!("{stages} stages ({layers} layers + {first} + {last}, {per} a stage) do not divide over pipeline_parallel_degree {pp} (pipeline_llm)"),
                ));
            }
            let per_rank = u32::try_from(stages / u64::from(pp)).unwrap_or(u32::MAX);
            if !schedule.multi && per_rank != 1 {
                return Err(job.invalid(
                    PER_STAGE,
                    format!(
                        "{} runs one stage a rank, got {per_rank} (pipeline_llm)",
                        schedule.torch
                    ),
                ));
            }
            if schedule.multi && per_rank < 2 {
                return Err(job.invalid(
                    PER_STAGE,
                    format!(
                        "{} runs at least 2 stages a rank, got {per_rank} (pipeline_llm)",
                        schedule.torch
                    ),
                ));
            }
            per_rank
        }
        Some(per) => return Err(job.invalid(PER_STAGE, format!("must be at least 1, got {per}"))),
    };
    let stages = pp.saturating_mul(stages_per_rank);
    let split = stage_layers(job, layers, stages, first, last)?;
    put(layer, "parallel", "vpp", json!(stages_per_rank));
    put(layer, "parallel", "schedule", json!(kind.as_str()));
    put_split(&split, first, last, pp, layer);
    Ok(())
}

/// Writes the split: nothing for an even split without embedding/loss slots, Megatron-Core's
/// slots where the split is theirs, else the layout string stage by stage.
fn put_split(split: &[u32], first: u32, last: u32, pp: u32, layer: &mut Map<String, Value>) {
    let layers: u32 = split.iter().sum();
    let vpp = split.len() as u32 / pp;
    let slots = |e: bool, l: bool| accounted_stage_layers(layers, pp, vpp, e, l).ok();
    let (e, l) = (first == 1, last == 1);
    if first <= 1 && last <= 1 && slots(e, l).as_deref() == Some(split) {
        if e {
            put(
                layer,
                "parallel",
                "account_for_embedding_in_pipeline_split",
                json!(true),
            );
        }
        if l {
            put(
                layer,
                "parallel",
                "account_for_loss_in_pipeline_split",
                json!(true),
            );
        }
        return;
    }
    let last_stage = split.len() - 1;
    let text: Vec<String> = split
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut s = String::new();
            if i == 0 {
                s.push('E');
            }
            if n > 0 {
                s.push_str(&format!("t*{n}"));
            }
            if i == last_stage {
                s.push('L');
            }
            s
        })
        .collect();
    put(layer, "parallel", "pipeline_layout", json!(text.join("|")));
}

/// Decoder layers of each stage as torchtitan's `generate_llm_fqn_per_model_part` splits
/// them: the embedding weighs `first` layers and the output `last`; the effective layers
/// divide evenly and the first stages take one more each of what is left over.
pub fn stage_layers(
    job: &Job,
    layers: u32,
    stages: u32,
    first: u32,
    last: u32,
) -> Result<Vec<u32>, TorchtitanError> {
    let effective = layers + first + last;
    if stages > effective {
        return Err(job.invalid(
            "parallelism.pipeline_parallel_degree",
            format!("{stages} stages exceed the {effective} effective layers ({layers} + {first} + {last}; generate_llm_fqn_per_model_part)"),
        ));
    }
    let per = effective / stages;
    let extra = effective % stages;
    for (path, w) in [(FIRST, first), (LAST, last)] {
        if w > per {
            return Err(job.invalid(
                path,
                format!("{w} exceeds the {per} layers of the smallest stage (generate_llm_fqn_per_model_part)"),
            ));
        }
    }
    let mut left = layers;
    let out = (0..stages)
        .map(|i| {
            let mut n = per + u32::from(i < extra);
            if i == 0 {
                n -= first;
            } else if i == stages - 1 {
                n -= last;
            }
            let take = n.min(left);
            left -= take;
            take
        })
        .collect();
    Ok(out)
}
