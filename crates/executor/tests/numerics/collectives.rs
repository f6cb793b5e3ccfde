//! The CPU collectives against their NCCL semantics, computed independently, with a fixed
//! reduction order (member order) that makes replicated results bit-identical.

use parsim_executor::backend::cpu::Collectives;
use parsim_executor::backend::cpu::{CpuComm, World};
use parsim_executor::backend::ReduceOp;
use std::sync::Arc;

/// Runs `f(rank, comm)` on `n` threads and returns their results in rank order.
fn on_ranks<T: Send>(n: u32, f: impl Fn(u32, &CpuComm) -> T + Sync) -> Vec<T> {
    let world = World::new(n as usize);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let world = Arc::clone(&world);
                let f = &f;
                s.spawn(move || f(r, &CpuComm::new(r, world)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

fn data(rank: u32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (rank as f32 + 1.0) * 0.1 + i as f32 * 1e-3)
        .collect()
}

#[test]
fn all_reduce_sums_in_member_order_on_every_member() {
    let out = on_ranks(4, |r, c| {
        let g = c.group(&[0, 1, 2, 3]);
        let mut b = data(r, 5);
        c.all_reduce(&g, &mut b, ReduceOp::Sum).unwrap();
        let mut m = vec![r as f32; 3];
        c.all_reduce(&g, &mut m, ReduceOp::Max).unwrap();
        (b, m)
    });
    let expect: Vec<f32> = (0..5)
        .map(|i| ((data(0, 5)[i] + data(1, 5)[i]) + data(2, 5)[i]) + data(3, 5)[i])
        .collect();
    for (b, m) in &out {
        assert_eq!(b, &expect, "bit-identical, member order");
        assert_eq!(m, &vec![3.0; 3]);
    }
}

#[test]
fn gather_scatter_all_to_all_and_broadcast() {
    let out = on_ranks(3, |r, c| {
        let g = c.group(&[0, 1, 2]);
        let mine = data(r, 2);
        let mut ag = vec![0.0; 6];
        c.all_gather(&g, &mine, &mut ag).unwrap();
        let mut rs = vec![0.0; 2];
        c.reduce_scatter(&g, &data(r, 6), &mut rs).unwrap();
        let send: Vec<f32> = (0..3).map(|j| (10 * r + j) as f32).collect();
        let mut a2a = vec![0.0; 3];
        c.all_to_all(&g, &send, &mut a2a).unwrap();
        let mut bc = vec![r as f32; 2];
        c.broadcast(&g, &mut bc, 1).unwrap();
        (ag, rs, a2a, bc)
    });
    let all: Vec<f32> = (0..3).flat_map(|r| data(r, 2)).collect();
    for (r, (ag, rs, a2a, bc)) in out.iter().enumerate() {
        assert_eq!(ag, &all);
        let lo = 2 * r;
        let want: Vec<f32> = (lo..lo + 2)
            .map(|i| (data(0, 6)[i] + data(1, 6)[i]) + data(2, 6)[i])
            .collect();
        assert_eq!(rs, &want);
        let want: Vec<f32> = (0..3).map(|j| (10 * j + r) as f32).collect();
        assert_eq!(a2a, &want);
        assert_eq!(bc, &vec![1.0; 2]);
    }
}

#[test]
fn all_to_all_v_delivers_variable_slices_after_a_count_exchange() {
    // Member i sends (i + j) % 3 elements to member j, valued 100 i + 10 j + position; one
    // sends nothing to some member, so empty slices occur.
    let n = 3u32;
    let count = |i: u32, j: u32| ((i + j) % 3) as usize;
    let out = on_ranks(n, |r, c| {
        let g = c.group(&[0, 1, 2]);
        let send_counts: Vec<usize> = (0..n).map(|j| count(r, j)).collect();
        let input: Vec<f32> = (0..n)
            .flat_map(|j| (0..count(r, j)).map(move |p| (100 * r + 10 * j) as f32 + p as f32))
            .collect();
        // Counts first (NCCL-style), with the fixed-size all-to-all.
        let counts_f: Vec<f32> = send_counts.iter().map(|&x| x as f32).collect();
        let mut got = vec![0.0; n as usize];
        c.all_to_all(&g, &counts_f, &mut got).unwrap();
        let recv_counts: Vec<usize> = got.iter().map(|&x| x as usize).collect();
        let mut out = vec![0.0; recv_counts.iter().sum()];
        c.all_to_all_v(&g, &input, &send_counts, &mut out, &recv_counts)
            .unwrap();
        // A wrong expectation is an error, not a panic or a hang.
        let mut wrong = recv_counts.clone();
        wrong.rotate_left(1);
        let mut out2 = vec![0.0; wrong.iter().sum()];
        let bad = c.all_to_all_v(&g, &input, &send_counts, &mut out2, &wrong);
        let detected = bad.is_err() == (wrong != recv_counts);
        (recv_counts, out, detected)
    });
    for (r, (recv_counts, got, wrong_detected)) in out.iter().enumerate() {
        let r = r as u32;
        let want_counts: Vec<usize> = (0..n).map(|i| count(i, r)).collect();
        assert_eq!(recv_counts, &want_counts);
        let want: Vec<f32> = (0..n)
            .flat_map(|i| (0..count(i, r)).map(move |p| (100 * i + 10 * r) as f32 + p as f32))
            .collect();
        assert_eq!(got, &want);
        assert!(wrong_detected);
    }
}

#[test]
fn groups_are_independent_and_send_recv_matches_tags() {
    let out = on_ranks(4, |r, c| {
        // Two groups of two run their collectives concurrently.
        let g = if r < 2 {
            c.group(&[0, 1])
        } else {
            c.group(&[2, 3])
        };
        let mut b = vec![r as f32];
        c.all_reduce(&g, &mut b, ReduceOp::Sum).unwrap();
        // A ring of messages, sent with two tags in the opposite order of their receipt.
        let next = (r + 1) % 4;
        let prev = (r + 3) % 4;
        c.send(next, 7, &[r as f32]).unwrap();
        c.send(next, 8, &[100.0 + r as f32]).unwrap();
        let mut x = [0.0];
        let mut y = [0.0];
        c.recv(prev, 8, &mut y).unwrap();
        c.recv(prev, 7, &mut x).unwrap();
        (b[0], x[0], y[0])
    });
    assert_eq!(out[0], (1.0, 3.0, 103.0));
    assert_eq!(out[3], (5.0, 2.0, 102.0));
}

#[test]
fn flat_range_variants_shard_and_gather_a_buffer() {
    // A flat buffer of 10 elements in shards of ceil(10 / 3) = 4: [0,4), [4,8), [8,10).
    let out = on_ranks(3, |r, c| {
        let g = c.group(&[0, 1, 2]);
        let shard = (4 * r as usize).min(10)..(4 * (r as usize + 1)).min(10);
        let full: Vec<f32> = (0..10).map(|i| i as f32 + 10.0 * r as f32).collect();
        let mut acc = vec![1.0; shard.len()];
        // A bucket covering [3, 9) reduced into each shard (accumulating onto 1.0).
        c.reduce_scatter_range(&g, 3, &full[3..9], shard.clone(), &mut acc)
            .unwrap();
        let mut back = vec![0.0; 10];
        c.gather_range(&g, shard.start, &full[shard.clone()], 0..10, &mut back)
            .unwrap();
        (shard, acc, back)
    });
    for (shard, acc, back) in &out {
        for (k, i) in shard.clone().enumerate() {
            let sum: f32 = if (3..9).contains(&i) {
                (0..3).map(|r| i as f32 + 10.0 * r as f32).sum()
            } else {
                0.0
            };
            assert_eq!(acc[k], 1.0 + sum, "element {i}");
        }
        // Each element comes from the rank that owns it.
        let want: Vec<f32> = (0..10).map(|i| i as f32 + 10.0 * (i / 4) as f32).collect();
        assert_eq!(back, &want);
    }
}

#[test]
fn a_failing_rank_stops_the_run_with_its_error_instead_of_hanging() {
    use parsim_executor::runner::{run_cpu, RunOptions};
    use parsim_plan::plan::{Action, Activation, AdamConfig, ModelShape, Plan, Recompute};
    let model = ModelShape {
        activation: Activation::Gelu,
        seq: 4,
        ..ModelShape::dense(1, 8, 2, 1, 8, 16)
    };
    let mut plan = Plan::single_rank(model, AdamConfig::default(), 1, 1, Recompute::None);
    plan.ranks[0].actions = vec![
        Action::BackwardWeight { stage: 0, mb: 0 },
        Action::OptimizerStep,
    ];
    let err = run_cpu(&plan, &RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("before its I"), "{err}");
}
