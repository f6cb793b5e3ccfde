//! Calibration and the published rates it rests on: `calibrate`, the CPU loop, GEMM and attention kernel rates, NCCL.

mod calibrate;
mod calibrate_cpu;
mod closed_loop;
mod gemm_rates;
mod grouped_gemm_rates;
mod kernel_rates;
mod memory_bound_rates;
mod nccl_busbw;
mod nccl_latency;
mod nccl_rows;
mod trace;
mod window_rates;
