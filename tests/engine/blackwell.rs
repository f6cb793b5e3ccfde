//! Issue 30, systems: the Blackwell profiles (B300, GB200 NVL72, GB300 NVL72) and MI355X carry
//! their datasheet figures; `cluster.nvlink_domain_size` puts several nodes on one NVLink fabric
//! (a group inside it runs at NVLink rates across hosts); NCCL's model covers a whole NVL72
//! rack and reproduces the published nccl-tests table of one; bad domains are refused by field.

use super::common::{assert_search_no_slower, est, group_info, resolve, search_recipe, Degrees};
use parsim::config::{Config, GpuProfile, Layer, Resolved};
use parsim::layout::{GroupKind, Layout};
use parsim::model::{CollectiveKind, CommKind};
use parsim::network::nccl::{Algorithm, CollectiveModel, Fabric};
use parsim::network::Network;
use serde_json::{json, Value};

fn same(a: f64, b: f64) -> bool {
    ((a - b) / b).abs() < 1e-12
}

/// Dense peaks per dtype from the vendors' system tables, worked here from the published
/// totals: NVIDIA lists an NVL72 rack's and an HGX board's FP4/FP8/BF16/TF32 with 2:4 sparsity
/// (dense is half), and GB300's and HGX B300's dense FP4 besides.
#[test]
fn blackwell_profiles_carry_their_datasheet_peaks() {
    const PF: f64 = 1e15;
    // (profile, GPUs in the table, fp4 dense total, fp8 / bf16 / tf32 sparse totals)
    for (name, gpus, fp4_dense, fp8_sparse, bf16_sparse, tf32_sparse) in [
        // GB200 NVL72: FP4 1,440 PF sparse (so 720 dense), FP8 720, BF16 360, TF32 180.
        ("gb200", 72.0, 720.0, 720.0, 360.0, 180.0),
        // GB300 NVL72: FP4 1,080 PF dense, FP8 720, BF16 360, TF32 180.
        ("gb300", 72.0, 1080.0, 720.0, 360.0, 180.0),
        // HGX B300: FP4 108 PF dense, FP8 72, BF16 36, TF32 18.
        ("b300", 8.0, 108.0, 72.0, 36.0, 18.0),
    ] {
        let p = GpuProfile::load(name).unwrap();
        let f = &p.peak_flops;
        assert!(same(f.fp4.unwrap(), fp4_dense * PF / gpus), "{name} fp4");
        assert!(
            same(f.fp8.unwrap(), fp8_sparse * PF / gpus / 2.0),
            "{name} fp8"
        );
        assert!(same(f.bf16, bf16_sparse * PF / gpus / 2.0), "{name} bf16");
        assert!(same(f.fp16, f.bf16), "{name} fp16");
        assert!(same(f.fp32, tf32_sparse * PF / gpus / 2.0), "{name} tf32");
        // 8 TB/s of HBM3e per GPU (576 TB/s per NVL72 rack), NVLink 5 at 1.8 TB/s both ways.
        assert!(same(p.hbm_bytes_per_s, 8e12), "{name} HBM");
        assert!(same(p.links.intra_node.bandwidth_bytes_per_s, 1.8e12 / 2.0));
        for field in [
            "peak_flops",
            "memory_bytes",
            "hbm_bytes_per_s",
            "links",
            "efficiency",
        ] {
            assert!(p.provenance.contains_key(field), "{name} cites {field}");
        }
    }
    // NICs per GPU: GB200 trays carry a ConnectX-7 (400 Gb/s) per GPU, GB300 and HGX B300 a
    // ConnectX-8 (800 Gb/s): bits over 8 per direction.
    for (name, gbit) in [("gb200", 400.0), ("gb300", 800.0), ("b300", 800.0)] {
        let p = GpuProfile::load(name).unwrap();
        assert!(
            same(p.links.inter_node.bandwidth_bytes_per_s, gbit * 1e9 / 8.0),
            "{name}"
        );
    }
    // The racks are one NVLink domain of 72; the HGX B300 board is its own node.
    for (name, domain) in [("gb200", Some(72)), ("gb300", Some(72)), ("b300", None)] {
        assert_eq!(
            GpuProfile::load(name).unwrap().links.nvlink_domain_size,
            domain
        );
    }
    // MI355X: 256 CUs at 2.4 GHz x 8192 FP8 FLOP per CU per clock (ISSCC 2026), bf16 half of
    // it, MXFP4 twice (within the 0.01% the profile rounds to).
    let mi = GpuProfile::load("mi355x").unwrap();
    let fp8 = 256.0 * 2.4e9 * 8192.0;
    let close = |a: f64, b: f64| ((a - b) / b).abs() < 1e-4;
    assert!(close(mi.peak_flops.fp8.unwrap(), fp8));
    assert!(close(mi.peak_flops.bf16, fp8 / 2.0));
    assert!(close(mi.peak_flops.fp4.unwrap(), fp8 * 2.0));
    // B200's FP4 rate is the data set's dense figure (calibration/data/gpus.json).
    let data: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/calibration/data/gpus.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let b200 = data
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gpu"].as_str().unwrap().starts_with("B200 (HGX"))
        .unwrap();
    let fp4 = b200["dense_tflops"]["fp4"].as_f64().unwrap() * 1e12;
    assert!(same(
        GpuProfile::load("b200").unwrap().peak_flops.fp4.unwrap(),
        fp4
    ));
    // GPUs before Blackwell and CDNA 4 have no FP4 tensor cores.
    for name in ["a100-80g", "h100-sxm", "h200", "mi300x"] {
        assert_eq!(
            GpuProfile::load(name).unwrap().peak_flops.fp4,
            None,
            "{name}"
        );
    }
}

fn published_nvl72() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/data/nccl-tests-nvl72.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// CoreWeave's published all_reduce_perf table of one GB200 NVL72 rack (72 ranks over 18
/// trays, NCCL 2.26.2; calibration/data/nccl-tests-nvl72.json) within 15% at every size, from
/// NCCL's Blackwell constants with nothing fitted. NVLS carries it: 32 heads (NCCL's arity
/// cap) at 20 GB/s (the fastest SM100 speed with 33 x speed under 18 x 40.1 GB/s), so a bus
/// bandwidth of 32 x 20 x 0.74 x 31/32 x 2 = 917.6 GB/s at the plateau.
#[test]
fn nvl72_all_reduce_reproduces_the_published_table() {
    let data = published_nvl72();
    let tables = data["tables"].as_array().unwrap();
    assert!(!tables.is_empty());
    for t in tables {
        assert_eq!(t["system"], "gb200-nvl72");
        assert_eq!(t["collective"], "all_reduce");
        assert!(t["source"].as_str().unwrap().starts_with("https://"));
        let n = t["gpus"].as_u64().unwrap() as u32;
        // MNNVL: NCCL sees the rack's 18 trays as one node.
        let m = CollectiveModel::new(&Fabric::nvl72(), CollectiveKind::AllReduce, n, 1);
        for row in t["rows"].as_array().unwrap() {
            let bytes = row[0].as_f64().unwrap();
            let published = row[1].as_f64().unwrap();
            let p = m.predict(bytes).unwrap();
            assert_eq!(p.algorithm, Algorithm::Nvls, "{bytes}");
            let busbw = bytes / p.time_s * CollectiveKind::AllReduce.bus_factor(n) / 1e9;
            let err = busbw / published - 1.0;
            println!(
                "{bytes:>12} B: model {busbw:7.1} GB/s, published {published:7.1} ({err:+.3})"
            );
            assert!(err.abs() <= 0.15, "{bytes} B: {busbw} vs {published}");
        }
    }
    // The plateau by hand: a huge message approaches NVLS's bus bandwidth from below.
    let m = CollectiveModel::new(&Fabric::nvl72(), CollectiveKind::AllReduce, 72, 1);
    let b = 1e15;
    let busbw = b / m.predict(b).unwrap().time_s * CollectiveKind::AllReduce.bus_factor(72);
    assert!(busbw < 917.6e9 && busbw > 0.99 * 917.6e9, "{busbw}");
}

/// A rack of 18 trays of 4 GPUs: the GB200 profile's NVLink domain (72) is filled in, and a TP
/// group of 8 over two trays sits in one domain, so it runs on NVLink (one domain, 8 members)
/// where with the tray as the domain it would cross the network (2 domains of 4).
#[test]
fn a_group_inside_one_nvlink_domain_runs_at_nvlink_rates_across_hosts() {
    let rack = json!({
        "model": {"preset": "llama3-70b"},
        "cluster": {"gpu": "gb200", "num_gpus": 144, "gpus_per_node": 4},
        "parallel": {"tp": 8, "pp": 2},
        "training": {"seq_length": 8192, "global_batch_size": 72}
    });
    let r = resolve(rack.clone());
    assert_eq!(r.config.cluster.nvlink_domain_size, Some(72));
    let l = Layout::of(&r);
    assert_eq!(l.group_geometry(GroupKind::Tp, 0), (8, 8, 1));
    assert!(l.crosses_nodes(&l.group_of(GroupKind::Tp, 0)));
    assert!(!l.crosses_domains(&l.group_of(GroupKind::Tp, 0)));
    let mut trays = rack.clone();
    trays["cluster"]["nvlink_domain_size"] = json!(4);
    let t = resolve(trays.clone());
    let lt = Layout::of(&t);
    assert_eq!(lt.group_geometry(GroupKind::Tp, 0), (8, 4, 2));
    // The same all-reduce: NCCL's model of 8 GPUs in one NVLink node, against a ring through
    // the trays' NICs.
    let b = 256u64 << 20;
    let inside =
        Network::new(&l, &r.gpu).collective_s(GroupKind::Tp, CollectiveKind::AllReduce, b, 8);
    let by_hand = CollectiveModel::new(&Fabric::nvl72(), CollectiveKind::AllReduce, 8, 1)
        .predict(b as f64)
        .unwrap()
        .time_s;
    assert!(same(inside, by_hand), "{inside} vs {by_hand}");
    let across =
        Network::new(&lt, &t.gpu).collective_s(GroupKind::Tp, CollectiveKind::AllReduce, b, 8);
    assert!(across > 3.0 * inside, "{across} vs {inside}");
    // In the estimate: TP stays on NVLink and is exposed for less.
    let (e_rack, e_trays) = (est(rack), est(trays));
    assert!(!group_info(&e_rack, GroupKind::Tp).crosses_nodes);
    assert!(group_info(&e_trays, GroupKind::Tp).crosses_nodes);
    assert!(
        e_rack.time.exposed_comm_by_group_s[CommKind::Tp]
            < e_trays.time.exposed_comm_by_group_s[CommKind::Tp]
    );
}

/// The node as the domain, said explicitly, changes no figure of the default configuration.
#[test]
fn a_domain_equal_to_the_node_changes_nothing() {
    let base = json!({"cluster": {"num_gpus": 64}, "parallel": {"tp": 8, "pp": 2}});
    let mut explicit = base.clone();
    explicit["cluster"]["nvlink_domain_size"] = json!(8);
    let (a, b) = (est(base), est(explicit));
    assert_eq!(
        serde_json::to_value(a.time).unwrap(),
        serde_json::to_value(b.time).unwrap()
    );
    assert_eq!(
        serde_json::to_value(&a.memory).unwrap(),
        serde_json::to_value(&b.memory).unwrap()
    );
    assert_eq!(
        serde_json::to_value(&a.communication).unwrap(),
        serde_json::to_value(&b.communication).unwrap()
    );
}

fn rejected(overlay: Value) -> String {
    let cfg = Config::from_layers(&[Layer::overrides(overlay)]).expect("parses");
    Resolved::new(cfg).expect_err("rejected").to_string()
}

/// Bad domains are refused by field, saying which rule: zero, not whole nodes, not filling
/// the GPUs. The profile's default is chosen to fit (racks of 64 where 72 does not).
#[test]
fn bad_domains_are_refused_by_field_and_rule() {
    let cluster = |n: u32, gpn: u32, d: u32| {
        json!({"cluster": {"gpu": "gb200", "num_gpus": n, "gpus_per_node": gpn, "nvlink_domain_size": d},
               "parallel": {"tp": 4}})
    };
    let e = rejected(cluster(144, 4, 0));
    assert!(
        e.contains("cluster.nvlink_domain_size") && e.contains("at least 1"),
        "{e}"
    );
    let e = rejected(cluster(144, 4, 6));
    assert!(
        e.contains("cluster.nvlink_domain_size") && e.contains("whole nodes"),
        "{e}"
    );
    let e = rejected(cluster(256, 4, 72));
    assert!(
        e.contains("cluster.nvlink_domain_size") && e.contains("num_gpus = 256"),
        "{e}"
    );
    // 2,048 GB200s: racks of 72 do not fit, so the default is racks of 64 (16 trays), as
    // given explicitly below; a count that fills neither falls back to the node with a
    // warning naming the field (tests/engine/nvlink_domains.rs).
    let r = resolve(
        json!({"cluster": {"gpu": "gb200", "num_gpus": 2048, "gpus_per_node": 4},
                           "parallel": {"tp": 4}, "training": {"global_batch_size": 512}}),
    );
    assert_eq!(r.config.cluster.nvlink_domain_size, Some(64));
    assert!(
        !r.warnings
            .iter()
            .any(|w| w.contains("cluster.nvlink_domain_size")),
        "{:?}",
        r.warnings
    );
    let mut racks_of_64 = cluster(2048, 4, 64);
    racks_of_64["training"] = json!({"global_batch_size": 512});
    let r = resolve(racks_of_64);
    assert_eq!(Layout::of(&r).nvlink_domain_size, 64);
}

/// `search` places tensor parallelism anywhere in the NVLink domain: with racks of 72 and
/// trays of 4 it tries TP 8, which trays alone would not.
#[test]
fn search_tries_tensor_parallelism_across_the_trays_of_a_rack() {
    let base = |domain: Option<u32>| {
        let mut v = json!({"model": {"preset": "llama3-70b"},
                           "cluster": {"gpu": "gb200", "num_gpus": 144, "gpus_per_node": 4},
                           "training": {"global_batch_size": 72}});
        if let Some(d) = domain {
            v["cluster"]["nvlink_domain_size"] = json!(d);
        }
        Config::from_layers(&[Layer::overrides(v)]).unwrap()
    };
    let max_tp = |c: &Config| {
        parsim::search::enumerate(c, 1)
            .iter()
            .map(|m| m.tp)
            .max()
            .unwrap()
    };
    assert_eq!(max_tp(&base(Some(72))), 8);
    assert_eq!(max_tp(&base(Some(4))), 4);
}

/// `parsim layout` shows the domains when they join nodes, and nothing new otherwise.
#[test]
fn the_layout_report_shows_nvlink_domains() {
    let r = resolve(
        json!({"cluster": {"gpu": "gb200", "num_gpus": 144, "gpus_per_node": 4},
                           "parallel": {"tp": 8}, "training": {"global_batch_size": 72}}),
    );
    let l = Layout::of(&r);
    let text = parsim::report::layout::layout_text(&l, "tp-cp-ep-dp-pp", false, None);
    assert!(text.contains("NVLink domains of 72 GPUs"), "{text}");
    // TP 8 over two trays: 18 groups cross nodes, none leaves its rack.
    assert!(
        text.contains("tp groups: 18 of size 8, 18 cross nodes, 0 cross NVLink domains"),
        "{text}"
    );
    let rank = parsim::report::layout::layout_text(&l, "tp-cp-ep-dp-pp", false, Some(75));
    assert!(rank.contains("(node 18, NVLink domain 1)"), "{rank}");
    let js = parsim::report::layout::layout_json(&l);
    assert_eq!(js["nvlink_domain_size"], 72);
    assert_eq!(js["ranks"][75]["nvlink_domain"], 1);
    let h = resolve(json!({"cluster": {"num_gpus": 16}, "parallel": {"tp": 8}}));
    let plain = parsim::report::layout::layout_text(&Layout::of(&h), "tp-cp-ep-dp-pp", false, None);
    assert!(!plain.contains("NVLink"), "{plain}");
    assert!(parsim::report::layout::layout_json(&Layout::of(&h))
        .get("nvlink_domain_size")
        .is_none());
}

/// A profile's FP4 rate and NVLink domain are checked where given: zero is refused by field.
#[test]
fn profile_fp4_and_domain_must_be_positive() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/gb200.toml"
    ))
    .unwrap();
    for (from, to, field) in [
        ("fp4 = 10000e12", "fp4 = 0", "peak_flops.fp4"),
        (
            "nvlink_domain_size = 72",
            "nvlink_domain_size = 0",
            "links.nvlink_domain_size",
        ),
    ] {
        assert!(text.contains(from));
        let err = GpuProfile::parse(&text.replace(from, to), "test")
            .expect_err("refused")
            .to_string();
        assert!(err.contains(field), "{err}");
    }
}

/// The low-precision settings: NVFP4 times the linear layers at the FP4 peak and MXFP8 at the
/// FP8 peak (attention stays at bf16), so on GB200 the compute falls from bf16 to MXFP8 to
/// NVFP4; NVFP4 on an H100 (no FP4 tensor cores) and an unknown FP8 recipe are refused by field.
#[test]
fn low_precision_recipes_are_timed_at_their_peaks_and_refused_by_field() {
    let on = |gpu: &str, precision: &str| {
        json!({"model": {"preset": "llama3-8b"},
               "cluster": {"gpu": gpu, "num_gpus": 8, "gpus_per_node": 4},
               "parallel": {"tp": 2},
               "training": {"precision": precision, "global_batch_size": 16}})
    };
    let compute = |p: &str| est(on("gb200", p)).time.compute_s;
    let (bf16, fp8, mxfp8, nvfp4) = (
        compute("bf16"),
        compute("fp8"),
        compute("mxfp8"),
        compute("nvfp4"),
    );
    assert!(nvfp4 < mxfp8 && mxfp8 < bf16, "{nvfp4} {mxfp8} {bf16}");
    // MXFP8 and FP8 GEMMs share the FP8 peak and measured share; only the recipe differs
    // (MXFP8's quantise kernels write two block-scaled copies, per-tensor FP8's one on
    // Blackwell: tests/engine/low_precision.rs).
    let gb200 = GpuProfile::load("gb200").unwrap();
    assert!(same(
        gb200.matmul_efficiency_for(parsim::config::Precision::Mxfp8),
        gb200.matmul_efficiency_for(parsim::config::Precision::Fp8)
    ));
    assert!(mxfp8 > fp8, "{mxfp8} vs {fp8}");
    let r = resolve(on("gb200", "nvfp4"));
    assert_eq!(
        r.gpu.peak_flops_for(r.config.training.precision),
        Some(10000e12)
    );
    let e = rejected(on("h100-sxm", "nvfp4"));
    assert!(
        e.contains("training.precision") && e.contains("h100-sxm lacks"),
        "{e}"
    );
    let mut bad = on("h100-sxm", "fp8");
    bad["training"]["fp8_recipe"] = json!("hourly");
    let e = Config::from_layers(&[Layer::overrides(bad)])
        .map(|_| String::new())
        .unwrap_or_else(|e| e.to_string());
    assert!(e.contains("fp8_recipe"), "{e}");
    for recipe in ["delayed", "current", "blockwise"] {
        let mut ok = on("h100-sxm", "fp8");
        ok["training"]["fp8_recipe"] = json!(recipe);
        assert_eq!(
            resolve(ok).config.training.fp8_recipe.unwrap().as_str(),
            recipe
        );
    }
    let mut stray = on("gb200", "bf16");
    stray["training"]["fp8_recipe"] = json!("current");
    let e = rejected(stray);
    assert!(e.contains("training.fp8_recipe"), "{e}");
}

/// The Llama 3 70B/405B Megatron-Bridge recipes of
/// [`nvidia_public_blackwell_recipes_are_accepted`]: (preset, gpu, gpus, precision, tp, pp,
/// cp, gbs).
type LlamaRecipe = (
    &'static str,
    &'static str,
    u32,
    &'static str,
    u32,
    u32,
    u32,
    u64,
);
const LLAMA_RECIPES: [LlamaRecipe; 14] = [
    ("llama3-70b", "b200", 64, "bf16", 2, 4, 2, 256),
    ("llama3-70b", "b200", 64, "mxfp8", 2, 4, 1, 256),
    ("llama3-70b", "b200", 64, "nvfp4", 2, 4, 1, 256),
    ("llama3-70b", "gb200", 64, "mxfp8", 2, 4, 1, 256),
    ("llama3-70b", "gb200", 64, "nvfp4", 2, 4, 1, 256),
    ("llama3-70b", "gb300", 64, "mxfp8", 1, 4, 1, 256),
    ("llama3-70b", "gb300", 64, "nvfp4", 1, 4, 1, 256),
    ("llama3-405b", "gb200", 128, "bf16", 4, 8, 2, 512),
    ("llama3-405b", "gb200", 128, "mxfp8", 4, 8, 2, 512),
    ("llama3-405b", "gb200", 128, "nvfp4", 4, 16, 1, 512),
    ("llama3-405b", "gb200", 256, "fp8", 4, 16, 1, 512),
    ("llama3-405b", "gb300", 128, "nvfp4", 4, 8, 1, 512),
    ("llama3-405b", "gb300", 256, "mxfp8", 2, 8, 2, 512),
    ("llama3-405b", "gb300", 256, "nvfp4", 4, 8, 1, 512),
];

/// NVIDIA's public Megatron-Bridge performance recipes (docs.nvidia.com/nemo/megatron-bridge,
/// API docs of `bridge.perf_recipes.llama.{b200,gb200,gb300}`: the layouts their docstrings
/// give) are accepted by `estimate`. Sequence 8192 and micro batch 1 as the Llama 3 recipes
/// run; the 405B recipes' global batch is not in the docstrings (512 here), nor their split
/// of 126 layers (here Megatron's embedding and loss slots, 128 over pp). GB200/GB300 racks
/// run 64 GPUs (16 trays of 4) per NVLink domain where 72 does not divide the job.
#[test]
fn nvidia_public_blackwell_recipes_are_accepted() {
    // (preset, gpu, gpus, precision, tp, pp, cp, gbs)
    let recipes = LLAMA_RECIPES;
    for (preset, gpu, gpus, precision, tp, pp, cp, gbs) in recipes {
        let mut c = json!({
            "model": {"preset": preset},
            "cluster": {"gpu": gpu, "num_gpus": gpus},
            "parallel": {"tp": tp, "pp": pp, "cp": cp},
            "training": {"precision": precision, "seq_length": 8192, "micro_batch_size": 1,
                         "global_batch_size": gbs}
        });
        if gpu.starts_with("gb") {
            c["cluster"]["gpus_per_node"] = json!(4);
            if gpus > 72 {
                c["cluster"]["nvlink_domain_size"] = json!(64);
            }
        }
        if precision == "fp8" {
            c["training"]["fp8_recipe"] = json!("current");
        }
        if preset == "llama3-405b" {
            // 126 layers: the 405B recipes give the embedding and the loss a layer slot each
            // (Megatron's account_for_*_in_pipeline_split), 128 slots over pp.
            c["parallel"]["account_for_embedding_in_pipeline_split"] = json!(true);
            c["parallel"]["account_for_loss_in_pipeline_split"] = json!(true);
        }
        let e = est(c);
        assert!(
            e.time.step_s.is_finite() && e.time.step_s > 0.0,
            "{preset} {gpu} {precision}"
        );
        assert!(
            e.throughput.mfu > 0.0 && e.throughput.mfu < 1.0,
            "{preset} {gpu} {precision}: {}",
            e.throughput.mfu
        );
    }
}

/// One public Megatron-Bridge recipe: the layout its table row gives and the run it describes.
#[derive(Debug, Clone, Copy)]
struct Recipe {
    preset: &'static str,
    gpu: &'static str,
    gpus: u32,
    /// bf16, fp8 (current scaling: the tables' FP8-CS), mxfp8 (FP8-MX) or nvfp4.
    precision: &'static str,
    tp: u32,
    pp: u32,
    cp: u32,
    vpp: u32,
    ep: u32,
    mbs: u64,
    gbs: u64,
    seq: u64,
}

/// The Llama 3 8B and DeepSeek-V3 pre-training rows of Megatron-Bridge's performance summary
/// (github.com/NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md and
/// docs/performance-summary-archive.md; docs.nvidia.com/nemo/megatron-bridge/latest/
/// performance-summary.html): the 25.11 container's tables for DGX-B200, DGX-GB200 and
/// DGX-GB300 (Llama 3 8B at FP8-CS and FP8-MX on 8 GPUs; DeepSeek-V3 at BF16 and FP8-MX on
/// 256), and the 26.02 and 26.04.01 containers' DeepSeek-V3 MXFP8 rows. Validation only:
/// nothing is fitted to their throughputs.
#[rustfmt::skip]
const TABLE_RECIPES: [Recipe; 13] = {
    /// A row: (preset, gpu, gpus, precision), [tp, pp, cp, vpp, ep], [mbs, gbs, seq].
    const fn r(
        (preset, gpu, gpus, precision): (&'static str, &'static str, u32, &'static str),
        [tp, pp, cp, vpp, ep]: [u32; 5],
        [mbs, gbs, seq]: [u64; 3],
    ) -> Recipe {
        Recipe {
            preset,
            gpu,
            gpus,
            precision,
            tp,
            pp,
            cp,
            vpp,
            ep,
            mbs,
            gbs,
            seq,
        }
    }
    const L8: &str = "llama3-8b";
    const DS: &str = "deepseek-v3";
    [
        // 25.11: LLAMA3_8B, 8 GPUs, GBS 128, MBS 2, seq 8192, TP 1 PP 1 CP 1, FP8-CS (FP8-MX).
        r((L8, "b200", 8, "fp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        r((L8, "b200", 8, "mxfp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        r((L8, "gb200", 8, "fp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        r((L8, "gb200", 8, "mxfp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        r((L8, "gb300", 8, "fp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        r((L8, "gb300", 8, "mxfp8"), [1, 1, 1, 1, 1], [2, 128, 8192]),
        // 25.11: DeepSeekV3, 256 GPUs, seq 4096, MBS 1. GB300: GBS 4096, PP 2 VP 4 EP 32 at
        // BF16 and FP8-MX; GB200: BF16 PP 4 VP 4 EP 64; B200: FP8-MX GBS 2048, PP 16 EP 8.
        // Left out: GB200 FP8-MX PP 8 VP 4 EP 32, whose 32 virtual stages have no layout in
        // Megatron-Bridge's DeepSeek-V3 map (below), so its split is not known.
        r((DS, "gb300", 256, "bf16"), [1, 2, 1, 4, 32], [1, 4096, 4096]),
        r((DS, "gb300", 256, "mxfp8"), [1, 2, 1, 4, 32], [1, 4096, 4096]),
        r((DS, "gb200", 256, "bf16"), [1, 4, 1, 4, 64], [1, 4096, 4096]),
        r((DS, "b200", 256, "mxfp8"), [1, 16, 1, 1, 8], [1, 2048, 4096]),
        // 26.02: DeepSeekV3 MXFP8, GBS 4096: GB300 MBS 2 PP 2 VP 8 EP 32; GB200 MBS 1 PP 4
        // VP 4 EP 64 (as 25.11's BF16 row). 26.04.01: B200 PP 8 VP 2 EP 32.
        r((DS, "gb300", 256, "mxfp8"), [1, 2, 1, 8, 32], [2, 4096, 4096]),
        r((DS, "gb200", 256, "mxfp8"), [1, 4, 1, 4, 64], [1, 4096, 4096]),
        r((DS, "b200", 256, "mxfp8"), [1, 8, 1, 2, 32], [1, 4096, 4096]),
    ]
};

/// The recipes of [`LLAMA_RECIPES`] in the shape of [`Recipe`] (micro batch 1, seq 8192, the
/// layouts' vpp not given by their docstrings).
fn llama_recipes() -> Vec<Recipe> {
    LLAMA_RECIPES
        .iter()
        .map(|&(preset, gpu, gpus, precision, tp, pp, cp, gbs)| Recipe {
            preset,
            gpu,
            gpus,
            precision,
            tp,
            pp,
            cp,
            vpp: 1,
            ep: 1,
            mbs: 1,
            gbs,
            seq: 8192,
        })
        .collect()
}

/// DeepSeek-V3's pipeline layout in Megatron-Bridge (`set_deepseek_v3_pipeline_model_parallel_layout`
/// in its DeepSeek-V3 recipe): 61 layers with the embedding on the first virtual stage and
/// the MTP layer and loss on the last, by the number of virtual stages pp x vpp; 8 stages as
/// its (8, 1) and (4, 2) entries, 16 as its (16, 1), (8, 2) and (4, 4) ones; 4 as (4, 1).
fn deepseek_layout(stages: u32) -> Option<&'static str> {
    match stages {
        4 => Some("Et*16|t*16|t*16|t*13mL"),
        8 => Some("Et*8|(t*8|)*6,t*5mL"),
        16 => Some("Et*4|(t*4|)*14,tmL"),
        _ => None,
    }
}

/// The configuration of a recipe, as the existing recipes above are built: trays of 4 GPUs
/// on GB200/GB300, one NVLink domain of the job's GPUs when it is under a rack, else racks of
/// 64 (16 trays) where 72 does not divide the job; current scaling for FP8; Megatron's
/// embedding and loss slots for Llama-3-405B's 126 layers; the MTP layer and Megatron-Bridge's
/// layout for DeepSeek-V3.
fn recipe_config(r: &Recipe, with_parallel: bool) -> Value {
    let mut c = json!({
        "model": {"preset": r.preset},
        "cluster": {"gpu": r.gpu, "num_gpus": r.gpus},
        "training": {"precision": r.precision, "seq_length": r.seq, "micro_batch_size": r.mbs,
                     "global_batch_size": r.gbs}
    });
    if r.gpu.starts_with("gb") {
        c["cluster"]["gpus_per_node"] = json!(4);
        if r.gpus < 72 {
            c["cluster"]["nvlink_domain_size"] = json!(r.gpus);
        } else if r.gpus % 72 != 0 {
            c["cluster"]["nvlink_domain_size"] = json!(64);
        }
    }
    if r.precision == "fp8" {
        c["training"]["fp8_recipe"] = json!("current");
    }
    if r.preset == "deepseek-v3" {
        c["model"]["mtp_num_layers"] = json!(1);
    }
    if with_parallel {
        c["parallel"] = json!({"tp": r.tp, "pp": r.pp, "cp": r.cp, "vpp": r.vpp, "ep": r.ep,
                               "zero": 1});
        if r.vpp > 1 {
            c["parallel"]["schedule"] = json!("interleaved-1f1b");
        }
        if r.preset == "llama3-405b" {
            c["parallel"]["account_for_embedding_in_pipeline_split"] = json!(true);
            c["parallel"]["account_for_loss_in_pipeline_split"] = json!(true);
        }
        if r.preset == "deepseek-v3" && r.pp > 1 {
            let layout = deepseek_layout(r.pp * r.vpp).expect("a recipe's layout");
            c["parallel"]["pipeline_layout"] = json!(layout);
        }
    }
    c
}

/// The Llama 3 8B and DeepSeek-V3 recipes are accepted by `estimate` (a finite step, an MFU
/// inside (0, 1)). Their step time against NVIDIA's published tokens/s per GPU is checked by
/// the validation harness, row by row of the Megatron-Bridge table, with a guard per model
/// and system (calibration/accuracy-guards.toml, `tests/accuracy/published_throughput.rs`). Every DeepSeek-V3 row's EP divides its data parallelism (256 / pp), so
/// none needs expert-parallel folding.
#[test]
fn nvidia_public_8b_and_deepseek_v3_recipes_are_accepted_by_estimate() {
    for r in TABLE_RECIPES {
        assert_eq!((r.gpus / (r.tp * r.cp * r.pp)) % r.ep, 0, "{r:?}");
        let e = est(recipe_config(&r, true));
        assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0, "{r:?}");
        assert!(
            e.throughput.mfu > 0.0 && e.throughput.mfu < 1.0,
            "{r:?}: {}",
            e.throughput.mfu
        );
    }
}

/// Every public recipe (Llama 3 8B/70B/405B, DeepSeek-V3) is accepted by `search`: over the
/// recipe's GPU count and precision, with its degrees pinned (tp, cp, pp, ep, micro batch;
/// ZeRO-1 as Megatron's distributed optimizer, the P2P ring for CP), the search either finds
/// the recipe's own mix among its candidates or ranks first a mix no slower than it. The pins
/// keep the test small; a search without them can only do as well or better, the step-time
/// bound being exact.
#[test]
fn nvidia_public_recipes_are_accepted_by_search() {
    for r in llama_recipes().into_iter().chain(TABLE_RECIPES) {
        let recipe = est(recipe_config(&r, true));
        let base = Config::from_layers(&[Layer::overrides(recipe_config(&r, false))]).unwrap();
        let degrees = Degrees {
            tp: r.tp,
            cp: r.cp,
            pp: r.pp,
            vpp: r.vpp,
            ep: r.ep,
            mbs: r.mbs,
        };
        let (enumerated, best) = search_recipe(&base, degrees, &[]);
        println!(
            "{r:?}: recipe {:.3} s (fits {}), search best {best:?}, degrees enumerated {enumerated}",
            recipe.time.step_s, recipe.memory.fits
        );
        assert_search_no_slower(&format!("{r:?}"), &recipe, best);
    }
}
