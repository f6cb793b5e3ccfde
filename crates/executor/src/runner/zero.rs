//! ZeRO over a rank's flat parameter buffers (Rajbhandari et al. 2020), as Megatron's
//! distributed optimizer shards them: sharding of each space (dense, experts) over its group,
//! the ZeRO-3 gather cache, the gradient buckets of ZeRO 2/3, and the optimizer step per stage.
//!
//! The rank's parameters are one flat buffer split over its group, DP x CP (the replicas of the
//! dense parameters, as Megatron folds CP into DP for gradients), into contiguous shards of
//! ceil(P / members) elements.
//! - 0: full gradients, all-reduced over DP x CP at the step; Adam on every parameter.
//! - 1: full gradients, reduce-scattered at the step; Adam on the shard; updated shards
//!   all-gathered.
//! - 2: as 1, but each block's gradients are reduce-scattered into the shard as soon as they
//!   are computed (one block-sized bucket at a time), so only the shard is kept.
//! - 3: as 2, and the parameters too are kept as a shard: a block is all-gathered before use
//!   and freed after; in forward two gather units are live at a time (the one in use and
//!   the next, as a prefetch would hold them; a LoRA layer's adapters go with its frozen
//!   weights, frozen experts with their adapters), in backward the one in use and its
//!   gradient bucket.
//!
//! Mixture-of-experts models keep their experts in a second flat buffer (an expert *space*),
//! as Megatron keeps expert parameters apart: everything above applies to it with the
//! expert-data-parallel group (the ranks holding the same experts) in place of DP x CP.

use crate::backend::{flat_shard, Backend, Device, ProcessGroup, View};

use crate::error::ExecError;
use crate::layers::blocks::{init_range, is_frozen_space, layout_len, BlockLayout, SPACES};
use crate::traced_ops::TracedOps;
use crate::tracker::Category;
use parsim_plan::plan::{Plan, Precision};
use parsim_plan::DType;
use std::ops::Range;
use std::rc::Rc;

/// One space's state on a rank.
pub(super) struct Space<T> {
    /// This rank's shard of the flat buffer.
    pub(super) shard: Range<usize>,
    /// The parameters the model reads (whole, or the shard under ZeRO-3): fp32, or the bf16
    /// weight copy in mixed precision.
    pub(super) params: T,
    /// Mixed precision: the fp32 master weights, kept with the optimizer states (whole under
    /// ZeRO-0, else the shard).
    pub(super) master: Option<T>,
    /// fp32 gradients (whole, or the shard under ZeRO 2/3).
    pub(super) grads: T,
    /// Adam moments (whole under ZeRO-0, else the shard).
    pub(super) m: T,
    pub(super) v: T,
}

/// Initialises space `sp` of `blocks` for a member of `group` (its ZeRO group), with the
/// finite-difference perturbations applied.
pub(super) fn init_space<B: Backend>(
    ops: &TracedOps<B>,
    plan: &Plan,
    blocks: &[BlockLayout],
    g: &B::Group,
    sp: usize,
    perturb: &[(String, usize, f32)],
    precision: Precision,
) -> Result<Space<B::Tensor>, ExecError> {
    let zero = plan.parallel.zero;
    let total = layout_len(blocks, sp);
    let shard = flat_shard(total, g.size(), g.index());
    // The initial values of a range, made on the host (the seeded generator) and uploaded.
    let values = |range: Range<usize>| {
        let mut data = vec![0.0f32; range.len()];
        init_range(plan.seed, blocks, sp, range.clone(), &mut data);
        for (name, gi, delta) in perturb {
            // A tied output weight aliases the embedding's table: perturb each element once.
            let mut done = std::collections::HashSet::new();
            for b in blocks.iter().filter(|b| b.space == sp) {
                for t in &b.tensors {
                    for i in 0..t.len() {
                        let (s, g) = t.global_of(i);
                        let flat = b.range.start + t.offset + i;
                        if &s.name == name && g == *gi && range.contains(&flat) && done.insert(flat)
                        {
                            data[flat - range.start] += delta;
                        }
                    }
                }
            }
        }
        data
    };
    let prange = if zero >= 3 { shard.clone() } else { 0..total };
    let orange = if zero >= 1 { shard.clone() } else { 0..total };
    let dtype = precision.compute_dtype();
    let params = ops.upload(Category::Weights, dtype, &[prange.len()], &values(prange))?;
    // LoRA's frozen base weights: parameters only.
    let frozen = is_frozen_space(sp);
    let master = match precision {
        _ if frozen => None,
        Precision::Fp32 => None,
        Precision::Bf16 => Some(ops.upload(
            Category::Optimizer,
            DType::F32,
            &[orange.len()],
            &values(orange.clone()),
        )?),
    };
    let glen = if zero >= 2 { shard.len() } else { total };
    let (glen, olen) = if frozen { (0, 0) } else { (glen, orange.len()) };
    Ok(Space {
        shard,
        params,
        master,
        grads: ops.alloc(Category::Gradients, DType::F32, &[glen])?,
        m: ops.alloc(Category::Optimizer, DType::F32, &[olen])?,
        v: ops.alloc(Category::Optimizer, DType::F32, &[olen])?,
    })
}

/// A block's parameters and its experts block's (index, parameters).
pub(super) type BlockHandles<T> = (Handle<T>, Option<(usize, Handle<T>)>);

pub(super) enum Handle<T> {
    Flat(usize, Range<usize>),
    Gathered(Rc<T>),
}

pub(super) fn params_of<'p, T: crate::backend::DeviceTensor>(
    params: &'p [T; SPACES],
    h: &'p Handle<T>,
) -> View<'p, T> {
    match h {
        Handle::Flat(space, r) => View {
            tensor: &params[*space],
            range: r.clone(),
        },
        Handle::Gathered(t) => View::all(t),
    }
}
