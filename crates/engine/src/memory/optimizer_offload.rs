//! CPU optimizer offload (`training.optimizer_offload_fraction`): a share of the optimizer
//! state (the fp32 master copy and Adam's moments) lives in host memory and is updated on the
//! CPU, so it leaves the GPU; each step the offloaded parameters' gradients go down to the host
//! and their updated weights come back up over the GPU's host link.
//!
//! - Megatron-Core `--optimizer-cpu-offload --optimizer-offload-fraction F`:
//!   `HybridDeviceOptimizer` (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py).
//!   `_get_sub_optimizer_param_groups` moves parameters, in order, to pinned host copies until
//!   F of the elements are offloaded (fp32 copies under `param_update_in_fp32`); the CPU
//!   optimizer's moments are created beside them on the host. `_set_sub_optimizer_grads`
//!   copies each offloaded parameter's gradient into a pinned host buffer (device to host),
//!   the CPU optimizer steps, and `param_copy_back_gpu_hook` copies the updated parameters
//!   back (host to device). The pinned buffers are host memory.
//! - DeepSpeed `zero_optimization.offload_optimizer` with `device: "cpu"` (ZeRO-Offload, Ren
//!   et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training"): the
//!   partition's fp32 master copy and moments live in pinned host memory and
//!   `DeepSpeedCPUAdam` updates them (deepspeed/runtime/zero/stage_1_and_2.py: the reduced
//!   gradients are copied to the host in `async_inplace_copy_grad_to_fp32_buffer_from_gpu`,
//!   the updated partition copied back to the 16-bit parameters after the step). Its offload
//!   is all or nothing: F = 1.
//!
//! Memory: the optimizer line loses exactly the offloaded parameters' state bytes, which are
//! counted as host memory instead. Time: the step of the parameters left on the GPU streams
//! HBM as before; the offloaded ones add their gradient copy down, the CPU's Adam step and the
//! weight copy up, one after the other (Megatron's `--overlap-cpu-optimizer-d2h-h2d` is not
//! modelled; the importer refuses it by name).

use crate::config::Resolved;
use crate::model::OptimizerState;

/// Parameters a CPU Adam step updates per second on one host: DeepSpeed's `DeepSpeedCPUAdam`
/// (AVX512) updates 1 billion parameters in 0.22 s on a DGX-2 host (two 24-core Xeon Platinum
/// 8168), Ren et al. 2021 (ZeRO-Offload), Table 3. The host's cores and memory bandwidth are
/// shared by the processes of its GPUs, each stepping its own parameters at once.
pub const CPU_ADAM_PARAMS_PER_S: f64 = 1e9 / 0.22;

/// Parameters of `updated` whose optimizer state is offloaded under `r`: the share
/// `training.optimizer_offload_fraction` of them, rounded up (Megatron-Core offloads whole
/// parameters until the share is reached).
pub fn offloaded_params(r: &Resolved, updated: u64) -> u64 {
    let f = r.config.training.optimizer_offload_fraction;
    if f <= 0.0 {
        return 0;
    }
    ((updated as f64 * f).ceil() as u64).min(updated)
}

/// Host bytes of the offloaded parameters' optimizer state (master copy and moments): what
/// leaves the GPU's optimizer line.
pub fn host_state_bytes(r: &Resolved, offloaded: u64) -> u64 {
    OptimizerState::of(&r.config.training).state_bytes(offloaded)
}

/// Seconds the offloaded part of the step adds under `r`: `offloaded` gradients down and
/// their updated weights up over the profile's host link (`links.host`, per direction), and
/// the CPU Adam step at [`CPU_ADAM_PARAMS_PER_S`] shared by the node's GPUs. Zero without
/// offload or a host link (the configuration rules refuse offload without one).
pub fn step_s(r: &Resolved, offloaded: u64) -> f64 {
    let Some(link) = r.gpu.links.host.as_ref() else {
        return 0.0;
    };
    if offloaded == 0 {
        return 0.0;
    }
    let t = &r.config.training;
    let down = crate::offload::copy_s(link, offloaded * t.grad_dtype.bytes());
    let up = crate::offload::copy_s(link, offloaded * t.weight_bytes());
    let per_node = r.config.cluster.gpus_per_node_on(&r.gpu) as f64;
    let cpu = offloaded as f64 * per_node / CPU_ADAM_PARAMS_PER_S;
    down + cpu + up
}
