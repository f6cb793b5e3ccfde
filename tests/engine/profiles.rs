//! Shipped GPU profiles carry the published figures of calibration/data/gpus.json (a copy of
//! the project's shared data set, with its sources).

use parsim::config::GpuProfile;

fn published() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/calibration/data/gpus.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn same(a: f64, b: f64) -> bool {
    ((a - b) / b).abs() < 1e-12
}

fn entry<'a>(data: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    data.as_array()
        .unwrap()
        .iter()
        .find(|g| g["gpu"].as_str().unwrap().starts_with(name))
        .unwrap()
}

#[test]
fn profiles_match_published_peaks_and_bandwidths() {
    let data = published();
    for (profile, gpu) in [
        ("a100-40g", "A100 SXM4 40GB"),
        ("a100-80g", "A100 SXM4 80GB"),
        ("h100-sxm", "H100 SXM5"),
        ("h200", "H200"),
        ("b200", "B200 (HGX"),
        ("mi300x", "MI300X"),
    ] {
        let p = GpuProfile::load(profile).unwrap();
        let g = entry(&data, gpu);
        let bf16 = g["dense_tflops"]["bf16"].as_f64().unwrap() * 1e12;
        assert!(same(p.peak_flops.bf16, bf16), "{profile} bf16");
        let hbm = g["hbm_bw_tb_s"].as_f64().unwrap() * 1e12;
        assert!(same(p.hbm_bytes_per_s, hbm), "{profile} HBM");
        match g["dense_tflops"]["fp8"].as_f64() {
            Some(f) => assert!(same(p.peak_flops.fp8.unwrap(), f * 1e12), "{profile} fp8"),
            None => assert_eq!(p.peak_flops.fp8, None, "{profile} has no fp8"),
        }
        if let Some(nvl) = g["nvlink_gb_s_per_gpu"].as_f64() {
            // The data set quotes bidirectional NVLink; profiles hold one direction.
            assert!(
                same(p.links.intra_node.bandwidth_bytes_per_s, nvl / 2.0 * 1e9),
                "{profile} NVLink"
            );
        }
        assert!(!p.provenance.is_empty(), "{profile} cites its sources");
        // Device memory within 10% of the marketed capacity (driver-reported MiB vs GB).
        let gb = g["hbm_gb"].as_f64().unwrap_or(180.0);
        let ratio = p.memory_bytes as f64 / (gb * 1e9);
        assert!((0.95..1.1).contains(&ratio), "{profile} memory {ratio}");
    }
}

#[test]
fn a_profile_file_with_a_bad_value_is_rejected() {
    let text = include_str!("../../calibration/h100-sxm.toml")
        .replace("hbm_bytes_per_s = 3.35e12", "hbm_bytes_per_s = -1.0");
    let err = GpuProfile::parse(&text, "bad.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hbm_bytes_per_s must be a positive finite number"),
        "{err}"
    );
}

/// A throwaway GPU: the A100 80GB file renamed, declaring itself a Blackwell of the H100 fit
/// family that runs FP8 (with an FP8 peak). Its name prefix says A100 and Ampere; everything
/// derived must follow what it declares instead.
fn throwaway_text() -> String {
    include_str!("../../calibration/a100-80g.toml")
        .replace("name = \"a100-80g\"", "name = \"a100-throwaway\"")
        .replace("family = \"ampere\"", "family = \"blackwell\"")
        .replace(
            "efficiency_family = \"A100\"",
            "efficiency_family = \"H100\"",
        )
        .replace(
            "precisions = [\"bf16\", \"fp16\", \"fp32\"]",
            "precisions = [\"bf16\", \"fp16\", \"fp32\", \"fp8\"]",
        )
        .replace("# fp8: no FP8 tensor cores on Ampere", "fp8 = 624e12")
        .replace(
            "peaks = \"datasheet (calibration/data/gpus.json)\"",
            "peaks = \"a throwaway's own figures\"",
        )
}

/// A new GPU is its TOML file plus one registration line: a throwaway profile registered
/// beside the shipped ones shows up in every list the registry derives (names and the
/// `--gpu` help, the published-fit family it names, the GPUs that run FP8 and the
/// `--precision` help, the table of what each profile rests on), and its interval regime and
/// fit family are the ones it declares, not those of the neighbour its name resembles.
#[test]
fn a_registered_profile_reaches_every_derived_list() {
    use parsim::config::{Precision, Registry};
    use parsim::interval::{Dimension, Regime};
    let name = "a100-throwaway";
    let text = throwaway_text();
    let profile = GpuProfile::parse(&text, name).unwrap();
    let shipped = Registry::shipped();
    let reg = shipped.clone().with(profile.clone(), name).unwrap();
    assert_eq!(reg.names().len(), shipped.names().len() + 1);
    assert!(reg.names().contains(&name) && !shipped.names().contains(&name));
    assert!(reg.gpu_help().contains(name), "{}", reg.gpu_help());
    // The fit family it declares (H100), not its prefix's (A100).
    assert!(reg.efficiency_family_members("H100").contains(&name));
    assert!(!reg.efficiency_family_members("A100").contains(&name));
    assert_eq!(reg.efficiency_families(), shipped.efficiency_families());
    // It runs FP8 (A100 does not), so it joins FP8's list and the help's.
    assert!(reg.running(Precision::Fp8).contains(&name));
    assert!(!reg.running(Precision::Nvfp4).contains(&name));
    assert!(
        reg.precision_help().contains(name),
        "{}",
        reg.precision_help()
    );
    // Its own row in the table of what each profile rests on.
    let rows = reg.evidence_rows();
    let mine = rows
        .iter()
        .find(|(names, _)| names.contains(&name))
        .unwrap();
    assert_eq!(mine.0, [name]);
    assert_eq!(mine.1.peaks, "a throwaway's own figures");
    let table = parsim::calibrate::profile_table(&reg);
    assert!(table.contains(&format!("| {name} | a throwaway's own figures |")));
    // Its step-time interval pools with the family it declares.
    let c = parsim::config::Config::default();
    let regime = Regime::of(&c, &profile, 0.0);
    assert_eq!(regime.value(Dimension::GpuFamily), "blackwell");
    let r = parsim::config::Resolved::with_gpu(c, profile).unwrap();
    let e = parsim::estimate::estimate(&r).unwrap();
    assert_eq!(
        e.step_interval.regime.value(Dimension::GpuFamily),
        "blackwell"
    );
    // A family no shipped profile declares is `other`, never a neighbour's.
    let other = GpuProfile::parse(
        &text.replace("family = \"blackwell\"", "family = \"volta\""),
        name,
    )
    .unwrap();
    let c = parsim::config::Config::default();
    assert_eq!(
        Regime::of(&c, &other, 0.0).value(Dimension::GpuFamily),
        "other"
    );
    // The registry refuses a name that is not the file's, or one registered twice.
    assert!(shipped.clone().with(other.clone(), "b200").is_err());
    let twice = reg.with(other, name).unwrap_err().to_string();
    assert!(twice.contains("registered twice"), "{twice}");
}

/// Every shipped profile says what it is (a family, its precisions, what it rests on), each
/// but the CPU's names the published-fit family it takes its efficiencies from, the fit's
/// families are the ones the profiles name, and a family's first member is a GPU with
/// published rows (its shipped values are read from it).
#[test]
fn shipped_profiles_describe_themselves() {
    use parsim::calibrate::fit::Family;
    use parsim::config::Registry;
    let reg = Registry::shipped();
    for p in reg.profiles() {
        assert!(p.family.is_some(), "{}", p.name);
        assert!(!p.precisions.is_empty(), "{}", p.name);
        assert!(p.evidence.is_some(), "{}", p.name);
        assert_eq!(p.efficiency_family.is_none(), p.name == "cpu", "{}", p.name);
    }
    let families: Vec<&str> = Family::all().iter().map(|f| f.name()).collect();
    assert_eq!(families, ["A100", "H100"]);
    assert_eq!(Family::of("a100-40g").map(Family::name), Some("A100"));
    assert_eq!(Family::of("gb300").map(Family::name), Some("H100"));
    assert_eq!(Family::of("cpu"), None);
    let published = parsim::calibrate::published::shipped().unwrap();
    for f in Family::all() {
        let first = f.profiles()[0];
        assert!(
            published.iter().flatten().any(|c| c.gpu == first),
            "{}: {first} has no published rows",
            f.name()
        );
    }
}

/// docs/accuracy.md carries the table of what each profile rests on exactly as the registry
/// writes it (regenerated by `cargo run --release --example fit_published -- --fit --write`).
#[test]
fn the_accuracy_page_lists_the_registry() {
    let page = include_str!("../../docs/accuracy.md");
    let table = parsim::calibrate::profile_table(parsim::config::Registry::shipped());
    assert!(
        page.contains(&table),
        "docs/accuracy.md's profile table is stale; regenerate it:\n{table}"
    );
}

/// The tensor cores' precisions, by the vendors' documents: FP8 from Hopper and CDNA 3, both
/// block-scaled formats on Blackwell, MXFP8 but not NVFP4 on CDNA 4 (its microscaling is
/// OCP MX's, E8M0 scales per 32 values); a precision the profile does not run is refused by
/// field, and the hint names the profiles that do run it.
#[test]
fn precisions_are_what_the_tensor_cores_run() {
    use parsim::config::{Config, Layer, Precision, Resolved};
    let runs = |gpu: &str, p: Precision| GpuProfile::load(gpu).unwrap().runs(p);
    for gpu in ["a100-40g", "a100-80g"] {
        assert!(!runs(gpu, Precision::Fp8), "{gpu}");
    }
    for gpu in ["h100-sxm", "h200", "mi300x"] {
        assert!(runs(gpu, Precision::Fp8), "{gpu}");
        assert!(
            !runs(gpu, Precision::Mxfp8) && !runs(gpu, Precision::Nvfp4),
            "{gpu}"
        );
    }
    for gpu in ["b200", "b300", "gb200", "gb300"] {
        assert!(
            runs(gpu, Precision::Mxfp8) && runs(gpu, Precision::Nvfp4),
            "{gpu}"
        );
    }
    assert!(runs("mi355x", Precision::Mxfp8) && !runs("mi355x", Precision::Nvfp4));
    let cfg = Config::from_layers(&[Layer::overrides(serde_json::json!({
        "cluster": {"gpu": "mi355x"}, "training": {"precision": "nvfp4"}
    }))])
    .unwrap();
    let e = Resolved::new(cfg).unwrap_err().to_string();
    assert!(
        e.contains("training.precision") && e.contains("mi355x lacks"),
        "{e}"
    );
    assert!(e.contains("b200, b300, gb200, gb300"), "{e}");
}

/// Model presets come from one table: every name builds a model of that name, and an unknown
/// preset's error lists every one.
#[test]
fn presets_are_one_table() {
    use parsim::config::presets::{preset, PRESETS, PRESET_NAMES};
    assert_eq!(PRESET_NAMES.len(), PRESETS.len());
    for (n, (m, _)) in PRESET_NAMES.iter().zip(PRESETS) {
        assert_eq!(n, m);
        assert_eq!(preset(n).unwrap().name, *n);
    }
    let err = parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(
        serde_json::json!({"model": {"preset": "nope"}}),
    )])
    .unwrap_err()
    .to_string();
    for n in PRESET_NAMES {
        assert!(err.contains(n), "{n} missing from: {err}");
    }
}

/// What start-up reads without parsing every profile (the `--gpu` and `--precision` help, the
/// names, the interval regime's GPU families, one profile by name) equals what the fully
/// parsed registry derives: the cheap path is a second method for the same lists.
#[test]
fn start_up_lists_equal_the_parsed_registry() {
    use parsim::config::registry::shipped_hardware_families;
    use parsim::config::Registry;
    let shipped = Registry::shipped();
    assert_eq!(Registry::shipped_gpu_help(), shipped.gpu_help());
    assert_eq!(Registry::shipped_precision_help(), shipped.precision_help());
    assert_eq!(GpuProfile::shipped_names(), shipped.names());
    assert_eq!(shipped_hardware_families(), shipped.hardware_families());
    for p in shipped.profiles() {
        assert_eq!(&GpuProfile::load(&p.name).unwrap(), p);
    }
}
