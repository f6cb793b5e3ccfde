//! `parsim execute --backend cuda` on a machine without the CUDA driver: a clear error naming
//! the library and where the loader looked, a nonzero exit, no panic. On a machine with a
//! driver these print why they skip.

use assert_cmd::Command;

const SMALL: &str = "tests/fixtures/executor_small.toml";

/// Whether libcuda.so.1 can be loaded here (the same probe the backend makes).
fn driver_present() -> bool {
    parsim_executor::backend::cuda::Library::Driver.present()
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::cargo_bin("parsim")
        .expect("binary")
        .args(args)
        .env("LD_LIBRARY_PATH", "/nonexistent/cuda-libs")
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_names_the_driver(ok: bool, err: &str) {
    assert!(!ok, "must exit nonzero without a driver");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("CUDA driver"), "{err}");
    assert!(err.contains("libcuda.so.1"), "{err}");
    // Where the loader looked: LD_LIBRARY_PATH's folders, then the system's.
    assert!(err.contains("/nonexistent/cuda-libs"), "{err}");
    assert!(err.contains("/usr/lib"), "{err}");
}

#[test]
fn execute_cuda_without_a_driver_names_the_library_and_exits_nonzero() {
    if driver_present() {
        eprintln!("skipped: a CUDA driver is present on this machine");
        return;
    }
    let (ok, err) = run(&[
        "execute",
        "--config",
        SMALL,
        "--backend",
        "cuda",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]);
    assert_names_the_driver(ok, &err);
}

#[test]
fn calibrate_cuda_without_a_driver_fails_before_the_sweep() {
    if driver_present() {
        eprintln!("skipped: a CUDA driver is present on this machine");
        return;
    }
    let (ok, err) = run(&["execute", "--calibrate", "--backend", "cuda"]);
    assert_names_the_driver(ok, &err);
}
