//! One full estimate of Llama-3-405B on 16,384 H100s (the aim: under 25 us on 2 cores), and
//! the step-time interval model an estimate process builds once.

use criterion::{criterion_group, criterion_main, Criterion};
use parsim::config::{Config, Layer, Resolved};
use parsim::interval::{IntervalModel, ResidualFile, SHIPPED_JSON};
use std::hint::black_box;

fn resolved() -> Resolved {
    let cfg = Config::from_layers(&[Layer::overrides(serde_json::json!({
        "model": {"preset": "llama3-405b"},
        "cluster": {"num_gpus": 16384, "gpus_per_node": 8},
        "parallel": {"tp": 8, "cp": 1, "pp": 16, "vpp": 1, "schedule": "1f1b", "zero": 1,
                     "first_stage_layers": 7, "last_stage_layers": 7},
        "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 2048}
    }))])
    .expect("config");
    Resolved::new(cfg).expect("valid")
}

fn bench(c: &mut Criterion) {
    let r = resolved();
    c.bench_function(
        "estimate llama3-405b on 16384 x h100 (tp8 pp16 dp128)",
        |b| b.iter(|| black_box(parsim::estimate::estimate(black_box(&r)).expect("estimate"))),
    );
    // What the search ranks with: the same estimate without the bubble's split by cause (two
    // simulations fewer); the difference is the split's cost.
    c.bench_function(
        "estimate llama3-405b on 16384 x h100, bubble not split (search ranking)",
        |b| {
            b.iter(|| {
                let p = parsim::estimate::Prepared::new(black_box(&r), None).expect("prepare");
                black_box(p.finish_with(false).expect("estimate"))
            })
        },
    );
    // What each `parsim estimate` process pays once, on its first interval: the shipped
    // residual file read and its model built (the benchmarks above reuse the built model).
    c.bench_function("interval model from the shipped residuals", |b| {
        b.iter(|| {
            let f = ResidualFile::parse(black_box(SHIPPED_JSON), "residuals.json").expect("parse");
            black_box(IntervalModel::new(&f).expect("model"))
        })
    });
    let cfg = r.config.clone();
    let gpu = r.gpu.clone();
    c.bench_function("validate + estimate llama3-405b on 16384 x h100", |b| {
        b.iter(|| {
            let r = Resolved::with_gpu(black_box(cfg.clone()), gpu.clone()).expect("valid");
            black_box(parsim::estimate::estimate(&r).expect("estimate"))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
