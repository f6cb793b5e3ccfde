//! Host gaps from a trace: the time a device sits idle between kernels inside a training
//! step, shared over the kernels of the step ([`OpKey::HostGap`]'s unit: seconds per op).
//! A step is a `ProfilerStep#N` span (of the device's own process where it has some, as
//! parsim's trace writes them per rank; else any of the file's, as torch.profiler writes them
//! on the CPU thread); a device without steps counts from its first kernel to its last.
//! Idle is the step less the union of the device's kernels on every stream, so a kernel
//! overlapped by another stream's is not a gap. The kernels counted are the ops: parsim's
//! waits for other ranks ([`PARSIM_WAIT_OP`]) cover time but are no op, as in its op timings.
//!
//! [`OpKey::HostGap`]: parsim_plan::op_timing::OpKey::HostGap

use super::classify::PARSIM_WAIT_OP;
use super::kineto::TraceFile;
use std::collections::BTreeMap;

/// Idle seconds and the kernels they fall between, summed over the file's devices and steps.
pub fn host_gaps(file: &TraceFile) -> (u64, f64) {
    let mut by_device: BTreeMap<&str, Vec<(f64, f64, bool)>> = BTreeMap::new();
    for k in &file.kernels {
        by_device.entry(k.device.as_str()).or_default().push((
            k.start_us,
            k.start_us + k.dur_us,
            k.name != PARSIM_WAIT_OP,
        ));
    }
    let (mut calls, mut idle_us) = (0u64, 0.0);
    for (device, mut spans) in by_device {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let own: Vec<(f64, f64)> = file
            .steps
            .iter()
            .filter(|s| s.pid == device)
            .map(|s| (s.start_us, s.end_us))
            .collect();
        let windows = if !own.is_empty() {
            own
        } else if !file.steps.is_empty() {
            file.steps.iter().map(|s| (s.start_us, s.end_us)).collect()
        } else {
            let end = spans.iter().map(|s| s.1).fold(f64::MIN, f64::max);
            vec![(spans[0].0, end)]
        };
        for (w0, w1) in windows {
            let inside: Vec<(f64, f64)> = spans
                .iter()
                .filter(|s| s.0 >= w0 && s.0 < w1)
                .map(|&(a, b, _)| (a, b.min(w1)))
                .collect();
            let ops = spans
                .iter()
                .filter(|s| s.0 >= w0 && s.0 < w1 && s.2)
                .count() as u64;
            if ops == 0 {
                continue;
            }
            calls += ops;
            idle_us += ((w1 - w0) - union_us(&inside)).max(0.0);
        }
    }
    (calls, idle_us * 1e-6)
}

/// The length of the union of spans sorted by start.
fn union_us(spans: &[(f64, f64)]) -> f64 {
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for &(a, b) in spans {
        current = match current {
            Some((c0, c1)) if a <= c1 => Some((c0, c1.max(b))),
            Some((c0, c1)) => {
                total += c1 - c0;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    total + current.map_or(0.0, |(c0, c1)| c1 - c0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overlapping spans count once: [0, 2] and [1, 3] cover 3; [5, 6] adds 1.
    #[test]
    fn the_union_counts_overlaps_once() {
        assert_eq!(union_us(&[(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]), 4.0);
        assert_eq!(union_us(&[]), 0.0);
    }
}
