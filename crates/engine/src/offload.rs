//! Activation offloading (`training.offload_activation_layers`; Megatron-Core's
//! `--cpu-offloading --cpu-offloading-num-layers N`, activations only), through Transformer
//! Engine's `get_cpu_offload_context`: the saved tensors of the first N decoder layers are
//! copied to host memory after each layer's forward, on a side stream while the next layer
//! runs, and copied back while the layer above runs its backward (TE's double-buffered group
//! offload handler keeps one layer in flight beside the one computing).
//!
//! Memory: the offloaded layers' saved sets leave the GPU but for the layer still in flight
//! when only one other layer follows it; host memory holds them. Time: each copy takes
//! latency + bytes / (link bandwidth x efficiency) over the profile's host link
//! (`links.host`: PCIe, or NVLink-C2C on Grace systems) and is hidden behind the next
//! layer's forward (the layer above's backward) as far as that lasts.

use crate::config::{Link, Resolved};
use crate::model::{ChunkContents, LedgerSummary};

/// The decoder layers of some chunks, per microbatch: saved bytes, count, forward and
/// backward seconds (summed over the layers).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Layers {
    pub saved_bytes: u64,
    pub count: u64,
    pub fwd_s: f64,
    pub bwd_s: f64,
}

impl Layers {
    /// The layers among `chunks`' blocks (not the embedding, output or MTP blocks).
    pub fn of(s: &LedgerSummary, chunks: &[ChunkContents]) -> Layers {
        let mut l = Layers::default();
        for c in chunks {
            for (b, n) in c.blocks(s) {
                let ends = std::ptr::eq(b, &s.embedding)
                    || std::ptr::eq(b, &s.output)
                    || s.mtp.as_ref().is_some_and(|m| std::ptr::eq(b, m));
                if ends || n == 0 {
                    continue;
                }
                let t = &b.times;
                l.saved_bytes += b.saved * n;
                l.count += n;
                l.fwd_s += n as f64 * (t.fwd_s + t.exposed_fwd_s());
                l.bwd_s += n as f64 * (t.dgrad_s + t.recompute_s + t.wgrad_s + t.exposed_bwd_s());
            }
        }
        l
    }

    /// One layer's saved bytes, on average.
    pub fn mean_saved_bytes(&self) -> u64 {
        self.saved_bytes.checked_div(self.count).unwrap_or(0)
    }
}

/// Offloaded layers whose saved sets are off the GPU at the activation peak: all `offloaded`
/// of the model's `layers` but the one still in flight while fewer than two layers follow
/// the offloaded ones (TE's double buffer: the copy of the last offloaded layer overlaps
/// the next layer's forward).
pub fn off_gpu_layers(layers: u32, offloaded: u32) -> u32 {
    if offloaded == 0 {
        return 0;
    }
    let resident = layers.saturating_sub(offloaded);
    offloaded.saturating_sub(2u32.saturating_sub(resident))
}

/// Seconds of one copy of `bytes` over `link`.
pub fn copy_s(link: &Link, bytes: u64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    link.latency_s + bytes as f64 / (link.bandwidth_bytes_per_s * link.efficiency)
}

/// Exposed seconds of one microbatch's offload copies (forward, backward) on a rank holding
/// `l`: each of the offloaded layers' copies out and back, less the next layer's forward and
/// the layer above's backward it overlaps. Zero without offloading or a host link.
pub fn exposed_s(r: &Resolved, l: &Layers) -> (f64, f64) {
    let n = r.config.training.offload_activation_layers;
    let Some(link) = r.gpu.links.host.as_ref() else {
        return (0.0, 0.0);
    };
    if n == 0 || l.count == 0 {
        return (0.0, 0.0);
    }
    let copy = copy_s(link, l.mean_saved_bytes());
    let per_layer = |s: f64| s / l.count as f64;
    let n = n as f64;
    (
        n * (copy - per_layer(l.fwd_s)).max(0.0),
        n * (copy - per_layer(l.bwd_s)).max(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_double_buffer_keeps_one_layer_when_one_follows() {
        // 24 layers, 10 offloaded: all 10 leave (14 follow them).
        assert_eq!(off_gpu_layers(24, 10), 10);
        // 23 offloaded: one layer follows, so the last offloaded one is still in flight.
        assert_eq!(off_gpu_layers(24, 23), 22);
        assert_eq!(off_gpu_layers(24, 0), 0);
    }

    #[test]
    fn a_copy_is_latency_plus_bytes_over_the_achieved_bandwidth() {
        // 64 GB/s at 0.8: 1 GB takes 1e9 / 51.2e9 s after 10 us.
        let link = Link {
            bandwidth_bytes_per_s: 64e9,
            latency_s: 1e-5,
            efficiency: 0.8,
        };
        let s = copy_s(&link, 1_000_000_000);
        assert!((s - (1e-5 + 1.0 / 51.2)).abs() < 1e-12, "{s}");
        assert_eq!(copy_s(&link, 0), 0.0);
    }
}
