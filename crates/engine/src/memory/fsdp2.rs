//! torch FSDP2's resident parameter shard (`parallel.fsdp = "torch"`, `training.framework =
//! "fsdp"`, as torchtitan runs it): the sharded parameter is the master copy.
//!
//! torchtitan builds the model in fp32 and shards it with `fully_shard(...,
//! mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))` (`apply_fsdp`,
//! torchtitan/models/llama3/infra/parallelize.py). FSDP2 keeps each `sharded_param` in the
//! parameter's original dtype and casts only what it gathers: `FSDPParam.init_dtype_attrs`
//! keeps `orig_dtype` for the shard and `param_dtype` for the unsharded parameter, whose
//! all-gather input is the shard cast to `param_dtype` for the duration of the all-gather
//! (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, `all_gather_inputs`); the reduced
//! gradient is cast back to `orig_dtype` and becomes the shard's `.grad` (`foreach_reduce`,
//! _fsdp_collectives.py: `_to_dtype_if_needed(reduce_output, orig_dtype)`). The optimizer
//! (torch's AdamW) steps the fp32 shard in place: there is no low-precision sharded copy and
//! no separate master copy, so a rank holds 4 bytes of shard where the generic ZeRO-3 model
//! holds a 2-byte shard beside a 4-byte master.
//!
//! Not here: the gathered units (the generic ZeRO-3 model's, in the parameters' bf16), the
//! pipeline case (`syncs_once_per_step`, where the stage stays gathered and the fp32 shard is
//! the master line), pure bf16 (`master_weights = false`: the shard is bf16 and the optimizer
//! has no master), and float8 all-gather (`fp8_param_gather`: the shard stays fp32 there too,
//! but the gathered units are 1-byte and their accounting is the low-precision model's).

use crate::config::{Fsdp, Precision, Resolved};

/// Bytes of one element of the rank's resident parameter shard when it is torch FSDP2's fp32
/// master shard (see the module docs), else `None` (the generic ZeRO model holds the shard in
/// the training dtype and the master apart).
pub fn master_shard_bytes(r: &Resolved) -> Option<u64> {
    let cfg = &r.config;
    let t = &cfg.training;
    let fsdp2 = cfg.parallel.fsdp == Some(Fsdp::Torch)
        && t.framework == crate::config::Framework::Fsdp
        && crate::config::held_zero(cfg) >= 3;
    (fsdp2 && t.master_weights && t.precision != Precision::Fp32 && !t.fp8_param_gather)
        .then_some(4)
}
