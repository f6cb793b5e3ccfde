//! Generate + simulate throughput of the pipeline schedules (issue 3's performance goals):
//! pp 32, vpp 4, 256 microbatches (~65k actions for interleaved 1F1B, ~100k for the split
//! schedules) under 5 ms, and pp 128, vpp 8, 1024 microbatches (~2.1M actions) under 1 s.
//!
//! Run: `cargo bench --bench schedule`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use parsim::schedule::{generate, simulate, Costs, ScheduleKind};
use std::hint::black_box;
use std::time::Duration;

fn generate_and_simulate(kind: ScheduleKind, pp: u32, vpp: u32, m: u32, costs: &Costs) -> f64 {
    let program = generate(kind, pp, vpp, m).expect("valid sizes");
    let sim = simulate(&program, costs).expect("no deadlock");
    sim.makespan
}

fn bench(c: &mut Criterion) {
    let cases: &[(ScheduleKind, u32, u32, u32)] = &[
        (ScheduleKind::Interleaved1F1B, 32, 4, 256),
        (ScheduleKind::OneFOneB, 32, 1, 256),
        (ScheduleKind::ZbH1, 32, 1, 256),
        (ScheduleKind::ZbV, 32, 2, 256),
        (ScheduleKind::DualPipeV, 32, 2, 256),
    ];
    let mut small = c.benchmark_group("generate+simulate");
    small.measurement_time(Duration::from_secs(3));
    for &(kind, pp, vpp, m) in cases {
        let costs = Costs::uniform(pp, vpp, 1.0, 2.0, Some(1.0), 0.05).unwrap();
        let program = generate(kind, pp, vpp, m).unwrap();
        let id = format!(
            "{kind}/pp{pp}-vpp{vpp}-m{m} ({} actions)",
            program.num_actions()
        );
        small.bench_function(BenchmarkId::from_parameter(id), |b| {
            b.iter(|| generate_and_simulate(kind, black_box(pp), vpp, black_box(m), &costs))
        });
    }
    small.finish();

    let mut large = c.benchmark_group("generate+simulate-large");
    large.sample_size(10);
    large.measurement_time(Duration::from_secs(10));
    let (pp, vpp, m) = (128, 8, 1024);
    let costs = Costs::uniform(pp, vpp, 1.0, 2.0, None, 0.05).unwrap();
    let kind = ScheduleKind::Interleaved1F1B;
    let actions = generate(kind, pp, vpp, m).unwrap().num_actions();
    large.bench_function(
        BenchmarkId::from_parameter(format!("{kind}/pp{pp}-vpp{vpp}-m{m} ({actions} actions)")),
        |b| b.iter(|| generate_and_simulate(kind, black_box(pp), vpp, black_box(m), &costs)),
    );
    large.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
