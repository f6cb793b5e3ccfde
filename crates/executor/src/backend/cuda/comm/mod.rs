//! Communication of the CUDA backend: the process groups and their transports ([`groups`]),
//! NCCL ([`nccl`], [`comms`]), the shared-GPU collectives ([`local`], [`local_device`],
//! [`hub`], [`exchange`]), the overlap schedule ([`overlap`]) and [`collectives`], the
//! backend's `DeviceCollectives`.

pub mod collectives;
pub mod comms;
pub mod exchange;
pub mod groups;
pub mod hub;
pub mod local;
pub mod local_device;
pub mod nccl;
pub mod nccl_id;
pub mod overlap;
