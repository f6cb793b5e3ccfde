//! The `parsim` binary's flags and outputs: validation errors, JSON, generated help and shells, snapshots, imports.

mod bridge_config;
mod deepspeed_config;
mod generated;
mod human_output;
mod megatron_args;
mod torchtitan_config;
mod validation;
