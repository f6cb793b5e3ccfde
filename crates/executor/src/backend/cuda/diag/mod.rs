//! Diagnostics of the CUDA backend: its error type, which libraries load (and where the loader
//! looked), the `parsim doctor` report, and how a GPU test reports that it cannot run.

pub mod doctor;
pub mod error;
pub mod gpu_test;
pub mod library;
pub mod probe;
