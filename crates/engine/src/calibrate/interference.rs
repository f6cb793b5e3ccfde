//! The overlap interference from a measurement of compute slowed by concurrent communication,
//! not from end-to-end throughput tables: Lee et al. 2025, "Characterizing
//! Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning"
//! (calibration/data/overlap-interference.json). Fitted to published step times instead, it
//! took whatever the remaining sources' frameworks favoured (0 to 0.90 across the
//! leave-one-source-out fits), so it did not carry to the source left out.

use serde::Deserialize;

/// The data file.
pub const DATA: &str = include_str!("../../../../calibration/data/overlap-interference.json");

#[derive(Deserialize)]
struct Average {
    average: f64,
}

#[derive(Deserialize)]
struct File {
    compute_slowdown_overlapped: Average,
    sequential_over_overlapped: Average,
}

/// `efficiency.overlap_interference` from the characterization's two averages: overlapped,
/// compute takes (1 + s_c) of its time alone; in sequence the pair takes (1 + s_q) of the
/// overlapped time; so the hidden transfer costs s_c / ((1 + s_q)(1 + s_c) - 1) of its own
/// time. None when the file does not hold two positive averages.
pub fn overlap_interference(json: &str) -> Option<f64> {
    let f: File = serde_json::from_str(json).ok()?;
    let (sc, sq) = (
        f.compute_slowdown_overlapped.average,
        f.sequential_over_overlapped.average,
    );
    let transfer = (1.0 + sq) * (1.0 + sc) - 1.0;
    let alpha = sc / transfer;
    (sc > 0.0 && sq > 0.0 && alpha.is_finite() && alpha <= 1.0).then_some(alpha)
}

/// The shipped value (the data file is compiled in and checked by this module's test).
pub fn measured_overlap_interference() -> f64 {
    overlap_interference(DATA)
        .expect("calibration/data/overlap-interference.json holds two averages")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand from the abstract: 0.189 / (1.102 x 1.189 - 1) = 0.189 / 0.310278 = 0.6091.
    #[test]
    fn shipped_value_by_hand() {
        let a = measured_overlap_interference();
        assert!((a - 0.189 / (1.102 * 1.189 - 1.0)).abs() < 1e-12);
        assert!((a - 0.6091).abs() < 1e-4, "{a}");
    }

    #[test]
    fn a_file_without_the_averages_gives_none() {
        assert_eq!(overlap_interference("{}"), None);
        assert_eq!(
            overlap_interference(
                r#"{"compute_slowdown_overlapped": {"average": 0.0}, "sequential_over_overlapped": {"average": 0.1}}"#
            ),
            None
        );
    }
}
