//! Collectives over shared memory between the rank threads, with NCCL's semantics within a
//! group (members listed in ascending global rank; a member's index in that list is its
//! position in gathers and scatters).
//!
//! Every collective is one exchange: each member deposits its contribution in the group's slot
//! table, waits at the group barrier, reads every contribution, and waits again before the
//! slots can be reused. **Reduction order**: element-wise, `((x_0 + x_1) + x_2) + ...` in
//! member order, the same on every member, so replicated results are bit-identical across
//! ranks and independent of thread timing. Point-to-point messages are buffered (a send never
//! blocks) and matched by (source, tag).

use crate::backend::collectives::ReduceOp;
use crate::backend::types::ProcessGroup;
use crate::error::{CollectiveError, ExecError};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Collectives with NCCL's semantics within a group, plus point-to-point messages, and the
/// flat-range variants that ZeRO uses on the parameter and gradient buffers (Megatron's
/// distributed optimizer shards one flat buffer into contiguous ranges).
pub trait Collectives {
    type Group;
    /// In place; every member ends with the same reduction.
    fn all_reduce(&self, g: &Self::Group, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError>;
    /// `out` = concatenation of every member's `input` in member order.
    fn all_gather(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// `out` = this member's slice of the element-wise sum of every member's `input`.
    fn reduce_scatter(
        &self,
        g: &Self::Group,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Member i's j-th slice goes to member j's i-th slice.
    fn all_to_all(&self, g: &Self::Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError>;
    /// Variable-size all-to-all (as NCCL users build it from grouped send/recv, with the counts
    /// exchanged first): member i's `input` is `send_counts[j]` elements for each member j in
    /// member order; `out` receives, in member order, what each member j sent to i, and
    /// `recv_counts[j]` must equal member j's `send_counts[i]` (exchange the counts with
    /// [`Collectives::all_to_all`] beforehand).
    fn all_to_all_v(
        &self,
        g: &Self::Group,
        input: &[f32],
        send_counts: &[usize],
        out: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), ExecError>;
    /// Member `root`'s buffer to every member.
    fn broadcast(&self, g: &Self::Group, buf: &mut [f32], root: usize) -> Result<(), ExecError>;
    /// Buffered: returns at once.
    fn send(&self, to: u32, tag: u64, data: &[f32]) -> Result<(), ExecError>;
    /// Blocks until the message (from, tag) arrives.
    fn recv(&self, from: u32, tag: u64, out: &mut [f32]) -> Result<(), ExecError>;
    /// All-gather of a flat buffer held in contiguous shards (`mine` starts at `mine_lo`):
    /// `out` receives the elements `want` of the whole buffer.
    fn gather_range(
        &self,
        g: &Self::Group,
        mine_lo: usize,
        mine: &[f32],
        want: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
    /// Reduce-scatter of a flat range (every member passes the same `input_lo` and length):
    /// the sum over members of the part of `input` inside `mine` is *added* to `out`.
    fn reduce_scatter_range(
        &self,
        g: &Self::Group,
        input_lo: usize,
        input: &[f32],
        mine: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError>;
}

/// How long a rank waits before declaring a deadlock.
const TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(50);

type Contribution = (usize, Arc<Vec<f32>>);

struct BarrierState {
    arrived: usize,
    generation: u64,
}

/// The shared state of one process group.
pub struct GroupState {
    members: Vec<u32>,
    slots: Mutex<Vec<Option<Contribution>>>,
    barrier: Mutex<BarrierState>,
    cv: Condvar,
}

/// A handle on a group for one member.
#[derive(Clone)]
pub struct Group {
    state: Arc<GroupState>,
    /// This member's index in `members`.
    pub index: usize,
}

impl Group {
    pub fn size(&self) -> usize {
        self.state.members.len()
    }

    pub fn members(&self) -> &[u32] {
        &self.state.members
    }
}

impl ProcessGroup for Group {
    fn size(&self) -> usize {
        Group::size(self)
    }
    fn index(&self) -> usize {
        self.index
    }
    fn members(&self) -> &[u32] {
        Group::members(self)
    }
}

struct Msg {
    from: u32,
    tag: u64,
    data: Vec<f32>,
}

struct Mailbox {
    queue: Mutex<Vec<Msg>>,
    cv: Condvar,
}

/// Shared by all rank threads of one run.
pub struct World {
    groups: Mutex<HashMap<Vec<u32>, Arc<GroupState>>>,
    mailboxes: Vec<Mailbox>,
    abort: AtomicBool,
}

impl World {
    pub fn new(size: usize) -> Arc<World> {
        Arc::new(World {
            groups: Mutex::new(HashMap::new()),
            mailboxes: (0..size)
                .map(|_| Mailbox {
                    queue: Mutex::new(Vec::new()),
                    cv: Condvar::new(),
                })
                .collect(),
            abort: AtomicBool::new(false),
        })
    }

    /// Tells every waiting rank to give up (a rank failed).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        for m in &self.mailboxes {
            m.cv.notify_all();
        }
        for g in self
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            g.cv.notify_all();
        }
    }
}

/// One rank's endpoint.
pub struct CpuComm {
    pub rank: u32,
    world: Arc<World>,
    /// Seconds blocked at barriers and empty mailboxes so far (an f64's bits; only this
    /// rank's thread writes it).
    blocked: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CpuComm {
    pub fn new(rank: u32, world: Arc<World>) -> CpuComm {
        CpuComm {
            rank,
            world,
            blocked: AtomicU64::new(0),
        }
    }

    /// The group with these members (ascending; must contain this rank).
    pub fn group(&self, members: &[u32]) -> Group {
        let mut m = members.to_vec();
        m.sort_unstable();
        let index = m
            .iter()
            .position(|&r| r == self.rank)
            .expect("rank is a member of its group");
        let state = lock(&self.world.groups)
            .entry(m.clone())
            .or_insert_with(|| {
                Arc::new(GroupState {
                    slots: Mutex::new(vec![None; m.len()]),
                    members: m,
                    barrier: Mutex::new(BarrierState {
                        arrived: 0,
                        generation: 0,
                    }),
                    cv: Condvar::new(),
                })
            })
            .clone();
        Group { state, index }
    }

    /// Seconds this rank has spent blocked waiting for its peers so far.
    pub fn blocked_s(&self) -> f64 {
        f64::from_bits(self.blocked.load(Ordering::Relaxed))
    }

    fn add_blocked(&self, since: Instant) {
        let s = self.blocked_s() + since.elapsed().as_secs_f64();
        self.blocked.store(s.to_bits(), Ordering::Relaxed);
    }

    fn check_abort(&self) -> Result<(), ExecError> {
        if self.world.abort.load(Ordering::SeqCst) {
            Err(ExecError::Aborted { rank: self.rank })
        } else {
            Ok(())
        }
    }

    fn barrier(&self, g: &GroupState) -> Result<(), ExecError> {
        let mut st = lock(&g.barrier);
        let gen = st.generation;
        st.arrived += 1;
        if st.arrived == g.members.len() {
            st.arrived = 0;
            st.generation += 1;
            g.cv.notify_all();
            return Ok(());
        }
        let start = Instant::now();
        while st.generation == gen {
            self.check_abort()?;
            if start.elapsed() > TIMEOUT {
                return Err(ExecError::Timeout {
                    rank: self.rank,
                    seconds: TIMEOUT.as_secs(),
                });
            }
            st =
                g.cv.wait_timeout(st, POLL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
        }
        self.add_blocked(start);
        Ok(())
    }

    /// Deposits `(lo, data)`, returns every member's contribution in member order.
    fn exchange(
        &self,
        g: &Group,
        lo: usize,
        data: Vec<f32>,
    ) -> Result<Vec<Contribution>, ExecError> {
        let st = &g.state;
        lock(&st.slots)[g.index] = Some((lo, Arc::new(data)));
        self.barrier(st)?;
        let all: Vec<Contribution> = lock(&st.slots)
            .iter()
            .map(|s| s.clone().expect("every member deposited"))
            .collect();
        self.barrier(st)?;
        Ok(all)
    }
}

fn reduce_into(out: &mut [f32], parts: &[&[f32]], op: ReduceOp) {
    out.copy_from_slice(parts[0]);
    for p in &parts[1..] {
        match op {
            ReduceOp::Sum => out.iter_mut().zip(p.iter()).for_each(|(o, x)| *o += x),
            ReduceOp::Max => out
                .iter_mut()
                .zip(p.iter())
                .for_each(|(o, x)| *o = o.max(*x)),
        }
    }
}

impl Collectives for CpuComm {
    type Group = Group;

    fn all_reduce(&self, g: &Group, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError> {
        if g.size() == 1 {
            return Ok(());
        }
        let all = self.exchange(g, 0, buf.to_vec())?;
        let parts: Vec<&[f32]> = all.iter().map(|(_, d)| d.as_slice()).collect();
        reduce_into(buf, &parts, op);
        Ok(())
    }

    fn all_gather(&self, g: &Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError> {
        assert_eq!(out.len(), input.len() * g.size(), "all-gather output size");
        if g.size() == 1 {
            out.copy_from_slice(input);
            return Ok(());
        }
        let all = self.exchange(g, 0, input.to_vec())?;
        for (chunk, (_, d)) in out.chunks_exact_mut(input.len()).zip(&all) {
            chunk.copy_from_slice(d);
        }
        Ok(())
    }

    fn reduce_scatter(&self, g: &Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError> {
        assert_eq!(
            input.len(),
            out.len() * g.size(),
            "reduce-scatter input size"
        );
        if g.size() == 1 {
            out.copy_from_slice(input);
            return Ok(());
        }
        let all = self.exchange(g, 0, input.to_vec())?;
        let n = out.len();
        let lo = g.index * n;
        let parts: Vec<&[f32]> = all.iter().map(|(_, d)| &d[lo..lo + n]).collect();
        reduce_into(out, &parts, ReduceOp::Sum);
        Ok(())
    }

    fn all_to_all(&self, g: &Group, input: &[f32], out: &mut [f32]) -> Result<(), ExecError> {
        assert_eq!(input.len(), out.len(), "all-to-all sizes");
        let n = input.len() / g.size();
        if g.size() == 1 {
            out.copy_from_slice(input);
            return Ok(());
        }
        let all = self.exchange(g, 0, input.to_vec())?;
        let lo = g.index * n;
        for (chunk, (_, d)) in out.chunks_exact_mut(n).zip(&all) {
            chunk.copy_from_slice(&d[lo..lo + n]);
        }
        Ok(())
    }

    fn all_to_all_v(
        &self,
        g: &Group,
        input: &[f32],
        send_counts: &[usize],
        out: &mut [f32],
        recv_counts: &[usize],
    ) -> Result<(), ExecError> {
        let size = g.size();
        let bad = |reason| {
            Err(ExecError::Collective {
                op: "all_to_all_v",
                reason,
            })
        };
        if send_counts.len() != size || recv_counts.len() != size {
            return bad(CollectiveError::CountCount {
                expected: size,
                send: send_counts.len(),
                recv: recv_counts.len(),
            });
        }
        if send_counts.iter().sum::<usize>() != input.len()
            || recv_counts.iter().sum::<usize>() != out.len()
        {
            return bad(CollectiveError::CountSums);
        }
        // The send counts travel with the data (bit patterns of u32 halves, exact), so every
        // member finds its slice in every contribution.
        let mut dep = Vec::with_capacity(2 * size + input.len());
        for &c in send_counts {
            dep.push(f32::from_bits(c as u32));
            dep.push(f32::from_bits((c as u64 >> 32) as u32));
        }
        dep.extend_from_slice(input);
        let all = if size == 1 {
            vec![(0, Arc::new(dep))]
        } else {
            self.exchange(g, 0, dep)?
        };
        let mut at = 0;
        for (j, (_, d)) in all.iter().enumerate() {
            let count =
                |k: usize| d[2 * k].to_bits() as usize | ((d[2 * k + 1].to_bits() as usize) << 32);
            let lo = 2 * size + (0..g.index).map(count).sum::<usize>();
            let n = count(g.index);
            if n != recv_counts[j] {
                return bad(CollectiveError::CountMismatch {
                    member: j,
                    sent: n,
                    expected: recv_counts[j],
                });
            }
            out[at..at + n].copy_from_slice(&d[lo..lo + n]);
            at += n;
        }
        Ok(())
    }

    fn broadcast(&self, g: &Group, buf: &mut [f32], root: usize) -> Result<(), ExecError> {
        if g.size() == 1 {
            return Ok(());
        }
        let mine = if g.index == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let all = self.exchange(g, 0, mine)?;
        buf.copy_from_slice(&all[root].1);
        Ok(())
    }

    fn send(&self, to: u32, tag: u64, data: &[f32]) -> Result<(), ExecError> {
        let mb = &self.world.mailboxes[to as usize];
        lock(&mb.queue).push(Msg {
            from: self.rank,
            tag,
            data: data.to_vec(),
        });
        mb.cv.notify_all();
        Ok(())
    }

    fn recv(&self, from: u32, tag: u64, out: &mut [f32]) -> Result<(), ExecError> {
        let mb = &self.world.mailboxes[self.rank as usize];
        let mut q = lock(&mb.queue);
        let start = Instant::now();
        let mut waited = false;
        loop {
            if let Some(i) = q.iter().position(|m| m.from == from && m.tag == tag) {
                if waited {
                    self.add_blocked(start);
                }
                let m = q.swap_remove(i);
                assert_eq!(m.data.len(), out.len(), "recv size from rank {from}");
                out.copy_from_slice(&m.data);
                return Ok(());
            }
            self.check_abort()?;
            if start.elapsed() > TIMEOUT {
                return Err(ExecError::Timeout {
                    rank: self.rank,
                    seconds: TIMEOUT.as_secs(),
                });
            }
            waited = true;
            q = mb
                .cv
                .wait_timeout(q, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn gather_range(
        &self,
        g: &Group,
        mine_lo: usize,
        mine: &[f32],
        want: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        assert_eq!(out.len(), want.len());
        let all = if g.size() == 1 {
            vec![(mine_lo, Arc::new(mine.to_vec()))]
        } else {
            // Contribute only the overlap with what any member may want: simplest is the shard.
            self.exchange(g, mine_lo, mine.to_vec())?
        };
        for (lo, d) in &all {
            let a = want.start.max(*lo);
            let b = want.end.min(lo + d.len());
            if a < b {
                out[a - want.start..b - want.start].copy_from_slice(&d[a - lo..b - lo]);
            }
        }
        Ok(())
    }

    fn reduce_scatter_range(
        &self,
        g: &Group,
        input_lo: usize,
        input: &[f32],
        mine: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        assert_eq!(out.len(), mine.len());
        let all = if g.size() == 1 {
            vec![(input_lo, Arc::new(input.to_vec()))]
        } else {
            self.exchange(g, input_lo, input.to_vec())?
        };
        let a = mine.start.max(input_lo);
        let b = mine.end.min(input_lo + input.len());
        if a >= b {
            return Ok(());
        }
        // Sum in member order, then add to what the shard holds (gradient accumulation).
        let mut acc = vec![0.0f32; b - a];
        let parts: Vec<&[f32]> = all.iter().map(|(lo, d)| &d[a - lo..b - lo]).collect();
        reduce_into(&mut acc, &parts, ReduceOp::Sum);
        for (o, x) in out[a - mine.start..b - mine.start].iter_mut().zip(acc) {
            *o += x;
        }
        Ok(())
    }
}
