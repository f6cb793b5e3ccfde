//! DeepSeek-V3's auxiliary-loss-free load balancing ("DeepSeek-V3 Technical Report", sec.
//! 2.1.2; Megatron's `--moe-router-enable-expert-bias`): each MoE layer keeps a per-expert
//! bias, added to the router's scores to choose experts but never to the gates, and after
//! every step moved by `rate` x sign(mean load - load of the expert), the loads counted over
//! every token of the step (all microbatches, all data-parallel ranks). The bias is state,
//! not a trained parameter: no gradient, no optimizer moments; it starts at zero as in
//! Megatron, so every rank holds the same values after the same steps.

use crate::backend::{Backend, Device, DeviceCollectives, ReduceOp, View, ViewMut};

use crate::error::ExecError;
use crate::traced_comm::TracedComm;
use crate::traced_ops::TracedOps;
use crate::tracker::Category;
use parsim_plan::DType;
use std::collections::BTreeMap;

/// The biases and this step's expert loads of the MoE layers a rank holds.
#[derive(Debug, Clone, Default)]
pub struct RouterBias {
    /// Per MoE layer: (bias [E], tokens routed to each expert this step on this rank).
    layers: BTreeMap<u32, (Vec<f32>, Vec<f32>)>,
}

impl RouterBias {
    /// The bias of `layer` (zeros before its first update).
    pub fn bias(&mut self, layer: u32, experts: usize) -> &[f32] {
        &self
            .layers
            .entry(layer)
            .or_insert_with(|| (vec![0.0; experts], vec![0.0; experts]))
            .0
    }

    /// Counts the chosen experts (before any capacity drop) of a forward of `layer`.
    pub fn count(&mut self, layer: u32, experts: usize, chosen: &[usize]) {
        let (_, load) = self
            .layers
            .entry(layer)
            .or_insert_with(|| (vec![0.0; experts], vec![0.0; experts]));
        for &x in chosen {
            load[x] += 1.0;
        }
    }

    /// The end-of-step update of every layer's bias from its loads summed over `group` (the
    /// rank's DP x CP group, which sees every token of the step), then the loads reset.
    /// `ops` and `comm` are the rank's device and collectives.
    pub fn update<B: Backend>(
        &mut self,
        ops: &TracedOps<B>,
        comm: &TracedComm<B>,
        group: &B::Group,
        rate: f32,
    ) -> Result<(), ExecError> {
        let layers: Vec<u32> = self.layers.keys().copied().collect();
        for l in layers {
            let load = self.layers[&l].1.clone();
            let e = load.len();
            let mut t = ops.upload(Category::Buffers, DType::F32, &[e], &load)?;
            comm.all_reduce(group, ViewMut::all(&mut t), ReduceOp::Sum)?;
            let total = ops.download(View::all(&t))?;
            let mean = total.iter().map(|&x| x as f64).sum::<f64>() / e as f64;
            let (bias, load) = self.layers.get_mut(&l).expect("layer");
            for (b, &x) in bias.iter_mut().zip(&total) {
                let offset = mean - x as f64;
                if offset != 0.0 {
                    *b += rate * offset.signum() as f32;
                }
            }
            load.iter_mut().for_each(|x| *x = 0.0);
        }
        Ok(())
    }
}
