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
