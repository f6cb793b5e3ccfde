//! The decoder-only transformer on one rank, Megatron-style (Shoeybi et al. 2019): column-
//! parallel QKV and fc1, row-parallel output projection and fc2, vocab-parallel embedding,
//! output layer and cross-entropy; with sequence parallelism (Korthikanti et al. 2022) the
//! norms and residuals run on sequence shards, the column-parallel input is all-gathered
//! (forward, and again in backward for the weight gradient, since only the shard is saved) and
//! the row-parallel output reduce-scattered; the reverse in backward.
//!
//! Backward is split as zero-bubble schedules split it (Qi et al. 2024): `*_bwd` computes the
//! input gradient and returns [`WTask<B>`]s, the weight-gradient work, run at once for a full
//! backward or later for a W action.

pub mod bias;
pub mod blocks;
pub mod cp;
pub mod cp_state;
pub mod ctx;
pub mod data;
pub mod dropout;
pub mod embedding_group;
pub mod ends;
pub mod hybrid;
pub mod layer;
pub mod lora;
pub mod mamba;
pub mod mla;
pub mod modern;
pub mod moe;
pub mod moe_etp;
pub mod moe_lora;
pub mod moe_seq;
pub mod mtp;
pub mod params;
pub mod positions;
pub mod router_bias;
pub mod shared;
pub mod wtask;

pub use ctx::{zeros, Ctx};
pub use wtask::{Sink, WTask};
