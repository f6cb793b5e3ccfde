//! Validation as rule groups: each group is a small function returning the violations it
//! finds, so a user sees every problem at once and each rule is tested on its own. Bounds run
//! first (the other groups divide by sizes they guarantee positive); [`super::Resolved`] is
//! built only from a configuration that passed.

mod batch;
mod bounds;
mod cluster;
mod context;
mod dispatch;
mod experts;
mod lora;
mod optimizer_state;
mod parallel;
mod per_op;
mod pipeline;
pub mod pipeline_layout;
mod precision;
mod shape;
mod training;

pub use context::ulysses_splits_heads;
pub use pipeline::stage_layer_counts;

use super::{Config, ConfigError, GpuProfile, PositionEmbedding, Violation};

/// Divisors of `n` in increasing order (for hints).
pub fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// `1, 2, 4` for a hint.
fn fmt_list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// tp x cp x pp, the GPUs of one data-parallel replica: three 32-bit degrees multiply into
/// at most 96 bits, so the product is exact in u128 whatever the degrees (the rules run on
/// every field at once, also beside a degree the size rules refuse).
pub fn model_parallel(p: &super::ParallelConfig) -> u128 {
    u128::from(p.tp) * u128::from(p.cp) * u128::from(p.pp)
}

/// Data-parallel degree: num_gpus / (tp x cp x pp), or None when it does not divide (the
/// parallel-degree group reports that).
pub fn data_parallel(c: &Config) -> Option<u64> {
    let model_parallel = model_parallel(&c.parallel);
    let world = u128::from(c.cluster.num_gpus);
    // The quotient of a 32-bit world is a 32-bit number.
    (model_parallel > 0 && world % model_parallel == 0).then(|| (world / model_parallel) as u64)
}

/// Every rule group, in the order their violations are listed.
pub fn check(c: &Config, gpu: &GpuProfile) -> Result<(), ConfigError> {
    let mut errs = bounds::sizes(c);
    if errs.is_empty() {
        errs.extend(bounds::model_size(c));
    }
    if !errs.is_empty() {
        return Err(ConfigError::Invalid(errs));
    }
    let groups: [&dyn Fn() -> Vec<Violation>; 26] = [
        &|| shape::heads(c),
        &|| shape::layer_patterns(c),
        &|| experts::model(c),
        &|| shape::mla(c),
        &|| parallel::world(c),
        &|| cluster::nvlink_domain(c),
        &|| parallel::tensor(c),
        &|| context::context_parallel(c),
        &|| context::sequence_parallel(c),
        &|| experts::expert_parallel(c),
        &|| dispatch::token_dispatcher(c),
        &|| dispatch::overlap_split(c),
        &|| parallel::options(c),
        &|| pipeline::schedule(c),
        &|| pipeline::layer_split(c),
        &|| batch::batch(c),
        &|| precision::hardware(c, gpu),
        &|| precision::gradients(c),
        &|| precision::positions(c),
        &|| lora::lora(c),
        &|| training::recompute_modules(c),
        &|| training::offloading(c, gpu),
        &|| training::optimizer_offload(c, gpu),
        &|| training::optimizer(c),
        &|| optimizer_state::master_weights(c),
        &|| optimizer_state::state_dtype(c),
    ];
    let errs: Vec<Violation> = groups.iter().flat_map(|g| g()).collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(errs))
    }
}

/// The rule groups that read the pipeline split (`parallel.vpp`, `schedule`,
/// `first_stage_layers`, `last_stage_layers`, `pipeline_layout` and the embedding and loss
/// slots): the sizes, the pipeline's and the EP overlap's need for virtual stages. No other
/// group reads any of them, so a
/// configuration that differs from one that passed [`check`] only in its split passes
/// [`check`] exactly when it passes these (a search's runs: [`crate::config::Resolved::resplit`]).
pub fn check_split(c: &Config) -> Result<(), ConfigError> {
    let mut errs = bounds::sizes(c);
    if errs.is_empty() {
        errs.extend(pipeline::schedule(c));
        errs.extend(pipeline::layer_split(c));
        errs.extend(dispatch::overlap_split(c));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(errs))
    }
}

/// The size rules of a base configuration whose parallel section and micro batch are still
/// to be chosen (`parsim search`): a zero GPU count, sequence or global batch is named here
/// instead of every mix failing validation and the search answering "no mix fits".
pub fn check_base(c: &Config) -> Result<(), ConfigError> {
    let mut probe = c.clone();
    probe.parallel = Default::default();
    probe.parallel.tp = 1;
    probe.parallel.cp = 1;
    probe.parallel.pp = 1;
    probe.parallel.vpp = 1;
    probe.parallel.ep = 1;
    probe.training.micro_batch_size = 1;
    let errs = bounds::sizes(&probe);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(errs))
    }
}

/// Non-fatal adjustments and caveats of a valid configuration, shown to the user.
pub fn warnings(c: &Config) -> Vec<String> {
    let (m, p, t) = (&c.model, &c.parallel, &c.training);
    let mut w = Vec::new();
    let gpn = c.cluster.per_node();
    match c.cluster.nvlink_domain_size.filter(|&d| d != gpn) {
        Some(domain) if p.tp > domain => w.push(format!(
            "parallel.tp = {} exceeds cluster.nvlink_domain_size = {domain}: tensor parallelism leaves the NVLink domain",
            p.tp
        )),
        None if p.tp > gpn => w.push(format!(
            "parallel.tp = {} exceeds cluster.gpus_per_node = {}: tensor parallelism crosses nodes",
            p.tp, gpn
        )),
        _ => {}
    }
    let fw = t.framework;
    if p.pp > 1 && !fw.schedules().contains(&p.schedule) {
        let runs: Vec<&str> = super::Framework::ALL
            .iter()
            .filter(|f| f.schedules().contains(&p.schedule))
            .map(|f| f.name())
            .collect();
        w.push(format!(
            "parallel.schedule = {}: training.framework = {} does not run it (its schedules: {}, \
             from {}); the estimate times it as {} runs it",
            p.schedule.as_str(),
            fw.name(),
            super::ScheduleKind::names(fw.schedules()),
            fw.schedules_source(),
            runs.join(" or "),
        ));
    }
    if p.sp && p.tp == 1 {
        w.push(
            "parallel.sp ignored: sequence parallelism needs tp > 1 (turned off, as Megatron does)"
                .into(),
        );
    }
    // A learned position embedding shorter than the sequence is an error (precision.rs).
    if m.position_embedding != PositionEmbedding::Learned
        && t.seq_length > m.max_position_embeddings
    {
        w.push(format!(
            "training.seq_length {} exceeds the model's max_position_embeddings {} (rotary positions extrapolate)",
            t.seq_length, m.max_position_embeddings
        ));
    }
    w
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::super::{Config, Violation};

    /// The default configuration (valid) changed by `f`.
    pub fn with(f: impl FnOnce(&mut Config)) -> Config {
        let mut c = Config::default();
        f(&mut c);
        c
    }

    /// The fields the violations name.
    pub fn fields(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.field.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::with;
    use super::*;

    /// Megatron-Core's `get_forward_backward_func` picks 1F1B or the interleaved schedule
    /// only (megatron/core/pipeline_parallel/schedules.py); torch.distributed.pipelining runs
    /// every schedule parsim models.
    #[test]
    fn a_schedule_the_framework_does_not_run_is_named() {
        use crate::config::{Framework, ScheduleKind};
        let at = |fw: Framework, kind: ScheduleKind, pp: u32| {
            warnings(&with(|c| {
                c.training.framework = fw;
                c.parallel.pp = pp;
                c.parallel.schedule = kind;
            }))
        };
        let w = at(Framework::MegatronCore, ScheduleKind::ZbH1, 4);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("parallel.schedule = zb-h1: training.framework = megatron-core"));
        assert!(w[0].contains("1f1b, interleaved-1f1b") && w[0].ends_with("as fsdp runs it"));
        assert!(at(Framework::MegatronCore, ScheduleKind::OneFOneB, 4).is_empty());
        assert!(at(Framework::Fsdp, ScheduleKind::ZbH1, 4).is_empty());
        // One stage runs no pipeline schedule at all.
        assert!(at(Framework::MegatronCore, ScheduleKind::ZbH1, 1).is_empty());
        assert!(!at(Framework::Deepspeed, ScheduleKind::Interleaved1F1B, 4).is_empty());
    }

    #[test]
    fn the_default_passes_every_group() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        assert!(check(&Config::default(), &gpu).is_ok());
        assert!(warnings(&Config::default()).is_empty());
    }

    /// Violations of several groups come in the groups' order, each group's in its own.
    #[test]
    fn groups_report_in_order() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let c = with(|c| {
            c.cluster.num_gpus = 17;
            c.parallel.tp = 3;
            c.parallel.zero = 9;
        });
        let Err(ConfigError::Invalid(v)) = check(&c, &gpu) else {
            panic!("invalid")
        };
        assert_eq!(
            test_support::fields(&v),
            [
                "cluster.num_gpus",
                "parallel.tp",
                "parallel.tp",
                "training.seq_length",
                "parallel.zero"
            ]
        );
    }

    #[test]
    fn tp_beyond_a_node_and_sp_without_tp_warn() {
        let w = warnings(&with(|c| {
            c.parallel.tp = 16;
            c.cluster.num_gpus = 16;
        }));
        assert!(w[0].contains("crosses nodes"), "{w:?}");
        let w = warnings(&with(|c| c.parallel.tp = 1));
        assert!(w[0].starts_with("parallel.sp ignored"), "{w:?}");
    }
}
