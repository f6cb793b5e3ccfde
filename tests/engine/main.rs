//! The estimate model: parameters, FLOPs, memory, time, communication, profiles, goldens and the step breakdown.
//!
//! Every value is derived independently of the code (published counts, closed forms from the
//! literature, or properties that must hold), with the source in a comment.

mod activations;
mod blackwell;
mod checkpoint;
mod comm;
mod common;
mod deepspeed_import;
mod deepspeed_memory;
mod ep_folded_grid;
mod estimate_golden;
mod expert_folding;
mod expert_tp_comm;
mod flops;
mod framework;
mod fsdp;
mod fsdp2_shard;
mod golden_headline;
mod hf_import;
mod hybrid;
mod intervals;
mod latent_moe;
mod llama3_regime;
mod low_precision;
mod megatron_modelopt;
mod memory;
mod model_cards;
mod moe_recipes;
mod nvlink_domains;
mod optimizer_offload;
mod params;
mod pp_p2p;
mod profiles;
mod properties;
mod run_energy;
mod runtime_memory;
mod step_breakdown;
mod tables;
mod time;
mod torchtitan_import;
mod training_options;
mod zero_calls;
