//! parsim: plans the parallel layout of large-language-model training.
//!
//! One configuration (model, cluster, parallel mix, training settings) goes in; out come
//! parameter counts, FLOPs, per-GPU memory, communication, a pipeline timeline and a step
//! time. Every figure is a sum over one op ledger ([`model`]).

pub mod attention_backend;
pub mod attention_rates;
pub mod calibrate;
pub mod comm;
pub mod config;
pub mod dp_calls;
pub mod ep_overlap;
pub mod estimate;
pub mod host;
pub mod interval;
pub mod layout;
pub mod lower;
pub mod memory;
pub mod model;
pub mod network;
pub mod offload;
pub mod op_cost;
pub mod planning;
pub mod report;
pub mod scaling;
pub mod schedule;
pub mod search;
pub mod time;
pub mod validate;
