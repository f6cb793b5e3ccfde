//! A block's parameters for one pass: the handles that hold them (gathered under ZeRO-3)
//! and the views the layer code reads, with those of its experts, adapters, frozen experts
//! and of the block whose weights an MTP block shares.

use super::state::Rank;
use crate::backend::{Backend, View};
use crate::error::ExecError;
use crate::layers::blocks::{BlockLayout, SPACES};
use crate::layers::layer::Experts;
use crate::layers::lora::Adapters;
use crate::runner::zero::{params_of, Handle};

/// A block run with a layer (experts, adapters, frozen experts): its index and parameters.
type CompanionHandle<T> = Option<(usize, Handle<T>)>;

/// The handles of a block's parameters and of the blocks run with it.
pub(super) struct BlockParams<T> {
    /// The block whose weights an MTP block shares (the embedding or the output layer).
    pub(super) shared: Option<usize>,
    sh: Option<Handle<T>>,
    h: Handle<T>,
    eh: Option<(usize, Handle<T>)>,
    ah: CompanionHandle<T>,
    fh: CompanionHandle<T>,
}

/// The views of a block's parameters that the layer code reads.
pub(super) struct BlockViews<'p, B: Backend> {
    pub(super) p: View<'p, B::Tensor>,
    /// The shared block of an MTP block, and its parameters.
    pub(super) shared: Option<(&'p BlockLayout, View<'p, B::Tensor>)>,
    pub(super) experts: Experts<'p, B>,
    pub(super) ad: Adapters<'p, B>,
}

/// The views of `bp` into the rank's `params` (laid out as `blocks`).
pub(super) fn views<'p, B: Backend>(
    bp: &'p BlockParams<B::Tensor>,
    params: &'p [B::Tensor; SPACES],
    blocks: &'p [BlockLayout],
) -> BlockViews<'p, B> {
    let shared = bp
        .shared
        .zip(bp.sh.as_ref())
        .map(|(o, h)| (&blocks[o], params_of(params, h)));
    let frozen = bp
        .fh
        .as_ref()
        .map(|(fi, h)| (&blocks[*fi], params_of(params, h)));
    let experts: Experts<B> = bp
        .eh
        .as_ref()
        .map(|(ei, eh)| (&blocks[*ei], params_of(params, eh), frozen));
    let ad: Adapters<B> = bp
        .ah
        .as_ref()
        .map(|(ai, h)| (&blocks[*ai], params_of(params, h)));
    BlockViews {
        p: params_of(params, &bp.h),
        shared,
        experts,
        ad,
    }
}

impl<'a, B: Backend> Rank<'a, B> {
    /// The parameters block `bi` runs with: the shared block's of an MTP block, its own and
    /// its experts', adapters' and frozen experts' (gathered in that order under ZeRO-3).
    pub(super) fn block_params(&mut self, bi: usize) -> Result<BlockParams<B::Tensor>, ExecError> {
        let shared = self.mtp_shared_block(bi)?;
        let sh = match shared {
            Some(o) => Some(self.block_handles(o)?.0),
            None => None,
        };
        let (h, eh) = self.block_handles(bi)?;
        let ah = self.handle_at(self.adapters_of(bi))?;
        let fh = self.handle_at(self.frozen_experts_of(bi))?;
        Ok(BlockParams {
            shared,
            sh,
            h,
            eh,
            ah,
            fh,
        })
    }

    /// Block `at` (when there is one) with its parameters (gathered under ZeRO-3): a layer's
    /// experts, adapters or frozen experts.
    pub(super) fn handle_at(
        &mut self,
        at: Option<usize>,
    ) -> Result<CompanionHandle<B::Tensor>, ExecError> {
        match at {
            Some(i) => Ok(Some((i, self.handle(i)?))),
            None => Ok(None),
        }
    }
}
