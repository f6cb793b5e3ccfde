//! Which GPU each rank runs on and how each process group of a Plan communicates: NCCL when
//! its members sit on distinct GPUs, the backend's own device-copy collectives when two of
//! them share one (NCCL refuses two ranks of one communicator on one device). Host logic
//! only, so it is unit-tested without a GPU.

use parsim_plan::plan::Plan;
use parsim_plan::GroupKind;
use std::collections::BTreeSet;

/// How the ranks of a run map onto processes and GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every rank a thread of this process, spread over `gpus` visible GPUs in contiguous
    /// blocks (adjacent ranks, the tensor-parallel groups of the Plan's rank order, share a
    /// GPU first).
    SingleProcess { gpus: u32 },
    /// One rank per process, on the node-local GPU `local_rank % gpus`.
    MultiProcess { gpus: u32 },
}

/// How one group's collectives move data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One member: collectives are copies (or nothing).
    Solo,
    /// An NCCL communicator split from the world communicator.
    Nccl,
    /// Device-to-device copies and a sum kernel within this process.
    Local,
}

/// One process group of the Plan, as every member builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// Global ranks, in member order.
    pub members: Vec<u32>,
    /// The GPU ordinal of each member.
    pub devices: Vec<u32>,
    pub transport: Transport,
    /// The colour of `ncclCommSplit` (the group's index among the Plan's distinct groups):
    /// every rank calls the split once per colour in the same order, members with their
    /// member index as key, the others with `NCCL_SPLIT_NOCOLOR`.
    pub color: i32,
}

/// Why ranks cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("no GPU visible: --backend cuda needs at least one")]
    NoGpu,
    #[error("the Plan has no ranks")]
    NoRanks,
    #[error(
        "process group {members:?} has ranks {a} and {b} on GPU {gpu} in different processes: \
         NCCL refuses two ranks of one communicator on one device; start at most one process \
         per GPU (--nproc-per-node <= the GPUs visible) or run in one process"
    )]
    SharedGpuAcrossProcesses {
        members: Vec<u32>,
        a: u32,
        b: u32,
        gpu: u32,
    },
}

/// The GPU of global rank `rank` among `world` ranks. Single process: contiguous blocks,
/// rank r on GPU floor(r * gpus / world) when there are fewer GPUs than ranks, GPU r
/// otherwise. Several processes: `local_rank` is the process's own rank on its node.
pub fn device_of(
    placement: Placement,
    world: u32,
    rank: u32,
    local_rank: u32,
) -> Result<u32, PlacementError> {
    match placement {
        Placement::SingleProcess { gpus: 0 } | Placement::MultiProcess { gpus: 0 } => {
            Err(PlacementError::NoGpu)
        }
        _ if world == 0 => Err(PlacementError::NoRanks),
        Placement::SingleProcess { gpus } if gpus >= world => Ok(rank),
        Placement::SingleProcess { gpus } => Ok((rank as u64 * gpus as u64 / world as u64) as u32),
        Placement::MultiProcess { gpus } => Ok(local_rank % gpus),
    }
}

/// Every distinct process group of `plan` the executor communicates over (each kind it states
/// but the dense DP group: the dense gradients reduce over DP x CP), and the whole world,
/// sorted, each with its members' GPUs and its transport. In several processes,
/// `local_rank_of(r)` gives rank r's rank on its node and `node_of(r)` its node; two members on
/// one GPU of one node is an error there.
pub fn plan_groups(
    plan: &Plan,
    placement: Placement,
    node_of: impl Fn(u32) -> u32,
    local_rank_of: impl Fn(u32) -> u32,
) -> Result<Vec<GroupSpec>, PlacementError> {
    let lists = plan.ranks.iter().flat_map(|rp| {
        rp.groups
            .iter()
            .filter(|&(kind, _)| kind != GroupKind::Dp)
            .map(|(_, members)| members)
    });
    groups_of(
        plan.ranks.len() as u32,
        lists,
        placement,
        node_of,
        local_rank_of,
    )
}

/// [`plan_groups`] on the group lists of every rank of a `world`-rank run.
pub fn groups_of<'a>(
    world: u32,
    lists: impl Iterator<Item = &'a [u32]>,
    placement: Placement,
    node_of: impl Fn(u32) -> u32,
    local_rank_of: impl Fn(u32) -> u32,
) -> Result<Vec<GroupSpec>, PlacementError> {
    if world == 0 {
        return Err(PlacementError::NoRanks);
    }
    let mut distinct: BTreeSet<Vec<u32>> = BTreeSet::new();
    distinct.insert((0..world).collect());
    distinct.extend(lists.filter(|g| !g.is_empty()).map(<[u32]>::to_vec));
    distinct
        .into_iter()
        .enumerate()
        .map(|(color, members)| {
            let devices = members
                .iter()
                .map(|&r| device_of(placement, world, r, local_rank_of(r)))
                .collect::<Result<Vec<u32>, _>>()?;
            let transport = transport_of(placement, &members, &devices, &node_of)?;
            Ok(GroupSpec {
                members,
                devices,
                transport,
                color: color as i32,
            })
        })
        .collect()
}

/// NCCL when no two members share a GPU; otherwise device copies (one process) or an error
/// (several processes cannot share device memory through this backend).
fn transport_of(
    placement: Placement,
    members: &[u32],
    devices: &[u32],
    node_of: &impl Fn(u32) -> u32,
) -> Result<Transport, PlacementError> {
    if members.len() == 1 {
        return Ok(Transport::Solo);
    }
    let mut seen: Vec<((u32, u32), u32)> = Vec::with_capacity(members.len());
    for (&r, &d) in members.iter().zip(devices) {
        let key = match placement {
            Placement::SingleProcess { .. } => (0, d),
            Placement::MultiProcess { .. } => (node_of(r), d),
        };
        if let Some(&(_, other)) = seen.iter().find(|(k, _)| *k == key) {
            return match placement {
                Placement::SingleProcess { .. } => Ok(Transport::Local),
                Placement::MultiProcess { .. } => Err(PlacementError::SharedGpuAcrossProcesses {
                    members: members.to_vec(),
                    a: other,
                    b: r,
                    gpu: d,
                }),
            };
        }
        seen.push((key, r));
    }
    Ok(Transport::Nccl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_process_blocks_cover_every_gpu_evenly() {
        // 8 ranks on 2 GPUs: 0..4 on GPU 0, 4..8 on GPU 1; on 8 GPUs: one each; on 3 GPUs the
        // block sizes differ by at most one (3, 3, 2).
        let on = |gpus, world| {
            (0..world)
                .map(|r| device_of(Placement::SingleProcess { gpus }, world, r, 0).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(on(2, 8), [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(on(8, 8), (0..8).collect::<Vec<_>>());
        assert_eq!(on(16, 4), [0, 1, 2, 3]);
        let three = on(3, 8);
        let counts: Vec<usize> = (0..3)
            .map(|g| three.iter().filter(|&&d| d == g).count())
            .collect();
        assert_eq!(counts.iter().sum::<usize>(), 8);
        assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
        // Blocks are contiguous: the device never decreases with the rank.
        assert!(three.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn no_gpu_is_an_error() {
        assert_eq!(
            device_of(Placement::SingleProcess { gpus: 0 }, 4, 0, 0),
            Err(PlacementError::NoGpu)
        );
        assert_eq!(
            device_of(Placement::MultiProcess { gpus: 0 }, 4, 0, 0),
            Err(PlacementError::NoGpu)
        );
    }

    #[test]
    fn multi_process_uses_the_local_rank() {
        assert_eq!(
            device_of(Placement::MultiProcess { gpus: 4 }, 16, 13, 5),
            Ok(1)
        );
    }

    fn members(m: &[u32]) -> Vec<u32> {
        m.to_vec()
    }

    #[test]
    fn transport_is_nccl_on_distinct_gpus_local_on_a_shared_one() {
        let node = |_r: u32| 0;
        let single = Placement::SingleProcess { gpus: 1 };
        assert_eq!(
            transport_of(single, &members(&[0, 1]), &[0, 0], &node),
            Ok(Transport::Local)
        );
        assert_eq!(
            transport_of(single, &members(&[0, 1, 2]), &[0, 1, 2], &node),
            Ok(Transport::Nccl)
        );
        // Two of three members share GPU 1: NCCL would refuse the communicator.
        assert_eq!(
            transport_of(single, &members(&[0, 1, 2]), &[0, 1, 1], &node),
            Ok(Transport::Local)
        );
        assert_eq!(
            transport_of(single, &members(&[5]), &[0], &node),
            Ok(Transport::Solo)
        );
    }

    #[test]
    fn multi_process_shared_gpu_names_the_ranks_and_gpu() {
        // Ranks 0 and 4 on two nodes, both local GPU 0: distinct devices, NCCL.
        let node = |r: u32| r / 4;
        let multi = Placement::MultiProcess { gpus: 4 };
        assert_eq!(
            transport_of(multi, &members(&[0, 4]), &[0, 0], &node),
            Ok(Transport::Nccl)
        );
        // Ranks 0 and 2 on one node, both GPU 0: an error naming them.
        let e = transport_of(multi, &members(&[0, 2]), &[0, 0], &node).unwrap_err();
        assert_eq!(
            e,
            PlacementError::SharedGpuAcrossProcesses {
                members: vec![0, 2],
                a: 0,
                b: 2,
                gpu: 0
            }
        );
        assert!(e.to_string().contains("GPU 0"), "{e}");
    }

    /// The groups of a TP 2 x DP 2 layout (rank = dp * 2 + tp), as every rank lists them.
    fn tp2_dp2() -> Vec<Vec<u32>> {
        let mut lists = Vec::new();
        for r in 0..4u32 {
            let (tp, dp) = (r % 2, r / 2);
            lists.push(vec![dp * 2, dp * 2 + 1]); // tensor parallel
            lists.push(vec![tp, tp + 2]); // data parallel
            lists.push(vec![r]); // pipeline (one stage)
        }
        lists
    }

    #[test]
    fn groups_are_deduplicated_with_the_world_and_stable_colours() {
        let lists = tp2_dp2();
        let g = groups_of(
            4,
            lists.iter().map(Vec::as_slice),
            Placement::SingleProcess { gpus: 4 },
            |_| 0,
            |r| r,
        )
        .unwrap();
        let m: Vec<Vec<u32>> = g.iter().map(|s| s.members.clone()).collect();
        // Two TP pairs, two DP pairs, four singletons and the world: 9 distinct groups.
        assert_eq!(m.len(), 9);
        assert!(m.contains(&vec![0, 1, 2, 3]));
        assert!(m.contains(&vec![0, 2]) && m.contains(&vec![1, 3]));
        let colours: Vec<i32> = g.iter().map(|s| s.color).collect();
        assert_eq!(colours, (0..9).collect::<Vec<i32>>());
        // Every rank derives the same list whatever order it lists its own groups in.
        let mut rev = lists.clone();
        rev.reverse();
        let g2 = groups_of(
            4,
            rev.iter().map(Vec::as_slice),
            Placement::SingleProcess { gpus: 4 },
            |_| 0,
            |r| r,
        )
        .unwrap();
        assert_eq!(g, g2);
        for s in &g {
            let want = if s.members.len() == 1 {
                Transport::Solo
            } else {
                Transport::Nccl
            };
            assert_eq!(s.transport, want, "{:?}", s.members);
        }
    }

    #[test]
    fn one_gpu_runs_every_group_locally() {
        // The workstation case: all four ranks on GPU 0, every group of two or more members
        // uses the device-copy collectives.
        let g = groups_of(
            4,
            tp2_dp2().iter().map(Vec::as_slice),
            Placement::SingleProcess { gpus: 1 },
            |_| 0,
            |_| 0,
        )
        .unwrap();
        for s in &g {
            assert!(s.devices.iter().all(|&d| d == 0));
            if s.members.len() > 1 {
                assert_eq!(s.transport, Transport::Local, "{:?}", s.members);
            }
        }
        // Two GPUs: TP pairs share a GPU (local), DP pairs span both (NCCL).
        let g = groups_of(
            4,
            tp2_dp2().iter().map(Vec::as_slice),
            Placement::SingleProcess { gpus: 2 },
            |_| 0,
            |_| 0,
        )
        .unwrap();
        let t = |m: &[u32]| g.iter().find(|s| s.members == m).unwrap().transport;
        assert_eq!(t(&[0, 1]), Transport::Local);
        assert_eq!(t(&[0, 2]), Transport::Nccl);
        assert_eq!(t(&[0, 1, 2, 3]), Transport::Local);
    }
}
