//! How a test that needs a GPU (or a CUDA library) says it cannot run. Without one, a GPU test
//! prints `skipped: <reason>` and passes, so the suite runs on every machine; on a machine lent
//! for the GPU checks, `PARSIM_REQUIRE_GPU=1` (set by `scripts/gpu-proof.sh` and
//! `scripts/gpu-calibrate.sh`) turns that skip into a failure carrying the same reason, so a
//! broken device lookup cannot pass as "skipped".

use std::fmt::Display;

/// A value of [`REQUIRE_GPU_VAR`] other than 0 or 1, refused with the values it takes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{REQUIRE_GPU_VAR}={value:?}: set it to 1 (GPU tests must run) or 0 (they may skip)")]
pub struct RequireGpuError {
    pub value: String,
}

/// The environment variable that turns every GPU test's skip into a failure.
pub const REQUIRE_GPU_VAR: &str = "PARSIM_REQUIRE_GPU";

/// What a value of [`REQUIRE_GPU_VAR`] asks for: `1` a GPU; unset, empty or `0` none. Any
/// other value is refused with the variable's name and the values it takes (never guessed).
pub fn parse_require_gpu(value: Option<&str>) -> Result<bool, RequireGpuError> {
    match value.map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(RequireGpuError {
            value: other.to_string(),
        }),
    }
}

/// Whether this process's environment asks for a GPU ([`parse_require_gpu`]).
pub fn gpu_required() -> Result<bool, RequireGpuError> {
    parse_require_gpu(std::env::var(REQUIRE_GPU_VAR).ok().as_deref())
}

/// A GPU test cannot run for `reason`: prints `skipped: {reason}` so the caller can return,
/// or, under `PARSIM_REQUIRE_GPU=1`, fails the test with the reason.
///
/// # Panics
///
/// Under `PARSIM_REQUIRE_GPU=1`, or when the variable holds a value other than 0 or 1: this
/// is a test's assertion, for tests only.
#[track_caller]
pub fn skip_gpu_test(reason: &dyn Display) {
    match gpu_required() {
        Ok(false) => eprintln!("skipped: {reason}"),
        Ok(true) => panic!(
            "{REQUIRE_GPU_VAR}=1, but this GPU test cannot run: {reason} (unset it to let GPU \
             tests skip on a machine without a GPU)"
        ),
        Err(e) => panic!("{e}; this GPU test would skip: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_1_requires_a_gpu_and_other_values_are_refused_by_name() {
        assert_eq!(parse_require_gpu(None), Ok(false));
        assert_eq!(parse_require_gpu(Some("")), Ok(false));
        assert_eq!(parse_require_gpu(Some("0")), Ok(false));
        assert_eq!(parse_require_gpu(Some("1")), Ok(true));
        assert_eq!(parse_require_gpu(Some(" 1\n")), Ok(true));
        for bad in ["yes", "true", "2"] {
            let e = parse_require_gpu(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(REQUIRE_GPU_VAR) && e.contains(bad), "{e}");
        }
    }
}
