//! `parsim doctor`: the report's JSON keys, a bad --arch refused by name, and (where NVRTC is
//! installed) every kernel of the CUDA backend compiled for --arch sm_90 without a GPU; where NVRTC is
//! missing, --arch fails naming the library.

use assert_cmd::Command;
use parsim_executor::backend::cuda::compile::kernels::FILES;
use parsim_executor::backend::cuda::probe::Library;
use serde_json::Value;

fn doctor(args: &[&str]) -> std::process::Output {
    let cache = tempfile::tempdir().expect("temporary cache folder");
    Command::cargo_bin("parsim")
        .expect("binary")
        .arg("doctor")
        .args(args)
        .env("PARSIM_KERNEL_CACHE", cache.path())
        .output()
        .expect("runs")
}

#[test]
fn doctor_refuses_an_architecture_that_is_not_sm_digits() {
    for bad in ["sm80", "compute_90", "sm_"] {
        let out = doctor(&["--arch", bad]);
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--arch {bad}")) && err.contains("sm_90"),
            "{err}"
        );
    }
}

#[test]
fn doctor_json_lists_every_library_and_the_kernels_for_arch() {
    let out = doctor(&["--arch", "sm_90", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let libs = v["libraries"].as_array().unwrap();
    assert_eq!(libs.len(), Library::ALL.len());
    for (l, lib) in libs.iter().zip(Library::ALL) {
        assert_eq!(l["library"], lib.to_string());
        // Found: a path or version; missing: the error names the file looked for.
        if l["found"] == true {
            assert!(l["version"].is_string(), "{l}");
        } else {
            assert!(l["error"].as_str().unwrap().contains(lib.file()), "{l}");
        }
    }
    assert_eq!(v["arch"], "sm_90");
    if !Library::Nvrtc.present() {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(
            &"the kernel check: NVRTC is not installed",
        );
        assert!(!out.status.success(), "compiling without NVRTC must fail");
        assert!(String::from_utf8_lossy(&out.stdout).contains("NVRTC"));
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kernels = v["kernels"].as_array().unwrap();
    let want: usize = FILES.iter().map(|f| f.kernel_names().len()).sum();
    assert_eq!(kernels.len(), want);
    for k in kernels {
        assert!(k["registers"].as_u64().unwrap() > 0, "{k}");
        assert!(k["static_shared_bytes"].is_u64(), "{k}");
    }
    assert!(v["failures"].as_array().unwrap().is_empty());
}
