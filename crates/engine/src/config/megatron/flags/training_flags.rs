//! The training flags that pick the optimizer, the recompute modules and activation
//! offloading (`--optimizer`, `--recompute-modules`, `--cpu-offloading*`) and the run's length
//! (`--train-samples`, `--train-iters`): read as Megatron-LM reads them, refused by name where
//! parsim does not model the setting.

use super::State;
use serde_json::{json, Value};

impl State {
    /// `--recompute-modules` (Megatron-Core's selective recompute modules), each a module
    /// parsim models; only with selective recompute, as Megatron-Core reads it.
    pub(super) fn recompute_modules(&mut self, recompute: &str) -> Result<(), String> {
        let Some(modules) = self.lists.get("--recompute-modules").cloned() else {
            return Ok(());
        };
        if recompute != "selective" {
            self.notes.push(format!(
                "--recompute-modules {} applies to selective recompute only; the run recomputes {recompute}",
                modules.join(" ")
            ));
            return Ok(());
        }
        let parsed = modules
            .iter()
            .map(|m| {
                match m.parse::<crate::config::RecomputeModule>() {
                    Ok(crate::config::RecomputeModule::PerOp) => Err(
                        "--recompute-modules: per_op is torchtitan's per-op checkpointing, not a Megatron-Core module".to_string(),
                    ),
                    Ok(m) => Ok(json!(m.as_str())),
                    Err(e) => Err(format!("--recompute-modules: {e}")),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.set("training", "recompute_modules", Value::Array(parsed));
        Ok(())
    }

    /// `--cpu-offloading` of activations (`--cpu-offloading-num-layers` layers); weight
    /// offloading is refused. The layer count alone, without `--cpu-offloading`, offloads
    /// nothing in Megatron-Core (its TransformerConfig checks it only when offloading is on).
    pub(super) fn offloading(&mut self) -> Result<(), String> {
        let n = self.ints.get("--cpu-offloading-num-layers").copied();
        if !self.on("--cpu-offloading") {
            if let Some(n) = n.filter(|&n| n > 0) {
                self.notes.push(format!(
                    "--cpu-offloading-num-layers {n} without --cpu-offloading offloads nothing"
                ));
            }
            return Ok(());
        }
        if self.on("--cpu-offloading-weights") {
            return Err("--cpu-offloading-weights: offloading weights to the CPU is not modelled, so the run is not estimated".into());
        }
        let n = n.unwrap_or(0);
        if n > 0 {
            self.set("training", "offload_activation_layers", json!(n));
        }
        Ok(())
    }

    /// `--optimizer-cpu-offload` with `--optimizer-offload-fraction F` (Megatron's default 1.0,
    /// megatron/training/arguments.py): `training.optimizer_offload_fraction = F`
    /// (src/memory/optimizer_offload.rs). The fraction alone offloads nothing; the overlap of
    /// the copies with the CPU step (`--overlap-cpu-optimizer-d2h-h2d`) is not modelled, so it
    /// is refused with offload on.
    pub(super) fn optimizer_offload(&mut self) -> Result<(), String> {
        let fraction = self
            .word("--optimizer-offload-fraction")
            .map(str::to_string);
        if !self.on("--optimizer-cpu-offload") {
            if let Some(f) = fraction {
                self.notes.push(format!(
                    "--optimizer-offload-fraction {f} without --optimizer-cpu-offload offloads nothing"
                ));
            }
            return Ok(());
        }
        if self.on("--overlap-cpu-optimizer-d2h-h2d") {
            return Err("--overlap-cpu-optimizer-d2h-h2d: the CPU optimizer's copies overlapped with its step are not modelled (parsim runs them one after the other), so the run is not estimated".into());
        }
        let f = match fraction {
            None => 1.0,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && (0.0..=1.0).contains(f))
                .ok_or_else(|| {
                    format!(
                        "--optimizer-offload-fraction: expected a share between 0 and 1, got '{v}'"
                    )
                })?,
        };
        self.set("training", "optimizer_offload_fraction", json!(f));
        Ok(())
    }

    /// `--optimizer`: adam (Megatron's default) or muon as parsim models it (blockwise TP,
    /// 5 Newton-Schulz steps); `dist_muon` (Megatron's older spelling of muon with
    /// `--use-distributed-optimizer`) is muon under the layer-wise distributed optimizer,
    /// ZeRO-1; any other optimizer or Muon setting is refused by name.
    pub(super) fn optimizer(&mut self) -> Result<(), String> {
        match self.word("--optimizer") {
            None | Some("adam") => {}
            Some("muon") => self.set("training", "optimizer", json!("muon")),
            Some("dist_muon") => {
                self.set("training", "optimizer", json!("muon"));
                self.set("parallel", "zero", json!(1));
            }
            Some(other) => {
                return Err(format!(
                "--optimizer: '{other}' is not modelled (adam, muon, dist_muon), so the run is not estimated"
            ))
            }
        }
        if let Some(mode) = self.word("--muon-tp-mode").filter(|m| *m != "blockwise") {
            return Err(format!(
                "--muon-tp-mode: '{mode}' is not modelled (blockwise: each TP shard orthogonalised on its own)"
            ));
        }
        if let Some(n) = self
            .ints
            .get("--muon-num-ns-steps")
            .copied()
            .filter(|&n| n != crate::config::MUON_NS_STEPS)
        {
            return Err(format!(
                "--muon-num-ns-steps: {n} is not modelled (Megatron's default, {})",
                crate::config::MUON_NS_STEPS
            ));
        }
        Ok(())
    }

    /// The tokens to train (`run.train_tokens`): `--train-samples` sequences of
    /// `--seq-length`, or `--train-iters` steps of `--global-batch-size` sequences (Megatron-LM
    /// refuses a batch-size ramp-up with iteration-based training, so every step is whole).
    pub(super) fn run_length(&mut self) {
        let training = |key: &str| {
            self.layer
                .get("training")
                .and_then(|t| t.get(key))
                .and_then(Value::as_u64)
        };
        let (seq, gbs) = (training("seq_length"), training("global_batch_size"));
        let (what, tokens) = if let Some(n) = self.ints.get("--train-samples").copied() {
            let what = format!("--train-samples {n} x --seq-length {}", seq.unwrap_or(0));
            (what, seq.map(|s| n.checked_mul(s)))
        } else if let Some(n) = self.ints.get("--train-iters").copied() {
            let what = format!(
                "--train-iters {n} x --global-batch-size {} x --seq-length {}",
                gbs.unwrap_or(0),
                seq.unwrap_or(0)
            );
            let tokens = seq
                .zip(gbs)
                .map(|(s, g)| n.checked_mul(s).and_then(|x| x.checked_mul(g)));
            (what, tokens)
        } else {
            return;
        };
        match tokens {
            None => self.notes.push(format!(
                "{what}: the launch gives no {}, so the tokens to train are not counted",
                if seq.is_none() {
                    "--seq-length"
                } else {
                    "--global-batch-size"
                }
            )),
            Some(None) => self.notes.push(format!(
                "{what}: more tokens than parsim counts (2^64), so the run is not planned"
            )),
            Some(Some(0)) => self
                .notes
                .push(format!("{what}: zero tokens, so the run is not planned")),
            Some(Some(t)) => {
                self.set("run", "train_tokens", json!(t));
                self.notes.push(format!(
                    "{what} = {t} tokens to train (run.train_tokens): the run's days, energy and cost follow"
                ));
            }
        }
    }
}
