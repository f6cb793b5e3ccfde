//! Where the rank threads of one process meet for the shared-GPU collectives: per process
//! group, a round in which every member posts its buffers' addresses and host metadata, waits
//! for the others, reads every post, and waits again before its buffers may change; and a
//! mailbox for point-to-point messages. Every wait gives up, with an error, when a rank of
//! the run failed (`abort`) or after the deadline, so a failing rank never hangs its peers.

use crate::backend::cuda::comm::local::Rendezvous;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::Library;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a rank waits for its peers at one meeting before giving up.
pub const MEET_TIMEOUT: Duration = Duration::from_secs(300);

/// What one member posts for a round.
#[derive(Debug, Clone, Default)]
pub struct Posted {
    /// Host values (ranges, counts).
    pub meta: Vec<u64>,
    /// Device buffers: (input, output) base addresses.
    pub addr: (u64, u64),
    /// Pieces it offers: (receiving member, address, elements).
    pub sends: Vec<(usize, u64, usize)>,
}

/// A barrier that fails when the run aborts or the deadline passes.
pub struct Meeting {
    size: usize,
    state: Mutex<(usize, u64)>,
    cv: Condvar,
    abort: Arc<AtomicBool>,
}

fn gave_up(why: &str) -> CudaError {
    CudaError::call(Library::Driver, "shared-GPU collective", why)
}

impl Meeting {
    fn new(size: usize, abort: Arc<AtomicBool>) -> Meeting {
        Meeting {
            size,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
            abort,
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, (usize, u64)>, CudaError> {
        self.state.lock().map_err(|_| gave_up("a rank panicked"))
    }
}

impl Rendezvous for Meeting {
    fn meet(&self) -> Result<(), CudaError> {
        let mut g = self.lock()?;
        let generation = g.1;
        g.0 += 1;
        if g.0 == self.size {
            *g = (0, generation + 1);
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + MEET_TIMEOUT;
        while g.1 == generation {
            if self.abort.load(Ordering::SeqCst) {
                return Err(gave_up("another rank failed"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(gave_up("peers did not arrive within 300 s"));
            }
            g = self
                .cv
                .wait_timeout(g, left.min(Duration::from_millis(100)))
                .map_err(|_| gave_up("a rank panicked"))?
                .0;
        }
        Ok(())
    }
}

/// One group's meeting point and posts.
pub struct Round {
    pub meeting: Meeting,
    posts: Mutex<Vec<Posted>>,
}

/// The process's meeting points, by group members, and its mailbox.
#[derive(Default)]
pub struct Hub {
    rounds: Mutex<HashMap<Vec<u32>, Arc<Round>>>,
    mailbox: Mutex<HashMap<(u32, u32, u64), CudaTensor>>,
    posted: Condvar,
    abort: Arc<AtomicBool>,
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// Stops every wait (a rank failed).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.posted.notify_all();
        if let Ok(rs) = self.rounds.lock() {
            for r in rs.values() {
                r.meeting.cv.notify_all();
            }
        }
    }

    /// The round of the group `members`.
    pub fn round(&self, members: &[u32]) -> Result<Arc<Round>, CudaError> {
        let mut rs = self.rounds.lock().map_err(|_| gave_up("a rank panicked"))?;
        Ok(rs
            .entry(members.to_vec())
            .or_insert_with(|| {
                Arc::new(Round {
                    meeting: Meeting::new(members.len(), self.abort.clone()),
                    posts: Mutex::new(vec![Posted::default(); members.len()]),
                })
            })
            .clone())
    }

    /// Posts `p` as member `index` of `members`, meets, runs `f` on every member's post, and
    /// meets again (always, so that an error in `f` does not strand the others).
    pub fn exchange<R>(
        &self,
        members: &[u32],
        index: usize,
        p: Posted,
        f: impl FnOnce(&[Posted], &Meeting) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let round = self.round(members)?;
        round.posts.lock().map_err(|_| gave_up("a rank panicked"))?[index] = p;
        round.meeting.meet()?;
        let all = round
            .posts
            .lock()
            .map_err(|_| gave_up("a rank panicked"))?
            .clone();
        let r = f(&all, &round.meeting);
        round.meeting.meet()?;
        r
    }

    /// Leaves a message (a device copy owned by the sender's pool).
    pub fn put(&self, from: u32, to: u32, tag: u64, t: CudaTensor) -> Result<(), CudaError> {
        self.mailbox
            .lock()
            .map_err(|_| gave_up("a rank panicked"))?
            .insert((from, to, tag), t);
        self.posted.notify_all();
        Ok(())
    }

    /// Waits for the message (from, to, tag).
    pub fn take(&self, from: u32, to: u32, tag: u64) -> Result<CudaTensor, CudaError> {
        let deadline = Instant::now() + MEET_TIMEOUT;
        let mut mb = self
            .mailbox
            .lock()
            .map_err(|_| gave_up("a rank panicked"))?;
        loop {
            if let Some(t) = mb.remove(&(from, to, tag)) {
                return Ok(t);
            }
            if self.abort.load(Ordering::SeqCst) {
                return Err(gave_up("another rank failed"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(gave_up(&format!(
                    "no message from rank {from} (tag {tag}) within 300 s"
                )));
            }
            mb = self
                .posted
                .wait_timeout(mb, left.min(Duration::from_millis(100)))
                .map_err(|_| gave_up("a rank panicked"))?
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_reads_every_post() {
        let hub = Hub::new();
        let members = [3u32, 5, 9];
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|i| {
                    let hub = &hub;
                    s.spawn(move || {
                        let p = Posted {
                            meta: vec![i as u64 * 10],
                            ..Posted::default()
                        };
                        hub.exchange(&members, i, p, |all, _| {
                            Ok(all.iter().map(|p| p.meta[0]).collect::<Vec<u64>>())
                        })
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            assert_eq!(g, vec![0, 10, 20]);
        }
    }

    #[test]
    fn an_abort_releases_a_waiting_member_with_an_error() {
        let hub = Hub::new();
        std::thread::scope(|s| {
            let h = s.spawn(|| hub.exchange(&[0, 1], 0, Posted::default(), |_, _| Ok(())));
            std::thread::sleep(Duration::from_millis(50));
            hub.abort();
            let e = h.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("another rank failed"), "{e}");
        });
        let e = hub.take(1, 0, 7).err().unwrap().to_string();
        assert!(e.contains("another rank failed"), "{e}");
    }
}
