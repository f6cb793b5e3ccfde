//! Per-stage durations and point-to-point costs fed to the simulator.
//!
//! Conventions (all times in seconds, or in any one unit used consistently):
//! - `forward[s]`: F of stage s; `backward[s]`: the *full* backward B of stage s;
//!   `input_grad[s]` and `weight_grad[s]`: its two parts I and W, with B = I + W always.
//! - Schedules that do not split the backward (GPipe, 1F1B, interleaved 1F1B, and DualPipe-V's
//!   overlapped slots) use B; split schedules (ZB-H1, ZB-V, DualPipe-V's zero-bubble phases)
//!   use I and W.
//! - [`Costs::uniform`] follows the `parsim schedule` flags: with `w` given, B splits into
//!   I = b and W = w (so B = b + w); without it B = b and, for split schedules, I = W = b/2
//!   (the two backward GEMMs of a linear layer cost the same FLOPs).
//! - A hop between stages s and s+1 on different ranks costs `p2p_latency + hop_transfer[s]`
//!   in either direction (activations forward, their gradients backward: same size). A
//!   hand-over between two stages on the same rank (the bottom of a V) costs nothing.
//! - Under blocking pipeline p2p ([`Costs::with_blocking_hops`]) a hop between ranks is part
//!   of the busy time of the actions at both ends instead, and hands over free.
//! - An overlapped forward-and-backward slot of DualPipe-V lasts
//!   `overlap_factor * (F + B)`; the default 1.0 gives no overlap benefit (the DualPipe README
//!   bubble formula and its schedule figure count F&B as F + B). A measured factor below 1
//!   models compute-communication overlap.

use super::action::{rank_of_stage, Placement};
use super::error::ScheduleError;

/// Durations of every stage's actions and the cost of one pipeline hop.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    /// Forward time per global stage.
    pub forward: Vec<f64>,
    /// Full backward time (B = I + W) per global stage.
    pub backward: Vec<f64>,
    /// Input-gradient part I per global stage.
    pub input_grad: Vec<f64>,
    /// Weight-gradient part W per global stage.
    pub weight_grad: Vec<f64>,
    /// Latency of one point-to-point message between neighbouring ranks.
    pub p2p_latency: f64,
    /// Transfer time (bytes / bandwidth) across the boundary between stage s and s+1,
    /// `num_stages - 1` entries.
    pub hop_transfer: Vec<f64>,
    /// Duration of an overlapped F&B slot as a fraction of F + B, in (0, 1]; 1.0 = no benefit.
    pub overlap_factor: f64,
}

impl Costs {
    /// The same durations on every one of the `pp * vpp` stages (the `parsim schedule` flags).
    ///
    /// With `w = Some(w)` the backward splits into I = `b` and W = `w` (B = b + w); with
    /// `None`, B = `b` and split schedules use I = W = b/2. `p2p_s` is the per-hop latency;
    /// the transfer time is 0 (see [`Costs::with_hop_transfer`]).
    pub fn uniform(
        pp: u32,
        vpp: u32,
        f: f64,
        b: f64,
        w: Option<f64>,
        p2p_s: f64,
    ) -> Result<Costs, ScheduleError> {
        if pp == 0 {
            return Err(ScheduleError::ZeroPp { pp });
        }
        if vpp == 0 {
            return Err(ScheduleError::ZeroVpp { vpp });
        }
        let n = (pp as usize) * (vpp as usize);
        let (i, wv) = match w {
            Some(w) => (b, w),
            None => (b / 2.0, b / 2.0),
        };
        Costs::from_split(vec![f; n], vec![i; n], vec![wv; n], p2p_s, vec![0.0; n - 1])
    }

    /// Explicit per-stage durations with the backward split into I and W (B = I + W).
    /// This is what the engine feeds: the first stage carries the embedding, the last the
    /// output layer and the loss, so durations differ stage by stage.
    pub fn from_split(
        forward: Vec<f64>,
        input_grad: Vec<f64>,
        weight_grad: Vec<f64>,
        p2p_latency: f64,
        hop_transfer: Vec<f64>,
    ) -> Result<Costs, ScheduleError> {
        let backward = input_grad
            .iter()
            .zip(&weight_grad)
            .map(|(i, w)| i + w)
            .collect();
        let costs = Costs {
            forward,
            backward,
            input_grad,
            weight_grad,
            p2p_latency,
            hop_transfer,
            overlap_factor: 1.0,
        };
        costs.validate()?;
        Ok(costs)
    }

    /// Explicit per-stage durations with only the full backward known; split schedules use
    /// I = W = B/2.
    pub fn from_unsplit(
        forward: Vec<f64>,
        backward: Vec<f64>,
        p2p_latency: f64,
        hop_transfer: Vec<f64>,
    ) -> Result<Costs, ScheduleError> {
        let half: Vec<f64> = backward.iter().map(|b| b / 2.0).collect();
        Costs::from_split(forward, half.clone(), half, p2p_latency, hop_transfer)
    }

    /// Sets every hop's transfer time (bytes / bandwidth) to `t`.
    pub fn with_hop_transfer(mut self, t: f64) -> Result<Costs, ScheduleError> {
        self.hop_transfer.iter_mut().for_each(|x| *x = t);
        self.validate()?;
        Ok(self)
    }

    /// Sets the measured overlap factor of DualPipe-V's F&B slots (duration = factor * (F+B)).
    pub fn with_overlap_factor(mut self, factor: f64) -> Result<Costs, ScheduleError> {
        self.overlap_factor = factor;
        self.validate()?;
        Ok(self)
    }

    /// These costs as a blocking pipeline engine runs them (2021 Megatron-LM's
    /// `p2p_communication._communicate`, which waits for its transfers and then
    /// `torch.cuda.synchronize()`s; DeepSpeed's `PipelineEngine`, whose send and receive
    /// instructions run between its compute instructions). Every hop between stages on
    /// different ranks (`placement` over `pp` ranks) is moved into the busy time of the actions
    /// that run it, in the order of Megatron-LM's 1F1B (`schedules.py`): the forward of stage s
    /// is followed by the send of its output (`send_forward`, or `send_forward_recv_backward`,
    /// whose receive of the gradient runs in the same batched call), the input-gradient
    /// backward of stage s + 1 by the send of its input's gradient. The receive at the other
    /// end is the same transfer, which the receiver waits for anyway, so the receiver's input
    /// exists when the sender's action ends: the hop then costs nothing, latency included (not
    /// counted twice). Two stages on the same rank hand over free, as before.
    pub fn with_blocking_hops(
        mut self,
        placement: Placement,
        pp: u32,
    ) -> Result<Costs, ScheduleError> {
        for s in 0..self.num_stages().saturating_sub(1) {
            let (lower, upper) = (s as u32, s as u32 + 1);
            if rank_of_stage(placement, pp, lower) == rank_of_stage(placement, pp, upper) {
                continue;
            }
            let hop_s = self.hop(lower);
            self.forward[s] += hop_s;
            self.input_grad[s + 1] += hop_s;
            self.backward[s + 1] += hop_s;
        }
        self.p2p_latency = 0.0;
        self.hop_transfer.iter_mut().for_each(|x| *x = 0.0);
        self.validate()?;
        Ok(self)
    }

    /// Number of stages described.
    pub fn num_stages(&self) -> usize {
        self.forward.len()
    }

    /// Checks lengths, signs and finiteness.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let n = self.forward.len();
        if n == 0 {
            return Err(ScheduleError::BadCosts("no stages".into()));
        }
        for (name, v) in [
            ("backward", &self.backward),
            ("input_grad", &self.input_grad),
            ("weight_grad", &self.weight_grad),
        ] {
            if v.len() != n {
                return Err(ScheduleError::BadCosts(format!(
                    "{name} has {} stages but forward has {n}",
                    v.len()
                )));
            }
        }
        if self.hop_transfer.len() != n - 1 {
            return Err(ScheduleError::BadCosts(format!(
                "hop_transfer needs num_stages - 1 = {} entries, got {}",
                n - 1,
                self.hop_transfer.len()
            )));
        }
        for (name, v) in [
            ("forward", &self.forward[..]),
            ("input_grad", &self.input_grad[..]),
            ("weight_grad", &self.weight_grad[..]),
            ("hop_transfer", &self.hop_transfer[..]),
            ("p2p_latency", std::slice::from_ref(&self.p2p_latency)),
        ] {
            if let Some(x) = v.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(ScheduleError::BadCosts(format!(
                    "{name} must be a finite, non-negative time (got {x})"
                )));
            }
        }
        if !(self.overlap_factor > 0.0 && self.overlap_factor <= 1.0) {
            return Err(ScheduleError::BadCosts(format!(
                "overlap_factor must lie in (0, 1] (got {})",
                self.overlap_factor
            )));
        }
        Ok(())
    }

    /// Cost of moving data across the boundary between `stage` and `stage + 1` when the two
    /// run on different ranks.
    pub fn hop(&self, lower_stage: u32) -> f64 {
        self.p2p_latency + self.hop_transfer[lower_stage as usize]
    }
}
