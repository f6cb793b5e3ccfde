//! The CPU backend's cost of one synchronisation between two rank threads, apart from any
//! data: back-to-back all-reduces of one element ([`rendezvous_s`], the figure
//! `execute --calibrate` records in the profile as `tables.collective.rendezvous_s`) and a
//! ping-pong of one-element messages (a send, then a blocking receive, each way). Prints the
//! seconds per call of each round and their median. On the CPU backend that time is spent
//! blocked (the `wait` op class), which no rate table times: a fixed cost per synchronising
//! call that grows with the number of collectives, not with the work between them, and with
//! the host's load (a loaded host wakes a sleeping thread late).
//!
//! Run: `cargo bench -p parsim-executor --bench sync_latency`.

use parsim_executor::backend::cpu::rendezvous::rendezvous_s;
use parsim_executor::backend::cpu::{Collectives, CpuComm, World};
use std::time::Instant;

/// Calls per round, rounds.
const CALLS: usize = 2000;
const ROUNDS: usize = 7;

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds per round trip of `CALLS` one-element ping-pongs between two rank threads.
fn ping_pong_s() -> f64 {
    let world = World::new(2);
    let rank = |rank: u32| {
        let world = world.clone();
        move || {
            let comm = CpuComm::new(rank, world);
            let peer = 1 - rank;
            let mut buf = [0.0f32];
            let t = Instant::now();
            for tag in 0..CALLS as u64 {
                if rank == 0 {
                    comm.send(peer, tag, &[1.0]).expect("send");
                    comm.recv(peer, tag, &mut buf).expect("receive");
                } else {
                    comm.recv(peer, tag, &mut buf).expect("receive");
                    comm.send(peer, tag, &[1.0]).expect("send");
                }
            }
            t.elapsed().as_secs_f64() / CALLS as f64
        }
    };
    let (a, b) = (std::thread::spawn(rank(0)), std::thread::spawn(rank(1)));
    let (a, b) = (a.join().expect("rank 0"), b.join().expect("rank 1"));
    a.max(b)
}

fn print(name: &str, rounds: Vec<f64>) {
    let each: Vec<String> = rounds.iter().map(|s| format!("{:.1}", 1e6 * s)).collect();
    println!(
        "{name}: {:.1} us per call (median of {ROUNDS} rounds of {CALLS} calls: {} us)",
        1e6 * median(rounds),
        each.join(", ")
    );
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        println!("sync_latency: run it with `cargo bench -p parsim-executor --bench sync_latency`");
        return;
    }
    print(
        "all-reduce of one element between two rank threads",
        (0..ROUNDS)
            .map(|_| rendezvous_s(CALLS).expect("all-reduce"))
            .collect(),
    );
    print(
        "ping-pong of one element (send and receive each way)",
        (0..ROUNDS).map(|_| ping_pong_s()).collect(),
    );
}
