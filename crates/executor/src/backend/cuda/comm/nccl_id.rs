//! Rank 0's NCCL unique id (`ncclGetUniqueId`) for the launcher's rendezvous, where the NCCL
//! library loads.

use crate::backend::cuda::{probe, CudaError, Library};

/// NCCL's 128-byte unique id, or `None` where no NCCL library loads (checked first: cudarc
/// panics on a missing library). A failing `ncclGetUniqueId` is an error.
pub fn nccl_unique_id() -> Result<Option<[u8; 128]>, CudaError> {
    if probe::require(Library::Nccl).is_err() {
        return Ok(None);
    }
    let id = cudarc::nccl::Id::new()
        .map_err(|e| CudaError::call(Library::Nccl, "ncclGetUniqueId", format!("{e:?}")))?;
    let mut bytes = [0u8; 128];
    for (b, c) in bytes.iter_mut().zip(id.internal()) {
        *b = *c as u8;
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_comes_exactly_when_nccl_loads() {
        let id = nccl_unique_id().expect("an id or none");
        assert_eq!(id.is_some(), Library::Nccl.present());
    }
}
