//! Building every NCCL communicator a rank needs, for both worlds. In one process the main
//! thread makes one unique id per NCCL group ([`single_process_ids`]) and each rank thread
//! joins its groups in the groups' global order ([`join_single_process`]): every
//! `ncclCommInitRank` blocks until its group is complete, and a common order means the
//! lowest unfinished group always has all its members at it, so nothing deadlocks. A launched
//! rank joins the world communicator with the launcher's id and takes part in one
//! `ncclCommSplit` per NCCL group, member or not ([`join_multi_process`]).

use crate::backend::cuda::comm::groups::{GroupSpec, Transport};
use crate::backend::cuda::comm::nccl::{new_id, NcclComm};
use crate::backend::cuda::diag::error::CudaError;
use std::collections::HashMap;

/// One fresh unique id per NCCL group, by the group's index in `groups`.
pub fn single_process_ids(groups: &[GroupSpec]) -> Result<HashMap<usize, [u8; 128]>, CudaError> {
    groups
        .iter()
        .enumerate()
        .filter(|(_, g)| g.transport == Transport::Nccl)
        .map(|(i, _)| Ok((i, new_id()?)))
        .collect()
}

/// The NCCL groups `rank` belongs to, in the order every rank joins them: (group index,
/// member index).
pub fn join_order(groups: &[GroupSpec], rank: u32) -> Vec<(usize, usize)> {
    groups
        .iter()
        .enumerate()
        .filter(|(_, g)| g.transport == Transport::Nccl)
        .filter_map(|(i, g)| g.members.iter().position(|&m| m == rank).map(|k| (i, k)))
        .collect()
}

/// Rank `rank`'s communicators in one process, keyed by the group's members (the calling
/// thread's CUDA context must be the rank's GPU).
pub fn join_single_process(
    groups: &[GroupSpec],
    ids: &HashMap<usize, [u8; 128]>,
    rank: u32,
) -> Result<HashMap<Vec<u32>, NcclComm>, CudaError> {
    join_order(groups, rank)
        .into_iter()
        .map(|(i, k)| {
            let g = &groups[i];
            let id = ids.get(&i).ok_or_else(|| {
                CudaError::call(
                    crate::backend::cuda::diag::probe::Library::Nccl,
                    "ncclCommInitRank",
                    format!("no unique id made for group {:?}", g.members),
                )
            })?;
            Ok((g.members.clone(), NcclComm::init(id, g.members.len(), k)?))
        })
        .collect()
}

/// Rank `rank`'s world communicator (from the launcher's id) and its groups' communicators,
/// split from it.
pub fn join_multi_process(
    groups: &[GroupSpec],
    unique_id: &[u8; 128],
    rank: u32,
    world_size: u32,
) -> Result<(NcclComm, HashMap<Vec<u32>, NcclComm>), CudaError> {
    let world = NcclComm::init(unique_id, world_size as usize, rank as usize)?;
    let mut out = HashMap::new();
    for g in groups.iter().filter(|g| g.transport == Transport::Nccl) {
        if let Some(c) = world.split(g, rank)? {
            out.insert(g.members.clone(), c);
        }
    }
    Ok((world, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(members: &[u32], transport: Transport, color: i32) -> GroupSpec {
        GroupSpec {
            members: members.to_vec(),
            devices: members.to_vec(),
            transport,
            color,
        }
    }

    #[test]
    fn each_rank_joins_its_nccl_groups_in_the_global_order() {
        let groups = vec![
            spec(&[0, 1], Transport::Local, 0),
            spec(&[0, 1, 2, 3], Transport::Nccl, 1),
            spec(&[0, 2], Transport::Nccl, 2),
            spec(&[1, 3], Transport::Nccl, 3),
            spec(&[2], Transport::Solo, 4),
        ];
        assert_eq!(join_order(&groups, 0), [(1, 0), (2, 0)]);
        assert_eq!(join_order(&groups, 3), [(1, 3), (3, 1)]);
        assert_eq!(join_order(&groups, 2), [(1, 2), (2, 1)]);
        // Every member of every NCCL group joins it exactly once.
        for (i, g) in groups.iter().enumerate() {
            let joined: Vec<u32> = (0..4)
                .filter(|&r| join_order(&groups, r).iter().any(|&(j, _)| j == i))
                .collect();
            let want = if g.transport == Transport::Nccl {
                g.members.clone()
            } else {
                vec![]
            };
            assert_eq!(joined, want, "group {i}");
        }
    }

    /// Simulates blocking joins: each rank waits at its next group until every member of
    /// that group is there; true when every rank gets through its list.
    fn completes(groups: &[GroupSpec], plans: &[Vec<usize>]) -> bool {
        let mut next = vec![0usize; plans.len()];
        loop {
            let waiting: Vec<Option<usize>> = (0..plans.len())
                .map(|r| plans[r].get(next[r]).copied())
                .collect();
            if waiting.iter().all(Option::is_none) {
                return true;
            }
            let ready = (0..groups.len()).find(|&i| {
                groups[i]
                    .members
                    .iter()
                    .all(|&m| waiting[m as usize] == Some(i))
            });
            let Some(i) = ready else {
                return false;
            };
            for &m in &groups[i].members {
                next[m as usize] += 1;
            }
        }
    }

    #[test]
    fn the_common_order_cannot_deadlock() {
        let groups = vec![
            spec(&[0, 1, 2, 3], Transport::Nccl, 0),
            spec(&[1, 2], Transport::Nccl, 1),
            spec(&[0, 3], Transport::Nccl, 2),
            spec(&[2, 3], Transport::Nccl, 3),
        ];
        let plans: Vec<Vec<usize>> = (0..4)
            .map(|r| join_order(&groups, r).into_iter().map(|(i, _)| i).collect())
            .collect();
        assert!(completes(&groups, &plans));
        // The check can fail: rank 3 joining its groups in reverse order waits at group 3
        // while rank 2 waits for it at group 0.
        let mut crossed = plans.clone();
        crossed[3].reverse();
        assert!(!completes(&groups, &crossed));
    }
}
