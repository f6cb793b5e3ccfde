//! How to run ([`RunOptions`]) and the checks every backend makes before running.

use crate::error::{ExecError, OptionsError};
use crate::trace::Clock;
use parsim_plan::plan::{Plan, Precision};
use parsim_plan::run::RunLength;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Steps in all (warm-up included).
    pub steps: u32,
    /// Leading steps left out of the timing.
    pub warmup: u32,
    /// Collect every parameter (as global tensors) after the last step.
    pub export_params: bool,
    /// Skip the optimizer and collect the accumulated gradients of the last step instead
    /// (ZeRO 0/1 only: the full gradients, summed over data parallelism).
    pub export_grads: bool,
    /// Added to parameter elements (global tensor, flat index, delta) after initialisation:
    /// finite differences.
    pub perturb: Vec<(String, usize, f32)>,
    /// fp32, or the bf16 mixed-precision recipe.
    pub precision: Precision,
    /// Record every action of the timed steps on this clock (`RunReport::traces`).
    pub trace: Option<Clock>,
    /// Time each op class inside each action of the timed steps (`RankReport::ops`).
    pub profile_ops: bool,
    /// Ranks per node, for the placement of a profiled collective's group (`None`: every
    /// rank on one node, as on the CPU backend).
    pub ranks_per_node: Option<u32>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 3,
            warmup: 1,
            export_params: false,
            export_grads: false,
            perturb: Vec::new(),
            precision: Precision::Fp32,
            trace: None,
            profile_ops: false,
            ranks_per_node: None,
        }
    }
}

impl From<&RunLength> for RunOptions {
    /// A timed run of `l.steps` steps in `l.precision`, exporting nothing, its ops profiled:
    /// the calibration sweep's run (`execute --calibrate` always records op timings).
    fn from(l: &RunLength) -> Self {
        RunOptions {
            steps: l.steps,
            warmup: l.warmup,
            precision: l.precision,
            profile_ops: true,
            ..RunOptions::default()
        }
    }
}

/// The checks every backend makes before running: a valid Plan, at least one timed step,
/// gradients exported only where they are whole.
pub(super) fn check_run(plan: &Plan, opts: &RunOptions) -> Result<(), ExecError> {
    plan.validate()?;
    if opts.export_grads && plan.parallel.zero >= 2 {
        return Err(OptionsError::ExportGradsNeedsFullGradients {
            zero: plan.parallel.zero,
        }
        .into());
    }
    if opts.steps == 0 || opts.warmup >= opts.steps {
        return Err(OptionsError::StepsNotAboveWarmup {
            steps: opts.steps,
            warmup: opts.warmup,
        }
        .into());
    }
    Ok(())
}
