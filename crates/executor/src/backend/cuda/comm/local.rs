//! Collectives among ranks that share one GPU (NCCL refuses two ranks of one communicator on
//! one device): every member is a thread of this process, posts its buffers' addresses, and
//! the members move data with device-to-device copies and the element-wise add kernel,
//! separated by barriers. The schedules are written over [`Mover`] so that the host tests
//! run them on host memory and check both the result and that no member writes what another
//! reads in the same phase.

use crate::backend::cuda::diag::error::CudaError;
use std::ops::Range;
use std::sync::Barrier;

/// Where the members of a shared-GPU collective meet between phases: a barrier that can
/// also fail (a member gave up), so that one failing rank never leaves its peers waiting.
pub trait Rendezvous: Sync {
    fn meet(&self) -> Result<(), CudaError>;
}

impl Rendezvous for Barrier {
    fn meet(&self) -> Result<(), CudaError> {
        self.wait();
        Ok(())
    }
}

/// Which posted buffer of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    In,
    Out,
}

/// One member's data movement, on its own stream, reading other members' posted buffers.
pub trait Mover {
    /// own `dst`[dst_off..+len] = member `src`'s `sbuf`[src_off..+len].
    fn copy(
        &self,
        src: usize,
        sbuf: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError>;
    /// own `dst`[dst_off..+len] += member `src`'s `sbuf`[src_off..+len].
    fn add(
        &self,
        src: usize,
        sbuf: Buf,
        src_off: usize,
        dst: Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError>;
    /// Waits until this member's queued copies and adds are done (before a barrier).
    fn sync(&self) -> Result<(), CudaError>;
}

/// Member j's chunk of `len` elements split over `size` members (the first `len % size`
/// chunks one element longer), as NCCL splits a reduce-scatter's buffer.
pub fn chunk(len: usize, size: usize, j: usize) -> Range<usize> {
    let (q, r) = (len / size, len % size);
    let lo = j * q + j.min(r);
    lo..lo + q + usize::from(j < r)
}

/// The phase boundary: this member's work done, then every member's.
fn phase(m: &dyn Mover, barrier: &dyn Rendezvous) -> Result<(), CudaError> {
    m.sync()?;
    barrier.meet()
}

/// Sum all-reduce in place on `Out` (`len` elements): member j reduces chunk j from every
/// member into its own buffer, then copies every other chunk from its owner.
pub fn all_reduce(
    m: &dyn Mover,
    barrier: &dyn Rendezvous,
    me: usize,
    size: usize,
    len: usize,
) -> Result<(), CudaError> {
    phase(m, barrier)?;
    let c = chunk(len, size, me);
    for src in (0..size).filter(|&s| s != me) {
        m.add(src, Buf::Out, c.start, Buf::Out, c.start, c.len())?;
    }
    phase(m, barrier)?;
    for src in (0..size).filter(|&s| s != me) {
        let c = chunk(len, size, src);
        m.copy(src, Buf::Out, c.start, Buf::Out, c.start, c.len())?;
    }
    phase(m, barrier)
}

/// Reduce-scatter: `Out` (len / size elements) = the sum over members of their `In` chunk
/// `me` (`len` divisible by `size`, as the trait's contract requires).
pub fn reduce_scatter(
    m: &dyn Mover,
    barrier: &dyn Rendezvous,
    me: usize,
    size: usize,
    len: usize,
) -> Result<(), CudaError> {
    let per = len / size;
    phase(m, barrier)?;
    m.copy(me, Buf::In, me * per, Buf::Out, 0, per)?;
    for src in (0..size).filter(|&s| s != me) {
        m.add(src, Buf::In, me * per, Buf::Out, 0, per)?;
    }
    phase(m, barrier)
}

/// All-gather: `Out` (`per * size` elements) = every member's `In` (`per` each), in member
/// order.
pub fn all_gather(
    m: &dyn Mover,
    barrier: &dyn Rendezvous,
    size: usize,
    per: usize,
) -> Result<(), CudaError> {
    phase(m, barrier)?;
    for src in 0..size {
        m.copy(src, Buf::In, 0, Buf::Out, src * per, per)?;
    }
    phase(m, barrier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// One access to a member's buffer: (phase, accessing member, owner, buffer, range, write).
    type Access = (usize, usize, usize, Buf, Range<usize>, bool);

    /// Host buffers of every member and a log of every access.
    struct Host {
        bufs: Vec<Mutex<(Vec<f32>, Vec<f32>)>>,
        log: Mutex<Vec<Access>>,
        phases: Vec<Mutex<usize>>,
    }

    struct HostMover {
        h: Arc<Host>,
        me: usize,
    }

    impl HostMover {
        fn read(&self, src: usize, b: Buf, r: Range<usize>) -> Vec<f32> {
            let g = self.h.bufs[src].lock().unwrap();
            let v = if b == Buf::In { &g.0 } else { &g.1 };
            v[r].to_vec()
        }
        fn note(&self, owner: usize, b: Buf, r: Range<usize>, write: bool) {
            let p = *self.h.phases[self.me].lock().unwrap();
            self.h
                .log
                .lock()
                .unwrap()
                .push((p, self.me, owner, b, r, write));
        }
        /// A copy (or an add) of `n` elements from member `src`'s buffer into our own, noted
        /// as a read and a write.
        fn transfer(
            &self,
            (src, sb, so): (usize, Buf, usize),
            (d, o): (Buf, usize),
            n: usize,
            add: bool,
        ) {
            self.note(src, sb, so..so + n, false);
            self.note(self.me, d, o..o + n, true);
            let vals = self.read(src, sb, so..so + n);
            self.apply(d, o, &vals, add);
        }
        fn apply(&self, dst: Buf, off: usize, vals: &[f32], add: bool) {
            let mut g = self.h.bufs[self.me].lock().unwrap();
            let v = if dst == Buf::In { &mut g.0 } else { &mut g.1 };
            for (x, y) in v[off..off + vals.len()].iter_mut().zip(vals) {
                *x = if add { *x + y } else { *y };
            }
        }
    }

    impl Mover for HostMover {
        fn copy(
            &self,
            src: usize,
            sb: Buf,
            so: usize,
            d: Buf,
            o: usize,
            n: usize,
        ) -> Result<(), CudaError> {
            self.transfer((src, sb, so), (d, o), n, false);
            Ok(())
        }
        fn add(
            &self,
            src: usize,
            sb: Buf,
            so: usize,
            d: Buf,
            o: usize,
            n: usize,
        ) -> Result<(), CudaError> {
            self.transfer((src, sb, so), (d, o), n, true);
            Ok(())
        }
        fn sync(&self) -> Result<(), CudaError> {
            *self.h.phases[self.me].lock().unwrap() += 1;
            Ok(())
        }
    }

    /// Runs `f` on `size` threads over host buffers; returns the buffers and the log.
    #[allow(clippy::type_complexity)]
    fn run(
        size: usize,
        init: impl Fn(usize) -> (Vec<f32>, Vec<f32>),
        f: impl Fn(&dyn Mover, &Barrier, usize) -> Result<(), CudaError> + Sync,
    ) -> (Vec<(Vec<f32>, Vec<f32>)>, Vec<Access>) {
        let h = Arc::new(Host {
            bufs: (0..size).map(|j| Mutex::new(init(j))).collect(),
            log: Mutex::new(Vec::new()),
            phases: (0..size).map(|_| Mutex::new(0)).collect(),
        });
        let barrier = Barrier::new(size);
        std::thread::scope(|s| {
            for me in 0..size {
                let (h, barrier, f) = (Arc::clone(&h), &barrier, &f);
                s.spawn(move || f(&HostMover { h, me }, barrier, me).unwrap());
            }
        });
        let h = Arc::into_inner(h).unwrap();
        let bufs = h
            .bufs
            .into_iter()
            .map(|m| m.into_inner().unwrap())
            .collect();
        (bufs, h.log.into_inner().unwrap())
    }

    /// No member writes, in some phase, a range of its buffer that another member reads in
    /// that phase (the barriers are where they must be).
    fn race_free(log: &[Access]) {
        for w in log.iter().filter(|a| a.5) {
            for r in log.iter().filter(|a| !a.5) {
                let overlap = w.4.start < r.4.end && r.4.start < w.4.end;
                assert!(
                    !(w.0 == r.0 && w.2 == r.2 && w.3 == r.3 && w.1 != r.1 && overlap),
                    "member {} writes {:?} {:?} of member {} while member {} reads {:?} in phase {}",
                    w.1, w.3, w.4, w.2, r.1, r.4, w.0
                );
            }
        }
    }

    fn data(j: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + j * 13) % 11) as f32 - 5.0)
            .collect()
    }

    #[test]
    fn chunks_tile_the_buffer() {
        for (len, size) in [(10, 3), (3, 4), (12, 4), (0, 2)] {
            let mut next = 0;
            for j in 0..size {
                let c = chunk(len, size, j);
                assert_eq!(c.start, next);
                assert!(c.len() == len / size || c.len() == len / size + 1);
                next = c.end;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn all_reduce_sums_every_members_buffer_without_races() {
        for (size, len) in [(2, 8), (3, 10), (4, 3)] {
            let (bufs, log) = run(
                size,
                |j| (Vec::new(), data(j, len)),
                |m, b, me| all_reduce(m, b, me, size, len),
            );
            let want: Vec<f32> = (0..len)
                .map(|i| (0..size).map(|j| data(j, len)[i]).sum())
                .collect();
            for (j, b) in bufs.iter().enumerate() {
                assert_eq!(b.1, want, "member {j} of {size}");
            }
            race_free(&log);
        }
    }

    #[test]
    fn reduce_scatter_and_all_gather_match_their_definitions() {
        let (size, per) = (3, 4);
        let len = size * per;
        let (bufs, log) = run(
            size,
            |j| (data(j, len), vec![f32::NAN; per]),
            |m, b, me| reduce_scatter(m, b, me, size, len),
        );
        race_free(&log);
        for (j, b) in bufs.iter().enumerate() {
            let want: Vec<f32> = (j * per..(j + 1) * per)
                .map(|i| (0..size).map(|k| data(k, len)[i]).sum())
                .collect();
            assert_eq!(b.1, want);
        }
        let (bufs, log) = run(
            size,
            |j| (data(j, per), vec![f32::NAN; len]),
            |m, b, _| all_gather(m, b, size, per),
        );
        race_free(&log);
        let want: Vec<f32> = (0..size).flat_map(|j| data(j, per)).collect();
        for b in &bufs {
            assert_eq!(b.1, want);
        }
    }

    #[test]
    fn a_missing_barrier_would_be_caught() {
        // The all-reduce without its middle barrier: members copy chunks their owners are
        // still summing into; the race check must see it.
        let (size, len) = (3, 9);
        let (_, log) = run(
            size,
            |j| (Vec::new(), data(j, len)),
            |m, b, me| {
                phase(m, b)?;
                let c = chunk(len, size, me);
                for src in (0..size).filter(|&s| s != me) {
                    m.add(src, Buf::Out, c.start, Buf::Out, c.start, c.len())?;
                }
                for src in (0..size).filter(|&s| s != me) {
                    let c = chunk(len, size, src);
                    m.copy(src, Buf::Out, c.start, Buf::Out, c.start, c.len())?;
                }
                phase(m, b)
            },
        );
        let caught = std::panic::catch_unwind(|| race_free(&log)).is_err();
        assert!(caught);
    }
}
