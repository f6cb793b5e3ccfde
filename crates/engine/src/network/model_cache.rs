//! NCCL's models of the tuned collectives per group shape, kept per thread: a shape's topology
//! search and constants ([`super::nccl`]) depend only on the GPU generation, the NIC rate and
//! the group's ranks, ranks per node and nodes, and every estimate of a layout (and every
//! layout a search tries) asks for the same few shapes again. Pure functions of the key, so a
//! hit gives exactly what building them would.

use super::nccl::CollectiveModel;
use crate::config::NcclArch;
use std::cell::RefCell;

/// What a group's NCCL models depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShapeKey {
    pub arch: NcclArch,
    /// The NIC rate's bits (bytes per second), compared exactly.
    pub nic_bytes_per_s_bits: u64,
    pub ranks: u32,
    pub per_node: u32,
    pub nodes: u32,
}

/// Shapes kept per thread; past this many the list starts over (a search meets a few dozen).
const CAPACITY: usize = 64;

thread_local! {
    static MODELS: RefCell<Vec<(ShapeKey, [CollectiveModel; 3])>> = const { RefCell::new(Vec::new()) };
}

/// `f` of the models of `key`, from the thread's list or from `build` (then kept).
pub(super) fn with_models<R>(
    key: ShapeKey,
    build: impl FnOnce() -> [CollectiveModel; 3],
    f: impl FnOnce(&[CollectiveModel; 3]) -> R,
) -> R {
    let index = MODELS.with(|m| m.borrow().iter().position(|(k, _)| *k == key));
    if let Some(i) = index {
        return MODELS.with(|m| f(&m.borrow()[i].1));
    }
    let models = build();
    let r = f(&models);
    MODELS.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= CAPACITY {
            m.clear();
        }
        m.push((key, models));
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CollectiveKind;
    use crate::network::nccl::Fabric;

    /// A kept shape gives the models it was built with, and another key builds its own:
    /// predictions from the list equal fresh ones.
    #[test]
    fn a_kept_shape_predicts_as_a_fresh_build() {
        let fresh = |ranks: u32, nodes: u32| {
            [
                CollectiveKind::AllReduce,
                CollectiveKind::AllGather,
                CollectiveKind::ReduceScatter,
            ]
            .map(|c| CollectiveModel::new(&Fabric::dgx_h100(), c, ranks, nodes))
        };
        let key = |ranks: u32, nodes: u32| ShapeKey {
            arch: NcclArch::Hopper,
            nic_bytes_per_s_bits: 50e9f64.to_bits(),
            ranks,
            per_node: ranks / nodes,
            nodes,
        };
        let mut built = 0;
        for _ in 0..3 {
            for (ranks, nodes) in [(8, 1), (16, 2)] {
                let got = with_models(
                    key(ranks, nodes),
                    || {
                        built += 1;
                        fresh(ranks, nodes)
                    },
                    |m| m.clone(),
                );
                for (a, b) in got.iter().zip(&fresh(ranks, nodes)) {
                    for bytes in [1e3, 1e6, 1e9] {
                        assert_eq!(a.predict(bytes), b.predict(bytes));
                    }
                }
            }
        }
        assert_eq!(built, 2, "each shape is built once per thread");
    }
}
