//! The CPU backend's tensor ops, one family per file, each forward and backward.

pub mod activation;
pub mod adam;
pub mod attention;
pub mod bias;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod flash;
pub mod gemm;
pub mod layout;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod router;
pub mod ulysses;
