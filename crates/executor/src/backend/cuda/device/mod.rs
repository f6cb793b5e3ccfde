//! One GPU as a rank sees it: the context and streams ([`context`]), the caching memory pool
//! ([`pool`]), device tensors ([`tensor`]) and the device with its GEMMs and copies
//! ([`device`]).

pub mod context;
#[allow(clippy::module_inception)]
pub mod device;
pub mod pool;
pub mod tensor;
