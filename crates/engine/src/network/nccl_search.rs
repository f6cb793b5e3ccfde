//! NCCL's topology search (NVIDIA/nccl `src/graph/search.cc`, `ncclTopoCompute`) reduced to
//! what its tuning model reads: how many channels a graph gets and the GB/s each channel is
//! given. NCCL tries per-channel speeds from fixed lists (its `speedArray`s), keeps the graph of
//! most channels x speed that the links carry, doubles fast graphs into twice the channels at
//! half the speed (`ncclTopoDupChannels`), then raises the speed while the channels still fit.
//! The lists and rules are NCCL's, so bus bandwidths come out quantised as NCCL's do: 12 rings
//! x 30 GB/s = 360 GB/s on 8 H100s, 8 NVLS channels x 40 GB/s on the same node.

use crate::config::NcclArch as Arch;

/// One graph as the tuning model sees it: channels and GB/s per channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Graph {
    pub channels: u32,
    pub bw_gbps: f64,
}

impl Graph {
    /// Channels x per-channel speed: the bus bandwidth before protocol overheads.
    pub fn bus_gbps(&self) -> f64 {
        self.channels as f64 * self.bw_gbps
    }
}

/// search.cc `speedArrayIntra` / `sm90SpeedArrayIntra` (GB/s per channel inside a node).
const SPEED_INTRA_SM80: [f64; 13] = [
    40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
];
const SPEED_INTRA_SM90: [f64; 11] = [
    60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0,
];
/// search.cc `speedArrayInter` / `sm90SpeedArrayInter` (GB/s per channel across nodes).
const SPEED_INTER_SM80: [f64; 19] = [
    48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
    0.24, 0.12,
];
const SPEED_INTER_SM90: [f64; 17] = [
    48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
    0.12,
];
/// search.cc `sm100SpeedArrayIntra` / `sm100SpeedArrayInter` (Blackwell, GB/s per channel).
const SPEED_INTRA_SM100: [f64; 12] = [
    90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0,
];
const SPEED_INTER_SM100: [f64; 20] = [
    96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
    2.4, 1.2, 0.24, 0.12,
];
/// init.cc: `ringGraph->maxChannels = MAXCHANNELS / 2` with `MAXCHANNELS` 64.
const MAX_CHANNELS: u32 = 32;
/// device.h `NCCL_MAX_NVLS_ARITY`: at most this many NVLS heads (channels).
const MAX_NVLS_ARITY: u32 = 32;
/// Slack for comparing sums of decimal speeds.
const EPS: f64 = 1e-9;

fn speeds(arch: Arch, inter: bool) -> &'static [f64] {
    match (arch, inter) {
        (Arch::Ampere, false) => &SPEED_INTRA_SM80,
        (Arch::Hopper, false) => &SPEED_INTRA_SM90,
        (Arch::Ampere, true) => &SPEED_INTER_SM80,
        (Arch::Hopper, true) => &SPEED_INTER_SM90,
        (Arch::Blackwell, false) => &SPEED_INTRA_SM100,
        (Arch::Blackwell, true) => &SPEED_INTER_SM100,
    }
}

/// How many channels of `speed` GB/s fit in `capacity` GB/s.
fn fit(capacity: f64, speed: f64) -> u32 {
    (capacity / speed + EPS).floor().max(0.0) as u32
}

/// Pass 1: from the fastest speed one path carries (`max_bw`), keep the speed of most channels
/// x speed; stop at a perfect fit (`total_bw`) or once the next speed is under 0.49 of the best.
fn first_pass(
    list: &[f64],
    max_bw: f64,
    total_bw: f64,
    channels_at: impl Fn(f64) -> u32,
) -> Option<Graph> {
    let mut i = list
        .iter()
        .position(|&s| s <= max_bw + EPS)
        .unwrap_or(list.len() - 1);
    let mut best: Option<Graph> = None;
    loop {
        let speed = list[i];
        let channels = channels_at(speed).min(MAX_CHANNELS);
        let bus = channels as f64 * speed;
        if channels > 0 && best.is_none_or(|b| bus > b.bus_gbps() + EPS) {
            best = Some(Graph {
                channels,
                bw_gbps: speed,
            });
        }
        if best.is_some_and(|b| b.bus_gbps() >= total_bw - EPS) {
            return best;
        }
        match list.get(i + 1) {
            Some(&next) if best.is_none_or(|b| next / b.bw_gbps > 0.49) => i += 1,
            _ => return best,
        }
    }
}

/// `ncclTopoDupChannels`: a graph of 25 GB/s channels or more becomes twice the channels at
/// half the speed, except after Ampere (NCCL's `ccMin > 80`) when it already has more than 4
/// channels under 50 GB/s.
fn dup_channels(arch: Arch, g: Graph) -> Graph {
    if g.bw_gbps < 25.0 || (arch != Arch::Ampere && g.bw_gbps < 50.0 && g.channels > 4) {
        return g;
    }
    let channels = (2 * g.channels).min(MAX_CHANNELS);
    Graph {
        channels,
        bw_gbps: g.bw_gbps / channels.div_ceil(g.channels) as f64,
    }
}

/// Pass 2 for rings: keep at least the channels found and raise the speed while they fit.
fn second_pass(list: &[f64], mut g: Graph, channels_at: impl Fn(f64) -> u32) -> Graph {
    let mut i = list
        .iter()
        .position(|&s| s <= g.bw_gbps + EPS)
        .unwrap_or(list.len() - 1);
    while i > 0 {
        i -= 1;
        let speed = list[i];
        let channels = channels_at(speed).min(MAX_CHANNELS);
        if channels < g.channels || channels as f64 * speed <= g.bus_gbps() + EPS {
            break;
        }
        g = Graph {
            channels,
            bw_gbps: speed,
        };
    }
    g
}

/// The ring graph inside one node of GPUs with `link_gbps` of NVLink each to the NVSwitch:
/// every channel crosses each GPU's link once.
pub fn ring_intra(arch: Arch, link_gbps: f64) -> Graph {
    let list = speeds(arch, false);
    let channels_at = |s: f64| fit(link_gbps, s);
    let found = first_pass(list, link_gbps, link_gbps, channels_at).unwrap_or(Graph {
        channels: 1,
        bw_gbps: link_gbps,
    });
    second_pass(list, dup_channels(arch, found), channels_at)
}

/// The ring graph across nodes with `nics` NICs of `nic_gbps` per node and `ppn` GPUs per node
/// (rail rings: a channel enters and leaves the node through a NIC and crosses the NVLink of
/// the node's other GPUs, so each GPU's link carries (ppn-1)/ppn of every channel).
pub fn ring_inter(arch: Arch, nics: u32, nic_gbps: f64, ppn: f64, link_gbps: f64) -> Graph {
    let list = speeds(arch, true);
    let nvlink_share = (ppn - 1.0).max(0.0) / ppn;
    let channels_at = |s: f64| {
        let by_nics = nics * fit(nic_gbps, s);
        if nvlink_share > 0.0 {
            by_nics.min(fit(link_gbps, s * nvlink_share))
        } else {
            by_nics
        }
    };
    let total = if nvlink_share > 0.0 {
        link_gbps
    } else {
        nics as f64 * nic_gbps
    };
    let found = first_pass(list, nic_gbps, total, channels_at).unwrap_or(Graph {
        channels: nics.max(1),
        bw_gbps: nic_gbps.min(*list.last().expect("non-empty")),
    });
    second_pass(list, dup_channels(arch, found), channels_at)
}

/// The NVLink SHARP graph of `ppn` GPUs on one NVSwitch node: one channel (head) per GPU, all
/// forced (`minChannels = maxChannels`); each channel takes its speed on every GPU's link and
/// twice on its head's, so each link carries (ppn + 1) x speed. None below two GPUs.
pub fn nvls(arch: Arch, ppn: u32, link_gbps: f64) -> Option<Graph> {
    if ppn < 2 {
        return None;
    }
    let channels = ppn.min(MAX_NVLS_ARITY);
    let n = channels as f64;
    // NVLS does not close a ring, so the search grants it n/(n-1) of the links' total.
    let total = link_gbps * n / (n - 1.0);
    speeds(arch, false)
        .iter()
        .filter(|&&s| s <= link_gbps + EPS && s * n <= total + EPS)
        .find(|&&s| (n + 1.0) * s <= link_gbps + EPS)
        .map(|&s| Graph {
            channels,
            bw_gbps: s,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked by hand from search.cc on 8 H100s (18 NVLink4 x 20.6 GB/s = 370.8 GB/s a GPU):
    /// pass 1 keeps 6 rings x 60 (360; 7 x 50 = 350 and 9 x 40 = 360 are not better, 24/60 is
    /// under 0.49), dup gives 12 x 30, and 12 x 40 = 480 does not fit.
    #[test]
    fn ring_on_eight_h100s_is_twelve_channels_of_thirty() {
        let g = ring_intra(Arch::Hopper, 18.0 * 20.6);
        assert_eq!(
            g,
            Graph {
                channels: 12,
                bw_gbps: 30.0
            }
        );
    }

    /// 8 A100s (12 NVLink3 x 20 GB/s = 240): 6 x 40 = 240 is a perfect fit, dup gives 12 x 20.
    #[test]
    fn ring_on_eight_a100s_is_twelve_channels_of_twenty() {
        let g = ring_intra(Arch::Ampere, 12.0 * 20.0);
        assert_eq!(g.channels, 12);
        assert_eq!(g.bw_gbps, 20.0);
    }

    /// NVLS on 8 H100s: 60 and 50 fail (9 x 50 = 450 > 370.8), 40 fits (360): 8 x 40 GB/s.
    /// On 4 GPUs 5 x 60 = 300 fits; one GPU has no NVLS graph.
    #[test]
    fn nvls_heads_weigh_twice_on_their_own_link() {
        let link = 18.0 * 20.6;
        assert_eq!(
            nvls(Arch::Hopper, 8, link),
            Some(Graph {
                channels: 8,
                bw_gbps: 40.0
            })
        );
        assert_eq!(nvls(Arch::Hopper, 4, link).unwrap().bw_gbps, 60.0);
        assert_eq!(nvls(Arch::Hopper, 1, link), None);
    }

    /// One NVL72 rack by hand (18 NVLink 5 links x 40.1 GB/s = 721.8 GB/s a GPU, SM100 lists):
    /// NVLS has 72 heads capped at 32, and 33 x speed must fit 721.8, so 20 GB/s (21.9 is not
    /// a listed speed); the ring keeps 8 x 90 (720; nothing from 80 to 45 is better and 40 is
    /// under 0.49 of 90), duplicated into 16 x 45 (50 GB/s would fit only 14 channels).
    #[test]
    fn nvl72_rack_graphs_by_hand() {
        let link = 18.0 * 40.1;
        assert_eq!(
            nvls(Arch::Blackwell, 72, link),
            Some(Graph {
                channels: 32,
                bw_gbps: 20.0
            })
        );
        assert_eq!(
            ring_intra(Arch::Blackwell, link),
            Graph {
                channels: 16,
                bw_gbps: 45.0
            }
        );
        // Eight Blackwell GPUs (an HGX B200/B300 node, or 8 GPUs of a rack): 9 x 80 = 720 fits.
        assert_eq!(nvls(Arch::Blackwell, 8, link).unwrap().bw_gbps, 80.0);
    }

    /// Across nodes a channel is bounded by a NIC: HDR (25 GB/s) gets 24 per NIC on A100 (the
    /// "~24 GB/s per NIC" NCCL's maintainers quote), NDR (50 GB/s) 48 on H100, and one GPU
    /// with one NDR NIC is duplicated into 2 x 24.
    #[test]
    fn inter_node_channels_follow_the_nics() {
        let a = ring_inter(Arch::Ampere, 4, 25.0, 8.0, 240.0);
        assert_eq!(a.bus_gbps(), 96.0);
        let h = ring_inter(Arch::Hopper, 8, 50.0, 8.0, 370.8);
        assert_eq!(
            h,
            Graph {
                channels: 8,
                bw_gbps: 48.0
            }
        );
        let one = ring_inter(Arch::Hopper, 1, 50.0, 1.0, 370.8);
        assert_eq!(
            one,
            Graph {
                channels: 2,
                bw_gbps: 24.0
            }
        );
    }
}
