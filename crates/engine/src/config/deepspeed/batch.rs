//! DeepSpeed's batch fields and its identity train_batch_size = train_micro_batch_size_per_gpu
//! x gradient_accumulation_steps x dp, resolved as `DeepSpeedConfig._set_batch_related_parameters`
//! and checked as `_batch_assertion` do (deepspeed/runtime/config.py): two given derive the
//! third (floor division), one given takes one accumulation step, all three must agree.

use super::walk::Walked;
use super::{count, invalid, DeepspeedError};

const TRAIN: &str = "train_batch_size";
const MICRO: &str = "train_micro_batch_size_per_gpu";
const GAS: &str = "gradient_accumulation_steps";

/// The batch fields as written ("auto", filled by the Hugging Face Trainer, counts as absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchFields {
    pub train_batch_size: Option<u64>,
    pub micro_batch_per_gpu: Option<u64>,
    pub accumulation_steps: Option<u64>,
    /// Any of the three was "auto".
    pub has_auto: bool,
}

/// The batch at a data-parallel size: what the override layer gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepspeedBatch {
    pub micro: u64,
    pub global: u64,
    pub accumulation_steps: u64,
    /// Which value was derived and how (or that all three agree).
    pub note: String,
}

impl BatchFields {
    /// Reads the three fields; each must be a whole number above 0 (`_batch_assertion`).
    pub(super) fn read(w: &Walked) -> Result<BatchFields, DeepspeedError> {
        let mut out = BatchFields::default();
        for (path, slot) in [
            (TRAIN, &mut out.train_batch_size),
            (MICRO, &mut out.micro_batch_per_gpu),
            (GAS, &mut out.accumulation_steps),
        ] {
            let Some(v) = w.get(path) else { continue };
            match count(path, v)? {
                None => out.has_auto = true,
                Some(0) => return Err(invalid(path, "must be above 0 (DeepSpeed asserts it)")),
                Some(n) => *slot = Some(n),
            }
        }
        if out.train_batch_size.is_none() && out.micro_batch_per_gpu.is_none() && !out.has_auto {
            return Err(invalid(
                TRAIN,
                format!("either {TRAIN} or {MICRO} must be given (DeepSpeed asserts it)"),
            ));
        }
        Ok(out)
    }

    /// The batch at data-parallel size `dp`; `None` when "auto" leaves too little to derive it.
    pub fn resolve(&self, dp: u64) -> Result<Option<DeepspeedBatch>, DeepspeedError> {
        let (train, micro, gas) = (
            self.train_batch_size,
            self.micro_batch_per_gpu,
            self.accumulation_steps,
        );
        let (train, micro, gas, note) = match (train, micro, gas) {
            (Some(t), Some(m), Some(g)) => (
                t,
                m,
                g,
                format!("{TRAIN} {t} = {MICRO} {m} x {GAS} {g} x dp {dp}"),
            ),
            (Some(t), Some(m), None) => {
                let g = t / m / dp;
                (
                    t,
                    m,
                    g,
                    format!("{GAS} derived: {TRAIN} {t} / ({MICRO} {m} x dp {dp}) = {g}"),
                )
            }
            (Some(t), None, Some(g)) => {
                let m = t / dp / g;
                (
                    t,
                    m,
                    g,
                    format!("{MICRO} derived: {TRAIN} {t} / ({GAS} {g} x dp {dp}) = {m}"),
                )
            }
            (None, Some(m), Some(g)) => {
                let t = m * g * dp;
                (
                    t,
                    m,
                    g,
                    format!("{TRAIN} derived: {MICRO} {m} x {GAS} {g} x dp {dp} = {t}"),
                )
            }
            (Some(t), None, None) => {
                let m = t / dp;
                (
                    t,
                    m,
                    1,
                    format!("{MICRO} derived: {TRAIN} {t} / dp {dp} = {m} ({GAS} 1)"),
                )
            }
            (None, Some(m), None) => {
                let t = m * dp;
                (
                    t,
                    m,
                    1,
                    format!("{TRAIN} derived: {MICRO} {m} x dp {dp} = {t} ({GAS} 1)"),
                )
            }
            (None, None, _) => return Ok(None),
        };
        if micro == 0 || gas == 0 || train != micro * gas * dp {
            return Err(invalid(
                TRAIN,
                format!(
                    "DeepSpeed's identity {TRAIN} = {MICRO} x {GAS} x dp does not hold: {train} != {micro} x {gas} x {dp} (dp {dp} from the GPU count and the parallel degrees)"
                ),
            ));
        }
        Ok(Some(DeepspeedBatch {
            micro,
            global: train,
            accumulation_steps: gas,
            note,
        }))
    }
}
