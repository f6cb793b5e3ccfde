//! The CPU backend's cost of one synchronisation between two rank threads, apart from any data
//! and any work: back-to-back all-reduces of one element on two threads, each an exchange
//! between two barriers whose waiting member sleeps on a condvar and must be woken. That time
//! is spent blocked (the `wait` op class), which the rate tables, fitted to the collectives'
//! own time, never see: a fixed cost per synchronising call, measured here on the host as it
//! is now (a loaded host wakes a sleeping thread late).

use super::collectives::{Collectives, CpuComm, World};
use crate::backend::ReduceOp;
use crate::error::ExecError;
use std::time::Instant;

/// Seconds per call of `calls` one-element all-reduces between two rank threads (the slower
/// thread's mean), after one untimed call that creates the group.
pub fn rendezvous_s(calls: usize) -> Result<f64, ExecError> {
    let world = World::new(2);
    let rank = |rank: u32| {
        let world = world.clone();
        move || -> Result<f64, ExecError> {
            let comm = CpuComm::new(rank, world);
            let g = comm.group(&[0, 1]);
            let mut buf = [1.0f32];
            comm.all_reduce(&g, &mut buf, ReduceOp::Sum)?;
            let t = Instant::now();
            for _ in 0..calls {
                comm.all_reduce(&g, &mut buf, ReduceOp::Sum)?;
            }
            Ok(t.elapsed().as_secs_f64() / calls.max(1) as f64)
        }
    };
    let a = std::thread::spawn(rank(0));
    let b = std::thread::spawn(rank(1));
    let join = |h: std::thread::JoinHandle<Result<f64, ExecError>>| {
        h.join().unwrap_or(Err(ExecError::Aborted { rank: 0 }))
    };
    let (a, b) = (join(a), join(b));
    Ok(a?.max(b?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_costs_a_positive_finite_time_below_the_deadlock_timeout() {
        let s = rendezvous_s(50).unwrap();
        assert!(s.is_finite() && s > 0.0 && s < 1.0, "{s}");
    }
}
