//! The cited defaults of the `[run]` settings (docs/planning.md derives each).

/// Unexpected interruptions per GPU-hour, from Meta's Llama 3 paper (Dubey et al. 2024, "The
/// Llama 3 Herd of Models", Sec. 3.3.4, Table 5): 419 unexpected interruptions in a 54-day
/// snapshot of pre-training on 16,384 H100 GPUs. 16,384 GPUs x 54 days x 24 h =
/// 21,233,664 GPU-hours, so the rate is 419 / 21,233,664 = 1.973e-5 per GPU-hour (one
/// interruption every 3.09 hours for the whole 16,384-GPU job; a mean time between failures
/// of 50,677 hours, 5.8 years, per GPU).
pub const FAILURE_RATE_PER_GPU_HOUR: f64 = 419.0 / (16_384.0 * 54.0 * 24.0);

/// Checkpoint storage bandwidth, bytes per second: the sustained throughput of the Tectonic
/// file system Llama 3 checkpointed to (Llama 3 paper Sec. 3.3.1: "sustainable throughput of
/// 2 TB/s and a peak throughput of 7 TB/s").
pub const STORAGE_BYTES_PER_S: f64 = 2.0e12;

/// Host-to-device copy bandwidth an asynchronous checkpoint stalls for, bytes per second: one
/// PCIe 5.0 x16 link, 64 GB/s per direction (PCI-SIG PCIe 5.0 specification: 32 GT/s x 16
/// lanes, 128b/130b encoding).
pub const HOST_COPY_BYTES_PER_S: f64 = 64.0e9;

/// Host power per GPU, watts, for a profile whose `[power]` gives no `host_w_per_node`:
/// NVIDIA DGX H100's maximum system power, about 10.2 kW (DGX H100 datasheet), less its eight
/// 700 W GPUs, over the eight: (10,200 - 5,600) / 8 = 575 W. A ceiling: the CPUs, memory,
/// NICs and fans rarely all run at their maximum. Each shipped GPU profile gives its own
/// system's figure per node (calibration/*.toml, `power.host_w_per_node`).
pub const HOST_POWER_W_PER_GPU: f64 = 4_600.0 / 8.0;

/// Network switch power per NIC, watts: a two-tier non-blocking fat tree uses three switch
/// ports per NIC port (leaf down, leaf up, spine down) of 64-port NVIDIA Quantum-2 QM9700
/// switches, each about 1,720 W at most (QM9700/QM9790 user manual, Specifications):
/// 3 / 64 x 1,720 = 80.625 W; a DGX H100 with eight NICs, 645 W. One NIC per GPU, as every
/// shipped profile's inter-node link is.
pub const NETWORK_POWER_W_PER_NIC: f64 = 3.0 / 64.0 * 1_720.0;

/// Power usage effectiveness: Google's fleet-wide trailing-twelve-month PUE of 1.10 (Google
/// Data Centers, "Efficiency", 2023), a modern hyperscale figure; the Uptime Institute's 2023
/// survey average across all data centres is 1.58.
pub const PUE: f64 = 1.10;

/// Seconds from a failure to training again, before the checkpoint is read: detection (a
/// collective timeout), rescheduling onto spares, process start and NCCL setup. An assumption
/// (10 minutes) with no published figure behind it: set `run.restart_s` for your cluster.
pub const RESTART_S: f64 = 600.0;
