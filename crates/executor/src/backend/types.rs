//! The types a backend's ops and collectives are written over: its tensor, event and process
//! group. [`Backend`](super::Backend) names them together with its device and communicator,
//! and every backend has them through a blanket impl beside it, so the op and collective
//! traits need not name `Backend` (which names them) and the trait files import one way.

use super::tensor::DeviceTensor;

/// A backend's tensor, event and process group (see [`Backend`](super::Backend) for each
/// one's meaning); implemented for every backend, never by hand.
pub trait BackendTypes {
    /// The backend's name in messages (`cpu`, `cuda`).
    const NAME: &'static str;
    type Tensor: DeviceTensor;
    type Event;
    type Group: ProcessGroup + Clone;
}

/// A process group as one member sees it.
pub trait ProcessGroup {
    /// Members.
    fn size(&self) -> usize;
    /// This member's index among the members.
    fn index(&self) -> usize;
    /// The members' global ranks, in member order.
    fn members(&self) -> &[u32];
}
