//! Compiling the kernels: NVRTC ([`nvrtc`]), ptxas's resource report ([`ptxas`]), the disk
//! cache of cubins ([`cache`]) and the kernel files with their loader ([`kernels`]). The
//! headers every kernel file includes live here: `common.cuh` and `philox.h`.

pub mod cache;
pub mod kernels;
pub mod nvrtc;
pub mod ptxas;
