//! The host-side schedule of a posted point-to-point exchange (the CP ring's K/V and dK/dV
//! blocks, [`crate::backend::DeviceCollectives::p2p_start`]): which stream runs each piece and
//! which event is waited for where, kept apart from the driver calls so that it is checked
//! without a GPU. Everything runs on the rank's ring stream; the compute stream only records
//! the point the exchange must follow at the post and waits for the exchange's end at the
//! wait, i.e. when the received block is first read (TransformerEngine's
//! `AttnFuncWithCPAndKVP2P` posts step i+1's send/recv before computing step i). Peers on
//! other GPUs go through one grouped NCCL send/recv; peers sharing this GPU (NCCL refuses two
//! ranks on one device) through the process's hub, with the device copies on the ring stream
//! as well, so the same overlap holds on a shared GPU.

use crate::backend::cuda::comm::groups::Transport;

/// A stream of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Compute,
    Ring,
}

/// One host-side step of posting or completing an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Record the event `ready` on the compute stream: the sends' data and the receive
    /// buffers are written by work queued there.
    RecordReady,
    /// The ring stream waits for `ready`.
    RingWaitsReady,
    /// One grouped NCCL call on the ring stream: these sends and receives (indices into the
    /// exchange's lists) with peers on other GPUs.
    NcclGroup {
        sends: Vec<usize>,
        recvs: Vec<usize>,
    },
    /// A send to a peer on this GPU: a staged device copy on the ring stream, the ring stream
    /// synchronised (the peer reads it from another thread), left in the hub's mailbox.
    HubPut { send: usize },
    /// A receive from a peer on this GPU: its message taken from the hub (the host waits
    /// for the peer's post) and copied into the buffer on the ring stream.
    HubTake { recv: usize },
    /// Record the event `done` on the ring stream; the send sources and receive buffers (and
    /// taken messages) go back to their pools only after it.
    RecordDone,
    /// The compute stream waits for `done`.
    ComputeWaitsDone,
}

impl Step {
    /// The stream a step enqueues work on or waits on (`None`: host-only).
    pub fn stream(&self) -> Option<On> {
        match self {
            Step::RecordReady | Step::ComputeWaitsDone => Some(On::Compute),
            Step::RingWaitsReady
            | Step::NcclGroup { .. }
            | Step::HubPut { .. }
            | Step::HubTake { .. }
            | Step::RecordDone => Some(On::Ring),
        }
    }
}

/// The steps of posting an exchange whose sends and receives have peers reached over
/// `sends` and `recvs` (one transport each). Receives from peers on this GPU are left to
/// [`wait_steps`]: their messages come from the peers' posts of the same ring step.
pub fn post_steps(sends: &[Transport], recvs: &[Transport]) -> Vec<Step> {
    let nccl = |ts: &[Transport]| -> Vec<usize> {
        (0..ts.len())
            .filter(|&i| ts[i] == Transport::Nccl)
            .collect()
    };
    let (ns, nr) = (nccl(sends), nccl(recvs));
    let puts: Vec<Step> = (0..sends.len())
        .filter(|&i| sends[i] != Transport::Nccl)
        .map(|send| Step::HubPut { send })
        .collect();
    if ns.is_empty() && nr.is_empty() && puts.is_empty() {
        return Vec::new();
    }
    let mut out = vec![Step::RecordReady, Step::RingWaitsReady];
    out.extend(puts);
    if !ns.is_empty() || !nr.is_empty() {
        out.push(Step::NcclGroup {
            sends: ns,
            recvs: nr,
        });
        out.push(Step::RecordDone);
    }
    out
}

/// The steps of completing an exchange posted by [`post_steps`] with receives over `recvs`;
/// `posted_done` says whether the post recorded `done` (an NCCL group).
pub fn wait_steps(recvs: &[Transport], posted_done: bool) -> Vec<Step> {
    let takes: Vec<Step> = (0..recvs.len())
        .filter(|&i| recvs[i] != Transport::Nccl)
        .map(|recv| Step::HubTake { recv })
        .collect();
    let mut out = Vec::new();
    if !takes.is_empty() {
        out.extend(takes);
        out.push(Step::RecordDone);
    }
    if posted_done || !out.is_empty() {
        out.push(Step::ComputeWaitsDone);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Transport::{Local, Nccl};

    fn on_compute(steps: &[Step]) -> Vec<&Step> {
        steps
            .iter()
            .filter(|s| s.stream() == Some(On::Compute))
            .collect()
    }

    /// A ring step across GPUs: one NCCL group on the ring stream after the compute stream's
    /// point, and the compute stream never waits at the post (so it goes on to the block's
    /// attention); at the wait it waits for the group's event and does nothing else.
    #[test]
    fn an_nccl_ring_step_leaves_the_compute_stream_free_until_the_wait() {
        let post = post_steps(&[Nccl, Nccl], &[Nccl, Nccl]);
        assert_eq!(
            post,
            vec![
                Step::RecordReady,
                Step::RingWaitsReady,
                Step::NcclGroup {
                    sends: vec![0, 1],
                    recvs: vec![0, 1]
                },
                Step::RecordDone,
            ]
        );
        assert_eq!(on_compute(&post), vec![&Step::RecordReady]);
        let wait = wait_steps(&[Nccl, Nccl], true);
        assert_eq!(wait, vec![Step::ComputeWaitsDone]);
    }

    /// Ranks sharing a GPU: the copies (put at the post, take at the wait) run on the ring
    /// stream, never on the compute stream, which only records `ready` and waits for `done`
    /// recorded after the last copy.
    #[test]
    fn shared_gpu_copies_run_on_the_ring_stream() {
        let post = post_steps(&[Local, Local], &[Local, Local]);
        assert_eq!(
            post,
            vec![
                Step::RecordReady,
                Step::RingWaitsReady,
                Step::HubPut { send: 0 },
                Step::HubPut { send: 1 },
            ]
        );
        let wait = wait_steps(&[Local, Local], false);
        assert_eq!(
            wait,
            vec![
                Step::HubTake { recv: 0 },
                Step::HubTake { recv: 1 },
                Step::RecordDone,
                Step::ComputeWaitsDone,
            ]
        );
        for s in post.iter().chain(&wait) {
            if matches!(s, Step::HubPut { .. } | Step::HubTake { .. }) {
                assert_eq!(s.stream(), Some(On::Ring), "{s:?}");
            }
        }
        assert_eq!(on_compute(&wait), vec![&Step::ComputeWaitsDone]);
        // The copies follow the compute stream's point (ready) and precede its wait (done).
        let last_copy = wait
            .iter()
            .rposition(|s| matches!(s, Step::HubTake { .. }))
            .unwrap();
        assert!(last_copy < wait.iter().position(|s| *s == Step::RecordDone).unwrap());
    }

    /// A mixed exchange (send over NCCL, receive from a GPU neighbour) and the edge cases:
    /// a send-only NCCL exchange still orders the compute stream after it at the wait (its
    /// source buffer is fenced by `done` too); an empty exchange schedules nothing.
    #[test]
    fn mixed_send_only_and_empty_exchanges() {
        let post = post_steps(&[Nccl], &[Local]);
        assert_eq!(
            post[2],
            Step::NcclGroup {
                sends: vec![0],
                recvs: vec![]
            }
        );
        assert_eq!(
            wait_steps(&[Local], true),
            vec![
                Step::HubTake { recv: 0 },
                Step::RecordDone,
                Step::ComputeWaitsDone
            ]
        );
        assert_eq!(wait_steps(&[], true), vec![Step::ComputeWaitsDone]);
        assert!(post_steps(&[], &[]).is_empty());
        assert!(wait_steps(&[], false).is_empty());
        // Only puts: no event is recorded at the post (the ring stream was synchronised).
        assert!(!post_steps(&[Local], &[]).contains(&Step::RecordDone));
    }
}
