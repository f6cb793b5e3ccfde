//! Measured rate tables in GPU profiles (config/tables.rs): the time model uses a table where
//! it covers an op and the analytic model elsewhere; one profile's measured attention curve
//! (parsim's flash_mma) and the published kernels (cuDNN) are picked by implementation; bad
//! tables are refused by field; tables fitted from op timings reproduce them. Expected values
//! come from the formulas cited in each test, worked by hand.

use parsim::calibrate::table_fit::{fit_tables, reproduce, REPRODUCTION_BOUND};
use parsim::config::tables::{
    CollectiveCurve, CollectiveTable, GemmBucket, GemmTable, HostGapTable, MemoryTable, RateTables,
    TableProvenance,
};
use parsim::config::{Config, GpuProfile, Layer, Resolved};
use parsim::layout::{GroupKind, Layout};
use parsim::model::{CollectiveKind, Op, OpKind};
use parsim::network::Network;
use parsim::time::Rates;
use parsim_plan::dtype::DType;
use parsim_plan::op_timing::{self, MaskKind, OpKey, OpTiming, Pass, Placement};
use serde_json::json;

fn provenance() -> TableProvenance {
    TableProvenance {
        date: "2026-12-01".into(),
        device: "test device".into(),
        driver: "none".into(),
        software: "hand-made".into(),
    }
}

fn rates(gpu: &GpuProfile) -> Rates<'_> {
    Rates {
        gpu,
        peak_flops: gpu.peak_flops.bf16,
        element_bytes: 2,
        matmul_efficiency: gpu.efficiency.matmul,
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    ((a - b) / b).abs() < tol
}

/// A GEMM in a measured bucket runs at 2mnk / (peak x efficiency) plus the host gap; one
/// in another bucket keeps the analytic roofline; a memory-bound op between two points runs
/// at the log-log interpolation of their rates (the geometric mean halfway in log bytes); a
/// grouped GEMM whose groups a bucket covers runs as one call per group.
#[test]
fn tables_time_the_ops_they_cover_and_the_analytic_model_the_rest() {
    let plain = GpuProfile::load("h100-sxm").unwrap();
    let mut gpu = plain.clone();
    gpu.tables = RateTables {
        gemm: Some(GemmTable {
            provenance: provenance(),
            buckets: vec![GemmBucket {
                dtype: DType::Bf16,
                m: 4096,
                n: 4096,
                k: 4096,
                efficiency: 0.5,
                count: 3,
            }],
        }),
        memory: Some(MemoryTable {
            provenance: provenance(),
            bytes: vec![1_000_000, 100_000_000],
            bytes_per_s: vec![1e11, 1e12],
            count: vec![1, 1],
        }),
        host_gap: Some(HostGapTable {
            provenance: provenance(),
            seconds_per_op: 2e-6,
            count: 10,
        }),
        ..RateTables::default()
    };
    let (r, p) = (rates(&gpu), rates(&plain));
    // 5000 lies in the 4096 octave of each dimension.
    let by_hand = 2.0 * 5000f64.powi(3) / (989.4e12 * 0.5) + 2e-6;
    assert!(close(r.gemm_s(5000, 5000, 5000), by_hand, 1e-12));
    assert_eq!(r.gemm_s(5000, 5000, 16384), p.gemm_s(5000, 5000, 16384));
    // A grouped GEMM whose groups the table covers runs as its groups' calls, each with its
    // host gap (the measured runner loops over its experts): 8 x the hand figure above. One
    // the table does not cover stays the analytic grouped kernel of the plain profile.
    assert!(close(
        r.grouped_gemm_s(8, 5000, 5000, 5000),
        8.0 * by_hand,
        1e-12
    ));
    assert_eq!(
        r.grouped_gemm_s(8, 5000, 5000, 16384),
        p.grouped_gemm_s(8, 5000, 5000, 16384)
    );
    // 1e7 bytes: halfway between 1e6 and 1e8 in log bytes, so sqrt(1e11 x 1e12) bytes/s.
    let mid = 1e7 / (1e11f64 * 1e12).sqrt() + 2e-6;
    assert!(close(r.memory_s(10_000_000), mid, 1e-9));
    // Outside the stated range (below the first point, above the last): analytic.
    assert_eq!(r.memory_s(999_999), p.memory_s(999_999));
    assert_eq!(r.memory_s(100_000_001), p.memory_s(100_000_001));
}

fn flash_mma_profile() -> GpuProfile {
    GpuProfile::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/h100-flash-mma.toml"
    ))
    .unwrap()
}

fn attention_op(seq_len: u64, fwd: f64) -> Op {
    let mut op = Op::new(
        "attn.core",
        OpKind::Attention {
            seq_len,
            causal: true,
            fused: true,
            head_dim: 128,
            ring: None,
            window: None,
        },
    );
    op.rank_flops.fwd = fwd;
    op.rank_flops.dgrad = 2.0 * fwd;
    op
}

/// The committed flash_mma table: at s 4096 it is the kernels bench's two figures (146.1 and
/// 79.9 TFLOP/s, docs/gpu-results/2026-11-23/proof-log.txt), and at every other length those
/// figures times FlashAttention-2's published H100 rate there over its rate at 4096 (the
/// causal backward as the engine derives it: non-causal backward x the causal / non-causal
/// forward ratio), within the table's rounding to four digits.
#[test]
fn the_flash_mma_table_is_the_kernels_bench_along_flash_attention_2s_curve() {
    let gpu = flash_mma_profile();
    let series = |pass: &str, causal: bool| {
        parsim::attention_rates::published_series()
            .iter()
            .find(|s| {
                s.gpu == "h100-sxm"
                    && s.kernel == "flash-attention-2"
                    && format!("{:?}", s.pass).to_lowercase() == pass
                    && s.causal == causal
                    && s.head_dim == 128
            })
            .unwrap()
            .clone()
    };
    let (fc, fnc, bnc) = (
        series("forward", true),
        series("forward", false),
        series("backward", false),
    );
    let at = |s: &parsim::attention_rates::Series, len: u64| {
        s.tflops[s.seq_len.iter().position(|&l| l == len).unwrap()]
    };
    let bc = |len| at(&bnc, len) * at(&fc, len) / at(&fnc, len);
    let t = &gpu.tables;
    for len in [512u64, 1024, 2048, 4096, 8192, 16384] {
        let fwd = 146.1e12 * at(&fc, len) / at(&fc, 4096);
        let bwd = 79.9e12 * bc(len) / bc(4096);
        let got = |pass| {
            t.attention_flops_per_s("flash_mma", pass, MaskKind::Causal, 128, len)
                .unwrap()
        };
        assert!(close(got(Pass::Forward), fwd, 5e-4), "{len}");
        assert!(close(got(Pass::Backward), bwd, 5e-4), "{len}");
    }
}

/// One profile, two implementations: with no kernel named the profile's measured flash_mma
/// curve times the core (its forward FLOPs over 146.1 TFLOP/s at s 4096; the backward's
/// 2.5 forward FLOPs over 79.9), and `training.attention_kernel = "cudnn"` (a Megatron run)
/// takes cuDNN's published rates on the same GEMM, HBM and network figures. An
/// implementation neither measured nor published is refused by field.
#[test]
fn the_kernel_implementation_picks_the_attention_curve() {
    let gpu = flash_mma_profile();
    let op = attention_op(4096, 1e12);
    let (f, b) = rates(&gpu).attention_pass_s(&op);
    assert!(close(f, 1e12 / 146.1e12, 1e-9), "{f}");
    assert!(close(b, 2.5e12 / 79.9e12, 1e-9), "{b}");
    let with_kernel = |kernel: Option<&str>| {
        let mut doc = json!({
            "model": {"preset": "llama3-8b"},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
            "training": {"seq_length": 8192},
        });
        if let Some(k) = kernel {
            doc["training"]["attention_kernel"] = json!(k);
        }
        let cfg = Config::from_layers(&[Layer::overrides(doc)]).unwrap();
        Resolved::with_gpu(cfg, gpu.clone())
    };
    let own = with_kernel(None).unwrap();
    assert_eq!(
        own.gpu.tables.attention_kernel.as_deref(),
        Some("flash_mma")
    );
    let megatron = with_kernel(Some("cudnn")).unwrap();
    assert_eq!(megatron.gpu.tables.attention_kernel, None);
    assert_eq!(
        megatron.gpu.attention_kernel.as_deref(),
        Some("h100-sxm/cudnn")
    );
    assert_eq!(megatron.gpu.peak_flops, own.gpu.peak_flops);
    assert_eq!(megatron.gpu.links, own.gpu.links);
    // cuDNN runs 3.5x flash_mma's forward rate at 4096 (518 against 146 TFLOP/s): a Megatron
    // step is faster on the same hardware figures.
    let step = |r: &Resolved| parsim::estimate::estimate(r).unwrap().time.step_s;
    assert!(step(&megatron) < step(&own));
    let named = with_kernel(Some("flash_mma")).unwrap();
    assert_eq!(step(&named), step(&own));
    let err = with_kernel(Some("flash-mma-typo")).unwrap_err().to_string();
    assert!(err.contains("training.attention_kernel"), "{err}");
    assert!(err.contains("flash_mma"), "{err}");
}

/// nccl-tests' bus bandwidth (PERFORMANCE.md): an all-reduce over n ranks takes
/// 2(n-1)/n x bytes / busbw. A table for 8 ranks inside a node times the TP all-reduce of
/// a TP-8 layout; a group size the table lacks keeps NCCL's model.
#[test]
fn a_collective_table_times_the_collectives_it_covers() {
    let plain = GpuProfile::load("h100-sxm").unwrap();
    let mut gpu = plain.clone();
    gpu.tables.collective = Some(CollectiveTable {
        provenance: provenance(),
        rendezvous_s: None,
        curves: vec![CollectiveCurve {
            op: op_timing::CollectiveKind::AllReduce,
            group_size: 8,
            placement: Placement::IntraNode,
            bytes: vec![1 << 20, 1 << 30],
            bus_bytes_per_s: vec![100e9, 100e9],
            count: vec![1, 1],
            link_efficiency: None,
        }],
    });
    let layout = Layout::new("tp-cp-ep-dp-pp", 8, 1, 1, 1, 1, 8).unwrap();
    let (net, base) = (Network::new(&layout, &gpu), Network::new(&layout, &plain));
    let b = 64u64 << 20;
    let t = net.collective_s(GroupKind::Tp, CollectiveKind::AllReduce, b, 8);
    assert!(close(t, 1.75 * b as f64 / 100e9, 1e-12), "{t}");
    assert_eq!(
        net.collective_s(GroupKind::Tp, CollectiveKind::AllReduce, b, 4),
        base.collective_s(GroupKind::Tp, CollectiveKind::AllReduce, b, 4)
    );
    assert_eq!(
        net.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b, 8),
        base.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b, 8)
    );
    // A rendezvous the timings left out is added once per covered call, whatever its bytes;
    // an uncovered call keeps NCCL's model (whose latency holds it).
    let mut rv = gpu.clone();
    if let Some(c) = rv.tables.collective.as_mut() {
        c.rendezvous_s = Some(50e-6);
    }
    rv.tables.check().unwrap();
    let with = Network::new(&layout, &rv);
    for bytes in [b, 4 * b] {
        let added = with.collective_s(GroupKind::Tp, CollectiveKind::AllReduce, bytes, 8)
            - net.collective_s(GroupKind::Tp, CollectiveKind::AllReduce, bytes, 8);
        assert!(close(added, 50e-6, 1e-9), "{added}");
    }
    assert_eq!(
        with.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b, 8),
        base.collective_s(GroupKind::Tp, CollectiveKind::AllGather, b, 8)
    );
    if let Some(c) = rv.tables.collective.as_mut() {
        c.rendezvous_s = Some(f64::NAN);
    }
    let (field, _) = rv.tables.check().unwrap_err();
    assert_eq!(field, "tables.collective.rendezvous_s");
}

/// `--json` says how many ops the tables time and which fell outside; a profile without
/// tables leaves the entry out (every existing output unchanged).
#[test]
fn the_estimate_counts_the_ops_outside_the_tables() {
    let doc = json!({
        "model": {"preset": "llama3-8b"},
        "cluster": {"num_gpus": 8},
        "training": {"seq_length": 4096},
    });
    let cfg = Config::from_layers(&[Layer::overrides(doc)]).unwrap();
    let plain = Resolved::new(cfg.clone()).unwrap();
    let e = parsim::estimate::estimate(&plain).unwrap();
    assert!(e.table_coverage.is_none());
    assert!(serde_json::to_value(&e)
        .unwrap()
        .get("table_coverage")
        .is_none());
    let r = Resolved::with_gpu(cfg, flash_mma_profile()).unwrap();
    let c = parsim::estimate::estimate(&r)
        .unwrap()
        .table_coverage
        .unwrap();
    // Only the attention core is measured (s 4096, causal, head 128): every distinct block
    // with attention has one covered op; GEMMs, memory-bound ops and collectives fall outside.
    assert!(c.covered_ops >= 1, "{c:?}");
    assert_eq!(c.outside_by_class.get("attention"), None, "{c:?}");
    assert!(c.outside_by_class["gemm"] > 0 && c.outside_by_class["memory"] > 0);
    assert_eq!(c.outside_ops, c.outside_by_class.values().sum::<u64>());
}

/// The committed flash_mma profile with one line replaced.
fn parse_with(from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/h100-flash-mma.toml"
    ))
    .unwrap();
    assert!(text.contains(from), "{from}");
    match GpuProfile::parse(&text.replacen(from, to, 1), "t.toml") {
        Ok(_) => panic!("{to:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_tables_are_refused_by_field() {
    let seq = "seq_len = [512, 1024, 2048, 4096, 8192, 16384]";
    let fwd = "flops_per_s = [87.48e12, 119.1e12, 136.5e12, 146.1e12, 152.5e12, 153.4e12]";
    let cases = [
        (
            seq,
            "seq_len = []",
            "tables.attention.flash_mma.curves[0].seq_len",
            "at least one point",
        ),
        (
            seq,
            "seq_len = [512, 1024, 4096, 2048, 8192, 16384]",
            "tables.attention.flash_mma.curves[0].seq_len",
            "strictly increasing",
        ),
        (
            fwd,
            "flops_per_s = [87.48e12, 119.1e12, -136.5e12, 146.1e12, 152.5e12, 153.4e12]",
            "tables.attention.flash_mma.curves[0].flops_per_s",
            "positive finite",
        ),
        (
            fwd,
            "flops_per_s = [87.48e12, 119.1e12, nan, 146.1e12, 152.5e12, 153.4e12]",
            "tables.attention.flash_mma.curves[0].flops_per_s[2]",
            "finite",
        ),
        (
            fwd,
            "flops_per_s = [87.48e12, 119.1e12, inf, 146.1e12, 152.5e12, 153.4e12]",
            "tables.attention.flash_mma.curves[0].flops_per_s[2]",
            "finite",
        ),
        (
            "attention_kernel = \"flash_mma\"",
            "attention_kernel = \"flash_mmx\"",
            "tables.attention_kernel",
            "known: flash_mma",
        ),
        (
            "date = \"2026-11-23\"",
            "date = \"\"",
            "tables.attention.flash_mma.provenance.date",
            "empty",
        ),
    ];
    for (from, to, field, rule) in cases {
        let err = parse_with(from, to);
        assert!(err.contains(field) && err.contains(rule), "{to}: {err}");
    }
    // A curve whose count has the wrong length, and a GEMM bucket off its octave.
    let err = parse_with("count = [0, 0, 0, 1, 0, 0]  #", "count = [1]  #");
    assert!(err.contains("same length"), "{err}");
    let gemm = "attention_kernel = \"flash_mma\"  #";
    let err = parse_with(
        gemm,
        "attention_kernel = \"flash_mma\"\ngemm = { provenance = { date = \"d\", device = \"d\", driver = \"d\", software = \"s\" }, buckets = [{ dtype = \"bf16\", m = 3000, n = 4096, k = 4096, efficiency = 0.5, count = 1 }] }  #",
    );
    assert!(
        err.contains("tables.gemm.buckets[0].m") && err.contains("power of two"),
        "{err}"
    );
}

/// Op timings from a known formula (each bucket's three timings at the truth x 0.97, 1.00
/// and 1.04): the fitted rate of each bucket is their time-weighted rate (the work over the
/// seconds: the truth times the harmonic mean of the jitters for equal work), so the tables
/// give back each class's seconds exactly and every timing within 10% (here within 4%).
#[test]
fn tables_fitted_from_op_timings_reproduce_them() {
    let gpu = GpuProfile::load("h100-sxm").unwrap();
    let jitter = [0.97, 1.0, 1.04];
    let mut ops = Vec::new();
    let timing = |key: OpKey, s: f64| OpTiming {
        key,
        calls: 4,
        total_s: 4.0 * s,
    };
    // GEMMs at 60% of the bf16 peak, three shapes in one bucket.
    for (i, m) in [4096u64, 5000, 6000].into_iter().enumerate() {
        let s = 2.0 * (m * 4096 * 1024) as f64 / (0.6 * 989.4e12) / jitter[i];
        ops.push(timing(
            OpKey::Gemm {
                m,
                n: 4096,
                k: 1024,
                dtype: DType::Bf16,
            },
            s,
        ));
    }
    // HBM at 2e12 x b / (b + 1e6) bytes/s over 1 MB - 256 MB.
    let hbm = |b: f64| 2e12 * b / (b + 1e6);
    for b in [1u64 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28] {
        for j in jitter {
            ops.push(timing(
                OpKey::Memory { bytes: b },
                b as f64 / (hbm(b as f64) * j),
            ));
        }
    }
    // flash_mma-like attention: forward 150 TFLOP/s x s / (s + 500), causal, head 128.
    for s_len in [1024u64, 2048, 4096, 8192] {
        let key = OpKey::Attention {
            batch_heads: 16,
            q_len: s_len,
            kv_len: s_len,
            head_dim: 128,
            mask: MaskKind::Causal,
            pass: Pass::Forward,
            kernel: "flash_mma".into(),
        };
        let flops = 4.0 * 16.0 * (s_len * s_len * 128) as f64 / 2.0;
        let rate = 150e12 * s_len as f64 / (s_len as f64 + 500.0);
        for j in jitter {
            ops.push(timing(key.clone(), flops / (rate * j)));
        }
    }
    // All-reduce over 8 ranks in a node at 80 GB/s bus bandwidth.
    for b in [1u64 << 20, 1 << 24, 1 << 28] {
        for j in jitter {
            let key = OpKey::Collective {
                op: op_timing::CollectiveKind::AllReduce,
                bytes: b,
                group_size: 8,
                placement: Placement::IntraNode,
            };
            ops.push(timing(key, 1.75 * b as f64 / (80e9 * j)));
        }
    }
    for j in jitter {
        ops.push(timing(OpKey::HostGap, 5e-6 * j));
    }
    let tables = fit_tables(&ops, &gpu, &provenance()).unwrap();
    // Equal-work timings at rate x j run at rate x 3 / sum(1/j) together.
    let harmonic = 3.0 / jitter.iter().map(|j| 1.0 / j).sum::<f64>();
    let g = &tables.gemm.as_ref().unwrap().buckets;
    assert_eq!(g.len(), 1);
    // The three GEMMs' work is m-weighted: sum(m) / sum(m / j) of the 60%.
    let ms = [4096.0, 5000.0, 6000.0];
    let gemm_e =
        0.6 * ms.iter().sum::<f64>() / ms.iter().zip(jitter).map(|(m, j)| m / j).sum::<f64>();
    assert!(close(g[0].efficiency, gemm_e, 1e-12) && g[0].count == 12);
    assert_eq!(tables.attention_kernel.as_deref(), Some("flash_mma"));
    let rate = tables
        .attention_flops_per_s("flash_mma", Pass::Forward, MaskKind::Causal, 128, 2048)
        .unwrap();
    assert!(close(rate, harmonic * 150e12 * 2048.0 / 2548.0, 1e-12));
    // Seconds per op: the gaps' seconds over their calls, the jitters' mean.
    assert!(close(
        tables.host_gap.as_ref().unwrap().seconds_per_op,
        5e-6 * jitter.iter().sum::<f64>() / 3.0,
        1e-12
    ));
    // The fitted profile parses back and passes its own checks.
    let mut fitted = gpu.clone();
    fitted.tables = tables.clone();
    let text = toml::to_string(&fitted).unwrap();
    let back = GpuProfile::parse(&text, "fitted.toml").unwrap();
    assert_eq!(back.tables, tables);
    let rows = reproduce(&ops, &tables, &gpu);
    let classes: Vec<&str> = rows.iter().map(|r| r.class).collect();
    assert_eq!(
        classes,
        ["gemm", "attention", "memory", "collective", "host_gap"]
    );
    for r in &rows {
        assert!(
            r.uncovered == 0 && r.worst_error <= REPRODUCTION_BOUND,
            "{r:?}"
        );
        // The harmonic mean over 0.97 and 1.04 bounds the jitter; the GEMM shapes share one
        // efficiency. Each class's seconds come back whole.
        assert!(r.worst_error < 0.045, "{r:?}");
        assert!(r.total_error.abs() < 1e-9, "{r:?}");
    }
}

/// Timings a rate cannot come from are refused by position and rule.
#[test]
fn bad_op_timings_are_refused_by_position() {
    let gpu = GpuProfile::load("h100-sxm").unwrap();
    let good = OpTiming {
        key: OpKey::Memory { bytes: 1 << 20 },
        calls: 1,
        total_s: 1e-6,
    };
    let fit = |bad: OpTiming| {
        fit_tables(&[good.clone(), bad], &gpu, &provenance())
            .unwrap_err()
            .to_string()
    };
    let err = fit(OpTiming {
        total_s: -1.0,
        ..good.clone()
    });
    assert!(
        err.starts_with("ops[1]") && err.contains("total_s"),
        "{err}"
    );
    let err = fit(OpTiming {
        total_s: 0.0,
        ..good.clone()
    });
    assert!(err.contains("no rate"), "{err}");
    let err = fit(OpTiming {
        key: OpKey::Gemm {
            m: 8192,
            n: 8192,
            k: 8192,
            dtype: DType::Bf16,
        },
        calls: 1,
        total_s: 1e-6,
    });
    assert!(err.contains("faster than the peak"), "{err}");
}

/// The H100 sweep of 2026-11-23 re-fitted from the flash_mma profile (attention at parsim's
/// measured kernel rates) against the same fit from h100-sxm (attention at
/// FlashAttention-3's published rates): the held-out median error falls.
/// docs/calibration.md quotes the figures `parsim calibrate` prints for both.
#[test]
fn the_h100_sweep_refits_closer_with_parsims_attention_rates() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/h100-measured.jsonl"
    );
    let ms = parsim::calibrate::measurements::read(std::path::Path::new(path)).unwrap();
    let held_out = |gpu: &GpuProfile| {
        parsim::calibrate::profile_fit::fit_profile(gpu, &ms, path)
            .unwrap()
            .summary("held out", false, true)
            .unwrap()
    };
    let fa3 = held_out(&GpuProfile::load("h100-sxm").unwrap());
    let mma = held_out(&flash_mma_profile());
    assert!(mma.0 < fa3.0 && mma.1 < fa3.1, "{mma:?} vs {fa3:?}");
}

/// The GPU profiles carry no measured tables (no lent GPU has run the loop with op timings
/// yet); the CPU profile carries every class's, fitted from calibration/cpu.jsonl.
#[test]
fn shipped_gpu_profiles_have_no_tables_and_the_cpu_profile_has_all() {
    for name in GpuProfile::shipped_names() {
        let p = GpuProfile::load(name).unwrap();
        if name == "cpu" {
            let t = &p.tables;
            assert!(t.gemm.is_some() && t.memory.is_some() && t.collective.is_some());
            assert!(t.host_gap.is_some() && t.attention.contains_key("cpu"));
            assert_eq!(t.attention_kernel.as_deref(), Some("cpu"));
            continue;
        }
        assert!(p.tables.is_empty(), "{name}");
        assert!(!toml::to_string(&p).unwrap().contains("tables"), "{name}");
    }
}

/// A collective outside its curve's bytes is timed on the alpha-beta ring at the share of the
/// link its own kind's timings ran at (`link_efficiency`), with the table's host gap and
/// rendezvous: by hand, a 2-rank reduce-scatter of 64 MiB on the cpu profile's intra-node
/// link (10 GB/s, 2 us) at 0.1 takes 2 us + 0.5 x 64 MiB / 1 GB/s + 5 us + 3 us. A kind whose
/// curve has no share keeps the link's efficiency; a share outside (0, 1] is refused by name.
#[test]
fn a_collective_past_its_curve_runs_at_its_own_kinds_measured_share_of_the_link() {
    let mut gpu = GpuProfile::load("cpu").unwrap();
    let curve = |op, link_efficiency| CollectiveCurve {
        op,
        group_size: 2,
        placement: Placement::IntraNode,
        bytes: vec![1 << 20, 4 << 20],
        bus_bytes_per_s: vec![1e9, 1e9],
        count: vec![1, 1],
        link_efficiency,
    };
    gpu.tables.collective = Some(CollectiveTable {
        provenance: provenance(),
        rendezvous_s: Some(3e-6),
        curves: vec![
            curve(op_timing::CollectiveKind::ReduceScatter, Some(0.1)),
            curve(op_timing::CollectiveKind::AllGather, None),
        ],
    });
    gpu.tables.host_gap = Some(HostGapTable {
        provenance: provenance(),
        seconds_per_op: 5e-6,
        count: 1,
    });
    let link = gpu.links.intra_node.clone();
    assert_eq!((link.bandwidth_bytes_per_s, link.latency_s), (10e9, 2e-6));
    let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, 1, 2, 1, 2).unwrap();
    let net = Network::new(&layout, &gpu);
    let b = 64u64 << 20;
    let rs = net.collective_s(GroupKind::Dp, CollectiveKind::ReduceScatter, b, 2);
    let expected = 2e-6 + 0.5 * b as f64 / 1e9 + 5e-6 + 3e-6;
    assert!(close(rs, expected, 1e-12), "{rs} vs {expected}");
    let ag = net.collective_s(GroupKind::Dp, CollectiveKind::AllGather, b, 2);
    let ring = 2e-6 + 0.5 * b as f64 / (10e9 * link.efficiency);
    assert!(close(ag, ring, 1e-12), "{ag} vs {ring}");
    let inside = net.collective_s(GroupKind::Dp, CollectiveKind::ReduceScatter, 2 << 20, 2);
    let table = 0.5 * (2u64 << 20) as f64 / 1e9 + 5e-6 + 3e-6;
    assert!(close(inside, table, 1e-12), "{inside} vs {table}");
    let c = gpu.tables.collective.as_mut().unwrap();
    c.curves[0].link_efficiency = Some(1.5);
    let e = gpu.tables.check().unwrap_err();
    assert_eq!(e.0, "tables.collective.curves[0].link_efficiency", "{e:?}");
}
