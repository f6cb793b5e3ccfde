//! NCCL's all-to-all across NVLink domains. NCCL has no all-to-all algorithm of its own: the
//! call is one grouped `ncclSend`/`ncclRecv` to every peer (NCCL's user guide,
//! "Point-to-point communication", its all-to-all example; nccl-tests src/alltoall.cu,
//! `AlltoAllRunColl`), and each pair runs on the transport between the two GPUs: NVLink (the
//! P2P transport, src/transport/p2p.cc) for a peer in the same domain, the network (src/
//! transport/net.cc, through the rail's NIC, via PXN where the rail is another GPU's) for the
//! others. Every GPU sends 1/n of its payload to each peer, so the bytes that cross the
//! network are the (n - k)/n bound for the n - k peers outside the domain, while the k - 1
//! inside ones move at NVLink rates at the same time: the call lasts as long as the slower
//! of the two shares.

use crate::config::Link;

/// Seconds of one all-to-all of `bytes` per rank over `n` ranks spread over `domains` NVLink
/// domains of equal share: the network share ((n - k)/n of the bytes at the inter-node link,
/// k = n / domains ranks a domain) and the NVLink share ((k - 1)/n at the intra link) run at
/// once, and the call lasts as long as the longer, after the network's latency. One rank a
/// domain is the flat exchange over the network ((n - 1)/n of the bytes).
pub fn all_to_all_s(bytes: f64, n: u32, domains: u32, intra: &Link, inter: &Link) -> f64 {
    let rate = |l: &Link| l.bandwidth_bytes_per_s * l.efficiency;
    let domains = domains.clamp(1, n.max(1));
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let k = f64::from(n) / f64::from(domains);
    let n = f64::from(n);
    if domains <= 1 {
        return intra.latency_s + (n - 1.0) / n * bytes / rate(intra);
    }
    let network_s = (n - k) / n * bytes / rate(inter);
    let nvlink_s = (k - 1.0) / n * bytes / rate(intra);
    inter.latency_s + network_s.max(nvlink_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(gb_s: f64, latency_s: f64) -> Link {
        Link {
            bandwidth_bytes_per_s: gb_s * 1e9,
            latency_s,
            efficiency: 1.0,
        }
    }

    /// By hand: 32 ranks on 4 nodes of 8 (Qwen3-235B's EP 32 on H100s), 1 GB a rank. 24 of
    /// the 32 slices go to the other nodes: 0.75 GB at 50 GB/s is 15 ms, against 7/32 GB at
    /// 450 GB/s (0.49 ms) on NVLink, so the network share sets the time: 15 ms after 10 us.
    /// The flat model charged 31/32 GB to the NIC, 19.375 ms.
    #[test]
    fn the_network_share_of_an_all_to_all_by_hand() {
        let (nvl, nic) = (link(450.0, 5e-6), link(50.0, 1e-5));
        let t = all_to_all_s(1e9, 32, 4, &nvl, &nic);
        assert!((t - (1e-5 + 0.75e9 / 50e9)).abs() < 1e-12, "{t}");
        let flat = 1e-5 + 31.0 / 32.0 * 1e9 / 50e9;
        assert!(t < flat);
    }

    /// One rank a domain is the flat exchange over the network; one domain is NVLink alone;
    /// and where NVLink is the slower link (an odd profile), its share sets the time.
    #[test]
    fn the_limits_are_the_flat_exchanges() {
        let (nvl, nic) = (link(450.0, 5e-6), link(50.0, 1e-5));
        let flat = 1e-5 + 15.0 / 16.0 * 1e9 / 50e9;
        assert!((all_to_all_s(1e9, 16, 16, &nvl, &nic) - flat).abs() < 1e-15);
        let node = 5e-6 + 7.0 / 8.0 * 1e9 / 450e9;
        assert!((all_to_all_s(1e9, 8, 1, &nvl, &nic) - node).abs() < 1e-15);
        // 2 domains of 8 with a 10 GB/s "NVLink": 7/16 GB at 10 GB/s beats 8/16 at 50.
        let slow = link(10.0, 5e-6);
        let t = all_to_all_s(1e9, 16, 2, &slow, &nic);
        assert!((t - (1e-5 + 7.0 / 16.0 * 1e9 / 10e9)).abs() < 1e-12, "{t}");
        assert_eq!(all_to_all_s(0.0, 16, 2, &nvl, &nic), 0.0);
        assert_eq!(all_to_all_s(1e9, 1, 1, &nvl, &nic), 0.0);
    }
}
