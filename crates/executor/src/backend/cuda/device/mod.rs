//! One GPU as a rank sees it: the context and streams ([`context`]), the caching memory pool
//! ([`pool`]), device tensors ([`tensor`]), cuBLASLt's linear-layer products ([`matmul`]) and
//! the device with its GEMMs and copies ([`device`]).

pub mod context;
#[allow(clippy::module_inception)]
pub mod device;
pub mod matmul;
pub mod pool;
pub mod tensor;
