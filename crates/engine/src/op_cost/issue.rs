//! The host and the device as a two-resource pipeline. The host issues every kernel in order
//! (its framework's CPU time plus the launch), and the device runs a kernel only once it has
//! been issued and the one before it has ended:
//!
//! ```text
//! host_end(i) = host_end(i-1) + host_s(i)
//! dev_end(i)  = max(dev_end(i-1), host_end(i)) + device_s(i)
//! ```
//!
//! so the device waits wherever the host has fallen behind it. Where kernels are long the host
//! runs ahead and issue costs nothing; where they are short (small hidden sizes, TP 8, micro
//! batch 1) the step is the host's. The time model keeps the device's time as it prices it
//! and adds the device's idle time ([`IssueQueue::device_idle_s`]).

/// One call as the host issues it and the device runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Issued {
    /// The host's time to issue the call (framework CPU time and launch).
    pub host_s: f64,
    /// The call's time on the device.
    pub device_s: f64,
    /// The host waits for the device to finish everything issued before it, then issues the
    /// call: a device-to-host read the host needs to go on (a `.tolist()` or `.item()` of a
    /// device tensor), so nothing the host issued earlier is still queued to hide its issue.
    pub host_waits: bool,
}

/// Where the host and the device have got to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IssueQueue {
    /// When the host has issued everything so far.
    pub host_end_s: f64,
    /// When the device has run everything so far.
    pub dev_end_s: f64,
    /// How long the device has waited on the host so far.
    pub device_idle_s: f64,
}

impl IssueQueue {
    /// Issues and runs `calls` in order; returns the device's idle time over them. With every
    /// host cost 0 the device never waits (exactly 0); with every device time 0 it waits for
    /// each issue in turn (the sum of the host costs).
    pub fn run(&mut self, calls: &[Issued]) -> f64 {
        let before = self.device_idle_s;
        for c in calls {
            if c.host_waits {
                self.host_end_s = self.host_end_s.max(self.dev_end_s);
            }
            self.host_end_s += c.host_s;
            let idle = (self.host_end_s - self.dev_end_s).max(0.0);
            self.device_idle_s += idle;
            self.dev_end_s += idle + c.device_s;
        }
        self.device_idle_s - before
    }
}

/// The device's idle time over one of many back-to-back repetitions of `calls` (a block of a
/// layer stack, one microbatch after another, the host never blocked in between): the idle
/// time of the second repetition, after the first has set how far the host is ahead. It is
/// max(0, host - device) of the calls' sums up to the first repetition's fill, 0 when no host
/// cost is set.
pub fn steady_idle_s(calls: &[Issued]) -> f64 {
    let mut q = IssueQueue::default();
    q.run(calls);
    q.run(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(host_s: f64, device_s: f64) -> Issued {
        Issued {
            host_s,
            device_s,
            host_waits: false,
        }
    }

    /// By hand: A (host 3, device 1) then B (host 1, device 5). The host issues A by 3; the
    /// device runs it 3..4 (idle 3). B is issued by 4; the device runs it 4..9 (no wait). So
    /// the two ops take 9 = 6 of device time + 3 of waiting. A second pass: A issued by 7 but
    /// the device is busy until 9, runs 9..10; B issued by 8, runs 10..15: no wait, the
    /// period is the device's 6 = max(host 4, device 6).
    #[test]
    fn two_ops_by_hand() {
        let calls = [call(3.0, 1.0), call(1.0, 5.0)];
        let mut q = IssueQueue::default();
        assert_eq!(q.run(&calls), 3.0);
        assert_eq!((q.host_end_s, q.dev_end_s), (4.0, 9.0));
        assert_eq!(q.run(&calls), 0.0);
        assert_eq!(q.dev_end_s, 15.0);
        assert_eq!(steady_idle_s(&calls), 0.0);
        // Host-bound the other way round: each period waits host - device = 8 - 6 = 2.
        let slow = [call(7.0, 1.0), call(1.0, 5.0)];
        assert_eq!(steady_idle_s(&slow), 2.0);
    }

    /// A host wait, by hand: A (host 1, device 5), a sync S (host 0.5, the read's round trip),
    /// B (host 2, device 1). Without the wait the host runs ahead: A issued by 1 runs 1..6, S by
    /// 1.5, B by 3.5 runs 6..7; after the first repetition the host stays ahead (3.5 of host a
    /// repetition against 6 of device), so no wait. With it the host waits for A to end at 6,
    /// reads by 6.5 (the device idles 0.5), issues B by 8.5 (idle 2 more), B runs 8.5..9.5: in
    /// the steady state each repetition waits S + B = 2.5, what the host does after the sync.
    #[test]
    fn a_host_wait_drains_the_queue() {
        let sync = |host_waits| Issued {
            host_s: 0.5,
            device_s: 0.0,
            host_waits,
        };
        let run = |host_waits| [call(1.0, 5.0), sync(host_waits), call(2.0, 1.0)];
        assert_eq!(steady_idle_s(&run(false)), 0.0);
        let mut q = IssueQueue::default();
        assert_eq!(q.run(&run(true)), 1.0 + 0.5 + 2.0);
        assert_eq!((q.host_end_s, q.dev_end_s), (8.5, 9.5));
        assert_eq!(steady_idle_s(&run(true)), 2.5);
    }

    /// Host cost 0: the device never waits, exactly (today's time unchanged).
    #[test]
    fn no_host_cost_is_no_wait() {
        let calls: Vec<Issued> = (1..20).map(|i| call(0.0, 1e-6 * i as f64)).collect();
        let mut q = IssueQueue::default();
        assert_eq!(q.run(&calls), 0.0);
        assert_eq!(steady_idle_s(&calls), 0.0);
    }

    /// Device time 0: the step is the host's issue, the sum of the host costs.
    #[test]
    fn no_device_time_is_the_sum_of_host_costs() {
        let calls: Vec<Issued> = (1..20).map(|i| call(1e-6 * i as f64, 0.0)).collect();
        let host: f64 = calls.iter().map(|c| c.host_s).sum();
        let mut q = IssueQueue::default();
        assert!((q.run(&calls) - host).abs() < 1e-18);
        assert!((steady_idle_s(&calls) - host).abs() < 1e-18);
    }

    /// Many repetitions: the period settles at max(host, device) of the sums (the rate of the
    /// slower resource), whatever the order of the calls inside it.
    #[test]
    fn the_period_is_the_slower_resource() {
        let calls = [call(2.0, 0.5), call(0.5, 4.0), call(3.0, 0.5)];
        let (h, d) = (5.5, 5.0);
        let mut q = IssueQueue::default();
        for _ in 0..10 {
            q.run(&calls);
        }
        let before = q.dev_end_s;
        q.run(&calls);
        assert!((q.dev_end_s - before - f64::max(h, d)).abs() < 1e-12);
    }
}
