//! The run's report assembled from every rank's result.

use super::options::RunOptions;
use super::rank::output::{Element, RankOutput};
use crate::error::ExecError;
use parsim_plan::pieces::{merge, pieces_of, TensorPieces};
use parsim_plan::plan::Plan;
use parsim_plan::run_report::RunReport;

/// How a report carries the exported tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Exported {
    /// Merged into whole tensors: every rank ran in this process.
    Whole,
    /// As this process's pieces, for rank 0 of a launched job to merge.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Pieces,
}

/// The run's report from every rank's result (every backend): the first real failure rather
/// than the ranks that gave up because of it, else the losses averaged over the global
/// batch's tokens and the exported tensors, merged from the ranks' pieces or (`Pieces`, one
/// rank of a launched job) left in pieces.
pub(super) fn assemble(
    plan: &Plan,
    opts: &RunOptions,
    results: Vec<Result<RankOutput, ExecError>>,
    exported: Exported,
) -> Result<RunReport, ExecError> {
    let mut results = results;
    if let Some(i) = results
        .iter()
        .position(|r| matches!(r, Err(e) if !matches!(e, ExecError::Aborted { .. })))
    {
        results.swap_remove(i)?;
    }
    let outs: Vec<RankOutput> = results.into_iter().collect::<Result<_, _>>()?;
    let tokens = (plan.global_batch() * plan.model.seq) as f64;
    let loss = (0..opts.steps as usize)
        .map(|i| outs.iter().map(|o| o.loss_sums[i]).sum::<f64>() / tokens)
        .collect();
    let aux_loss = (0..opts.steps as usize)
        .map(|i| outs.iter().map(|o| o.aux_sums[i]).sum::<f64>() / tokens)
        .collect();
    let pieces = |on: bool, of: &dyn Fn(&RankOutput) -> &[Element]| {
        on.then(|| outs.iter().map(|o| pieces_of(of(o))).collect::<Vec<_>>())
    };
    let param_pieces = pieces(opts.export_params, &|o| &o.params);
    let grad_pieces = pieces(opts.export_grads, &|o| &o.grads);
    let (params, grads, param_pieces, grad_pieces) = match exported {
        Exported::Whole => (
            param_pieces.map(merge).transpose()?,
            grad_pieces.map(merge).transpose()?,
            None,
            None,
        ),
        Exported::Pieces => {
            // Every rank of this process (one in a launched job), each tensor's pieces kept.
            let one = |p: Option<Vec<TensorPieces>>| {
                p.map(|v| {
                    let mut all = TensorPieces::new();
                    for (name, ps) in v.into_iter().flatten() {
                        all.entry(name).or_default().extend(ps);
                    }
                    all
                })
            };
            (None, None, one(param_pieces), one(grad_pieces))
        }
    };
    let traces = opts.trace.map(|_| {
        outs.iter()
            .map(|o| o.trace.clone().unwrap_or_default())
            .collect()
    });
    Ok(RunReport {
        world: plan.world(),
        loss,
        aux_loss,
        ranks: outs.into_iter().map(|o| o.report).collect(),
        params,
        grads,
        param_pieces,
        grad_pieces,
        traces,
    })
}
