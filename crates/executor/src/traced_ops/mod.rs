//! A timing layer over a rank's device ([`TracedOps`]): every tensor op the model or the
//! optimizer calls passes through it, and with op profiling on (`RunOptions::profile_ops`)
//! each call of a timed step is keyed by its class ([`OpKey`]: a GEMM's shape, an attention's
//! shape and kernel, a memory-bound op's bytes) and bracketed by two of the device's events.
//! [`TracedComm`](crate::traced_comm::TracedComm) times the collectives through
//! [`TracedOps::timed_collective`] on the same events. Profiling off, a call costs one branch.
//!
//! The timed forwarding of every op is generated from the op lists of `backend::ops` (one
//! `timed_family!` a family), each op keyed by the cost its entry names (`cost.rs`).

mod cost;

use crate::backend::ops::{self, *};
use crate::backend::{Backend, Device, DeviceCollectives, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::op_profile::OpProfile;
use crate::tracker::{Category, MemoryTracker};
use cost::{attention, gemm, mask_of, memory, tb, vb, vmb, Cost};
use parsim_plan::op_timing::{CollectiveKind, OpKey, Pass, Placement};
use parsim_plan::DType;

/// A rank's device with op timing (see the module doc).
pub struct TracedOps<B: Backend> {
    inner: B::Device,
    prof: Option<OpProfile<B::Event>>,
    /// Ranks per node: a group within one node is intra-node (`None`: every rank on one).
    ranks_per_node: Option<u32>,
}

impl<B: Backend> TracedOps<B> {
    /// `inner` timed when `profile` is set.
    pub fn new(inner: B::Device, profile: bool, ranks_per_node: Option<u32>) -> Self {
        TracedOps {
            inner,
            prof: profile.then(OpProfile::default),
            ranks_per_node,
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &B::Device {
        &self.inner
    }

    /// The op profile, when profiling.
    pub fn profile(&self) -> Option<&OpProfile<B::Event>> {
        self.prof.as_ref()
    }

    /// The key `key` makes, only while recording (so that it costs nothing otherwise).
    fn key(&self, key: impl FnOnce() -> OpKey) -> Option<OpKey> {
        self.prof.as_ref().filter(|p| p.active()).map(|_| key())
    }

    /// The key of an op that costs `cost`.
    fn key_of(&self, cost: Cost) -> OpKey {
        match cost {
            Cost::Key(key) => key,
            Cost::Attention(a) => a.key(self.inner.attention_kernel(a.dtype, &a.sh)),
        }
    }

    /// Runs `f` on the device, bracketed by events and recorded under `key` when set. An op
    /// with a zero dimension (an expert with no tokens) does no work and is not recorded: its
    /// time, a call's overhead, falls into the host gap.
    fn run<T>(
        &self,
        key: Option<OpKey>,
        f: impl FnOnce(&B::Device) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        self.run_waited(key, || 0.0, &[], f)
    }

    /// [`Self::run`], with the part of the op's time that `blocked_s` (seconds blocked so far)
    /// grows by recorded as a wait, and a collective's `group` (global ranks; empty for other
    /// ops) kept for the trace ([`OpProfile::push_collective`]).
    fn run_waited<T>(
        &self,
        key: Option<OpKey>,
        blocked_s: impl Fn() -> f64,
        group: &[u32],
        f: impl FnOnce(&B::Device) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let (Some(key), Some(p)) = (key, self.prof.as_ref()) else {
            return f(&self.inner);
        };
        if key.zero_dimension().is_some() {
            return f(&self.inner);
        }
        let blocked_before_s = blocked_s();
        let start = self.inner.record()?;
        let r = f(&self.inner)?;
        let end = self.inner.record()?;
        p.push_collective(
            key,
            start,
            end,
            blocked_s() - blocked_before_s,
            group.to_vec(),
        );
        Ok(r)
    }

    /// Runs the collective `f` (`op` of `bytes` over the global ranks `group`, on `comm`),
    /// timed on the compute stream's events when recording: on a device whose collectives run
    /// on their own stream, the compute stream waits for each, so this is its time as the step
    /// sees it. The part `comm` reports blocked waiting for the other members
    /// ([`DeviceCollectives::blocked_s`]) is recorded as [`OpKey::Wait`], not as the
    /// collective's. A group of one, or nothing moved, is not a collective and is not recorded.
    pub fn timed_collective<T>(
        &self,
        comm: &B::Comm,
        op: CollectiveKind,
        bytes: u64,
        group: &[u32],
        f: impl FnOnce() -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let key = self
            .key(|| OpKey::Collective {
                op,
                bytes,
                group_size: group.len() as u32,
                placement: self.placement(group),
            })
            .filter(|_| group.len() > 1 && bytes > 0);
        self.run_waited(key, || comm.blocked_s(), group, |_| f())
    }

    /// Where `group`'s members sit.
    fn placement(&self, group: &[u32]) -> Placement {
        let node = |r: u32| self.ranks_per_node.map_or(0, |n| r / n.max(1));
        match group.first() {
            Some(&g0) if group.iter().any(|&r| node(r) != node(g0)) => Placement::InterNode,
            _ => Placement::IntraNode,
        }
    }
}

impl<B: Backend> Device<B> for TracedOps<B> {
    fn memory(&self) -> &MemoryTracker {
        self.inner.memory()
    }
    #[track_caller]
    fn alloc(&self, cat: Category, dtype: DType, shape: &[usize]) -> Result<B::Tensor, ExecError> {
        self.inner.alloc(cat, dtype, shape)
    }
    #[track_caller]
    fn upload(
        &self,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<B::Tensor, ExecError> {
        self.inner.upload(cat, dtype, shape, data)
    }
    fn download(&self, t: View<'_, B::Tensor>) -> Result<Vec<f32>, ExecError> {
        self.inner.download(t)
    }
    fn gemm_stats(&self) -> (f64, f64) {
        self.inner.gemm_stats()
    }
    fn recat(&self, t: B::Tensor, cat: Category) -> B::Tensor {
        self.inner.recat(t, cat)
    }
    fn record(&self) -> Result<B::Event, ExecError> {
        self.inner.record()
    }
    fn wait(&self, e: &B::Event) -> Result<(), ExecError> {
        self.inner.wait(e)
    }
    fn elapsed_s(&self, start: &B::Event, end: &B::Event) -> Result<f64, ExecError> {
        self.inner.elapsed_s(start, end)
    }
    fn attention_kernel(&self, dtype: DType, sh: &BlockShape) -> &'static str {
        self.inner.attention_kernel(dtype, sh)
    }
}

/// One family's timed forwarding from its op list (see `backend::ops`): each op recorded as
/// the key its cost names, then run on the wrapped device.
macro_rules! timed_family {
    (
        $(#[$family_doc:meta])*
        $family:ident {
            $(
                $(#[$doc:meta])*
                fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $cost:expr;
            )*
        }
    ) => {
        impl<B: Backend> $family<B> for TracedOps<B> {
            $(
                fn $name(&self, $($arg: $ty),*) -> Result<$ret, ExecError> {
                    let key = self.key(|| self.key_of($cost));
                    self.run(key, |d| d.$name($($arg),*))
                }
            )*
        }
    };
}

ops::activation::activation_ops!(timed_family);
ops::adam::adam_ops!(timed_family);
ops::attention::attention_ops!(timed_family);
ops::bias::bias_ops!(timed_family);
ops::cross_entropy::cross_entropy_ops!(timed_family);
ops::dropout::dropout_ops!(timed_family);
ops::elementwise::elementwise_ops!(timed_family);
ops::embedding::embedding_ops!(timed_family);
ops::flash::flash_ops!(timed_family);
ops::heads::heads_ops!(timed_family);
ops::layout::layout_ops!(timed_family);
ops::linear::linear_ops!(timed_family);
ops::mamba::mamba_ops!(timed_family);
ops::moe::moe_ops!(timed_family);
ops::norm::norm_ops!(timed_family);
ops::rotary::rotary_ops!(timed_family);
ops::ulysses::ulysses_ops!(timed_family);
