//! The 128-byte NCCL unique id that rank 0 creates and hands to every rank: from
//! `ncclGetUniqueId` where the NCCL library loads (the caller's [`NewId`], the CUDA backend's),
//! else a random stand-in (enough to prove the exchange; a run that needs NCCL stops later with
//! NCCL's own missing-library error).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const ID_BYTES: usize = 128;

/// Where an id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdSource {
    /// `ncclGetUniqueId` (cudarc's `nccl::Id::new`).
    Nccl,
    /// Random bytes: no NCCL library was found at rank 0.
    StandIn,
}

impl std::fmt::Display for IdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IdSource::Nccl => "NCCL unique id (ncclGetUniqueId)",
            IdSource::StandIn => "stand-in random id (no NCCL library at rank 0)",
        })
    }
}

/// Makes rank 0's id: NCCL's where it loads, else a stand-in; an error names what failed.
pub type NewId = fn() -> Result<UniqueId, String>;

/// An id and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    pub bytes: [u8; ID_BYTES],
    pub source: IdSource,
}

impl UniqueId {
    /// NCCL's id where the caller made one (`Some`), else a stand-in.
    pub fn nccl_or_stand_in(bytes: Option<[u8; ID_BYTES]>) -> Self {
        match bytes {
            Some(bytes) => UniqueId {
                bytes,
                source: IdSource::Nccl,
            },
            None => Self::stand_in(),
        }
    }

    /// Random bytes from the standard library's per-process random hash keys.
    pub fn stand_in() -> Self {
        let state = RandomState::new();
        let mut bytes = [0u8; ID_BYTES];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = state.build_hasher();
            h.write_usize(i);
            h.write_u32(std::process::id());
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        UniqueId {
            bytes,
            source: IdSource::StandIn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_ids_differ_and_are_not_zero() {
        let (a, b) = (UniqueId::stand_in(), UniqueId::stand_in());
        assert_ne!(a.bytes, b.bytes);
        assert!(a.bytes.iter().any(|&x| x != 0));
    }
}
