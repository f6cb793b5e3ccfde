//! Diagnostics of the CUDA backend: its error type, which libraries load (and where the loader
//! looked), and the `parsim doctor` report.

pub mod doctor;
pub mod error;
pub mod library;
pub mod probe;
