//! The executor against the single-rank run and the engine's memory prediction.

#[path = "executor/attention_dropout.rs"]
mod attention_dropout;
#[path = "executor/bf16.rs"]
mod bf16;
#[path = "executor/cli.rs"]
mod cli;
#[path = "executor/common.rs"]
mod common;
#[path = "executor/cp.rs"]
mod cp;
#[path = "executor/cuda.rs"]
mod cuda;
#[path = "executor/doctor.rs"]
mod doctor;
#[path = "executor/dropout.rs"]
mod dropout;
#[path = "executor/equivalence.rs"]
mod equivalence;
#[path = "executor/gpt3.rs"]
mod gpt3;
#[path = "executor/lora.rs"]
mod lora;
#[path = "executor/mamba.rs"]
mod mamba;
#[path = "executor/memory.rs"]
mod memory;
#[path = "executor/mla.rs"]
mod mla;
#[path = "executor/modern_layers.rs"]
mod modern_layers;
#[path = "executor/moe.rs"]
mod moe;
#[path = "executor/moe_bias.rs"]
mod moe_bias;
#[path = "executor/moe_ep_wide.rs"]
mod moe_ep_wide;
#[path = "executor/moe_folding.rs"]
mod moe_folding;
#[path = "executor/moe_folding_groups.rs"]
mod moe_folding_groups;
#[path = "executor/moe_memory.rs"]
mod moe_memory;
#[path = "executor/mtp.rs"]
mod mtp;
#[path = "executor/op_timing.rs"]
mod op_timing;
#[path = "executor/plan.rs"]
mod plan;
#[path = "executor/timeline.rs"]
mod timeline;
#[path = "executor/timeline_collectives.rs"]
mod timeline_collectives;
#[path = "executor/timeline_grad_buckets.rs"]
mod timeline_grad_buckets;
