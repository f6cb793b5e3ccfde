//! Engine tests: every value is derived independently of the code (published counts, closed
//! forms from the literature, or properties that must hold), with the source in a comment.

mod engine {
    pub mod activations;
    pub mod blackwell;
    pub mod checkpoint;
    pub mod comm;
    pub mod common;
    pub mod ep_folded_grid;
    pub mod expert_folding;
    pub mod expert_tp_comm;
    pub mod flops;
    pub mod framework;
    pub mod fsdp;
    pub mod hf_import;
    pub mod hybrid;
    pub mod intervals;
    pub mod llama3_regime;
    pub mod low_precision;
    pub mod megatron_modelopt;
    pub mod memory;
    pub mod modern_models;
    pub mod modern_recipes;
    pub mod nvlink_domains;
    pub mod params;
    pub mod pp_p2p;
    pub mod profiles;
    pub mod properties;
    pub mod robustness;
    pub mod run_energy;
    pub mod tables;
    pub mod time;
    pub mod training_options;
    pub mod zero_calls;
}
