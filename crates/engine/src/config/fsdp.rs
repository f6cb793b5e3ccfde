//! The FSDP implementation as a setting (`parallel.fsdp`): which ZeRO stage each runs and
//! the buffers it holds beyond the generic ZeRO model's.

use serde::{Deserialize, Serialize};

/// An FSDP implementation sharding the data-parallel state (`parallel.fsdp`): a ZeRO stage
/// (`parallel.zero`) with that implementation's documented buffers. Unset: the generic ZeRO
/// model (one gathered unit and one gradient bucket in backward).
///
/// - Megatron-FSDP (`--use-megatron-fsdp`; Megatron-LM megatron/core/distributed/fsdp/src
///   README and docs/runtime_schedule.md): `--data-parallel-sharding-strategy` no_shard,
///   optim, optim_grads, optim_grads_params are ZeRO 0, 1, 2, 3. Parameters are gathered and
///   gradients reduce-scattered per FSDP unit (a transformer layer), in double buffers: in
///   backward the next unit's all-gather is issued before the current unit's reduce-scatter,
///   so two gathered units are live, and two gradient buffers (one being reduced, one being
///   filled).
/// - torch FSDP2 (`fully_shard`, docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html;
///   Megatron-LM's `--use-torch-fsdp2`): every parameter sharded on dim 0 (ZeRO-3), one
///   all-gather per `fully_shard` module (a layer), the next module's prefetched, gradients
///   reduce-scattered per module on their own stream (two gathered units and two gradient
///   buffers in backward, as Megatron-FSDP). `reshard_after_forward` is True for every
///   layer and, by the documented heuristic, False for the root module, whose parameters
///   stay gathered from forward to backward: the embedding's are counted held throughout
///   (the output layer's forward and backward are adjacent, in its own phases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fsdp {
    /// Megatron-FSDP (Megatron-Core's `--use-megatron-fsdp`).
    Megatron,
    /// PyTorch FSDP2 (`fully_shard`).
    Torch,
}

impl Fsdp {
    pub const ALL: [Fsdp; 2] = [Fsdp::Megatron, Fsdp::Torch];

    /// The name in configurations.
    pub fn name(self) -> &'static str {
        match self {
            Fsdp::Megatron => "megatron",
            Fsdp::Torch => "torch",
        }
    }

    /// Megatron-FSDP's name of ZeRO stage `zero` (`--data-parallel-sharding-strategy`).
    pub fn megatron_strategy(zero: u8) -> &'static str {
        match zero {
            0 => "no_shard",
            1 => "optim",
            2 => "optim_grads",
            _ => "optim_grads_params",
        }
    }

    /// The ZeRO stage of a Megatron-FSDP sharding strategy, if it is one.
    pub fn megatron_zero(strategy: &str) -> Option<u8> {
        (0..=3u8).find(|z| Fsdp::megatron_strategy(*z) == strategy)
    }

    /// Units held in backward beyond the generic ZeRO model's one gathered unit and one
    /// gradient bucket: (gathered parameter units, gradient buffers). The double buffers: the
    /// prefetched unit's gather (ZeRO-3) and the previous unit's gradients still being
    /// reduce-scattered (ZeRO-2 and 3; below, gradients stay whole and are reduced once).
    pub fn extra_backward_units(self, zero: u8) -> (u64, u64) {
        match zero {
            3.. => (1, 1),
            2 => (0, 1),
            _ => (0, 0),
        }
    }

    /// Whether the root module's parameters (the embedding's) stay gathered from forward to
    /// backward: FSDP2's `reshard_after_forward = False` for the root, under ZeRO-3.
    pub fn holds_root(self, zero: u8) -> bool {
        self == Fsdp::Torch && zero >= 3
    }
}

/// Whether data parallelism gathers the parameters once and reduce-scatters the gradients
/// once a step rather than every microbatch: torch FSDP2 under `torch.distributed.pipelining`
/// (`training.framework = "fsdp"`, `parallel.fsdp = "torch"`, pp > 1, as torchtitan runs it).
/// The pipeline stage runs every backward with `set_requires_gradient_sync(False)` and
/// `set_reshard_after_backward(False)` and, after the last, calls each parameter group's
/// post-backward (the reduce-scatters) itself (`backward_maybe_with_nosync` in
/// torch/distributed/pipelining/stage.py); torchtitan leaves `reshard_after_forward` False
/// under pipeline parallelism. So the stage's parameters stay gathered and its gradients
/// accumulate unsharded for the whole step, and the reduce-scatters run after the stage's last
/// backward, overlapping only the other stages' drain. Megatron-FSDP, by contrast, syncs
/// sharded gradients every microbatch (its `no_sync`: "for grads shard mode there will
/// actually always be gradient sync happening").
pub fn syncs_once_per_step(cfg: &super::Config) -> bool {
    cfg.training.framework == super::Framework::Fsdp
        && cfg.parallel.fsdp == Some(Fsdp::Torch)
        && cfg.parallel.pp > 1
}

/// The ZeRO stage of what a rank holds while the step runs: `parallel.zero`, except where
/// [`syncs_once_per_step`] keeps the weights gathered and the gradients whole for the step
/// (only the optimizer state stays sharded: stage 1).
pub fn held_zero(cfg: &super::Config) -> u8 {
    if syncs_once_per_step(cfg) {
        1
    } else {
        cfg.parallel.zero
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron-FSDP's four strategies are ZeRO 0-3 in order (its ShardingStrategy enum),
    /// and an unknown name is none.
    #[test]
    fn megatron_strategies_are_zero_stages() {
        let names = ["no_shard", "optim", "optim_grads", "optim_grads_params"];
        for (z, n) in names.iter().enumerate() {
            assert_eq!(Fsdp::megatron_strategy(z as u8), *n);
            assert_eq!(Fsdp::megatron_zero(n), Some(z as u8));
        }
        assert_eq!(Fsdp::megatron_zero("full_shard"), None);
        for f in Fsdp::ALL {
            assert_eq!(serde_json::to_value(f).unwrap(), f.name());
        }
    }
}
