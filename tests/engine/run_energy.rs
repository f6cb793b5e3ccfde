//! The run's energy charges the hosts of the hardware the profile describes: its own nodes
//! (`gpus_per_node`), each with its system's power besides the GPUs (`power.host_w_per_node`,
//! from the vendor's datasheet), and the switch ports of one NIC per GPU; so the energy of a
//! run does not move when only `cluster.gpus_per_node` does. Every figure is worked by hand
//! from the datasheets, not read from the profiles.

use super::common::resolve;
use parsim::config::{GpuProfile, Resolved};
use parsim::estimate::estimate;
use parsim::planning::{host_power, run_forecast, RunForecast, Settings};
use serde_json::{json, Value};

/// The default PUE: Google's 2023 fleet-wide figure.
const PUE: f64 = 1.10;
/// One NIC's share of a two-tier fat tree: three ports of a 64-port NVIDIA Quantum-2 QM9700
/// at about 1,720 W (QM9700/QM9790 user manual, Specifications).
const NIC_W: f64 = 3.0 * 1720.0 / 64.0;
/// DGX H100: 10.2 kW maximum system power (DGX H100 datasheet) less 8 x 700 W GPUs.
const DGX_H100_HOST_W: f64 = 10_200.0 - 8.0 * 700.0;
/// GB200 NVL72: about 120 kW per rack (NVIDIA, GTC 2024) less 72 x 1,200 W GPUs, over its
/// 18 compute trays of 4 GPUs.
const GB200_TRAY_HOST_W: f64 = (120_000.0 - 72.0 * 1_200.0) / 18.0;

/// Llama-3-8B at TP 2 on `n` GPUs of `gpu`, training a billion tokens without failures (so
/// the wall time is training plus checkpoint stalls, and every stall runs at idle power).
fn run(gpu: &str, n: u32) -> Value {
    json!({"cluster": {"gpu": gpu, "num_gpus": n}, "parallel": {"tp": 2},
           "training": {"global_batch_size": n / 2, "seq_length": 2048},
           "run": {"train_tokens": 1_000_000_000u64, "failure_rate_per_gpu_hour": 0.0}})
}

fn report(r: &Resolved) -> RunForecast {
    let e = estimate(r).unwrap();
    run_forecast(r, &e).unwrap().unwrap()
}

/// The facility energy in MWh from the run's own wall time, training time and utilisation:
/// GPUs busy (idle + (TDP - idle) x utilisation) while training and idle while stalled, the
/// hosts over the whole wall time, all times the PUE.
fn energy_by_hand(run: &RunForecast, gpus: f64, (idle_w, tdp_w): (f64, f64), hosts_w: f64) -> f64 {
    let wall_s = run.wall_days * 86_400.0;
    let work_s = run.compute_days * 86_400.0;
    let busy_w = idle_w + (tdp_w - idle_w) * run.gpu_utilization;
    let gpu_j = gpus * (busy_w * work_s + idle_w * (wall_s - work_s));
    PUE * (gpu_j + hosts_w * wall_s) / 3.6e9
}

fn close(a: f64, b: f64) -> bool {
    ((a - b) / b).abs() < 1e-9
}

/// 16 H100s are two DGX H100s: 2 x 4,600 W of host and 16 NICs of switch ports, 10,490 W
/// (the figure before this change too). Saying 4 GPUs per node does not change the hardware,
/// so it charges the same two hosts.
#[test]
fn an_h100_run_charges_dgx_h100_hosts() {
    let r = resolve(run("h100-sxm", 16));
    let hosts = host_power(&r, &Settings::from_config(&r.config.run).unwrap());
    let by_hand = 2.0 * DGX_H100_HOST_W + 16.0 * NIC_W;
    assert!(close(by_hand, 10_490.0));
    assert!(close(hosts.total_w(), by_hand), "{hosts:?}");
    let rep = report(&r);
    let e = rep.energy_mwh.unwrap();
    // H100 board power: 700 W TDP (datasheet), 70 W idle (the profile's 10% assumption).
    assert!(
        close(e, energy_by_hand(&rep, 16.0, (70.0, 700.0), by_hand)),
        "{e}"
    );
    let mut fours = run("h100-sxm", 16);
    fours["cluster"]["gpus_per_node"] = json!(4);
    let r4 = resolve(fours);
    assert_eq!(r4.config.cluster.gpus_per_node, Some(4));
    let hosts4 = host_power(&r4, &Settings::from_config(&r4.config.run).unwrap());
    assert!(close(hosts4.total_w(), by_hand), "{hosts4:?}");
}

/// 256 GB200s are 64 trays of 4 (the profile's node since trays became the default): 64 x
/// (1,866.7 W of host + 4 NICs of switch ports) = 140,107 W, where the old default charged
/// 32 DGX H100 hosts of 8 (167,840 W). Saying 8 GPUs per node keeps the same 64 trays and,
/// with the same racks of 64 as NVLink domains, the same energy to the last bit.
#[test]
fn a_gb200_run_charges_its_trays_whatever_the_node_size_says() {
    let r = resolve(run("gb200", 256));
    assert_eq!(r.config.cluster.gpus_per_node, Some(4));
    let hosts = host_power(&r, &Settings::from_config(&r.config.run).unwrap());
    let by_hand = 64.0 * (GB200_TRAY_HOST_W + 4.0 * NIC_W);
    assert!(close(hosts.total_w(), by_hand), "{hosts:?}");
    assert_eq!((hosts.host_nodes, hosts.network_nodes), (64.0, 64.0));
    assert!(!close(
        hosts.total_w(),
        32.0 * (DGX_H100_HOST_W + 8.0 * NIC_W)
    ));
    let rep = report(&r);
    let e = rep.energy_mwh.unwrap();
    // GB200: about 1,200 W per GPU (NVIDIA, at launch), 120 W idle (the 10% assumption).
    assert!(
        close(e, energy_by_hand(&rep, 256.0, (120.0, 1200.0), by_hand)),
        "{e}"
    );

    let mut eights = run("gb200", 256);
    eights["cluster"]["gpus_per_node"] = json!(8);
    let r8 = resolve(eights);
    assert_eq!(r8.nvlink_domain.size, 64);
    let hosts8 = host_power(&r8, &Settings::from_config(&r8.config.run).unwrap());
    assert_eq!(hosts8, hosts);
    assert_eq!(report(&r8).energy_mwh, Some(e));
}

/// A host power given in `[run]` is the user's node, `cluster.gpus_per_node`; a profile that
/// gives none is charged DGX H100's 575 W per GPU, and the run says so.
#[test]
fn a_given_host_power_and_a_profile_without_one() {
    let mut given = run("gb200", 256);
    given["run"]["host_power_w_per_node"] = json!(2000.0);
    given["cluster"]["gpus_per_node"] = json!(8);
    let r = resolve(given);
    let hosts = host_power(&r, &Settings::from_config(&r.config.run).unwrap());
    assert_eq!((hosts.host_nodes, hosts.host_w_per_node), (32.0, 2000.0));
    assert_eq!(hosts.network_nodes, 64.0);

    let text = include_str!("../../calibration/h100-sxm.toml")
        .replace("host_w_per_node = 4600.0", "# host_w_per_node: not given");
    let gpu = GpuProfile::parse(&text, "user.toml").unwrap();
    assert_eq!(gpu.power.unwrap().host_w_per_node, None);
    let cfg = parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(run(
        "h100-sxm", 16,
    ))])
    .unwrap();
    let r = Resolved::with_gpu(cfg, gpu).unwrap();
    let hosts = host_power(&r, &Settings::from_config(&r.config.run).unwrap());
    // 575 W per GPU over the profile's node of 8: DGX H100's 4,600 W.
    assert!(close(hosts.host_w_per_node, DGX_H100_HOST_W));
    let note = hosts.note.unwrap();
    assert!(
        note.contains("power.host_w_per_node") && note.contains("575 W per GPU"),
        "{note}"
    );
    assert!(report(&r).notes.contains(&note));
}

/// Every shipped GPU profile gives its node's host power with its source, and a negative
/// one is refused naming the field.
#[test]
fn host_power_is_a_profile_figure_with_a_source() {
    for name in GpuProfile::shipped_names() {
        let p = GpuProfile::load(name).unwrap();
        let Some(power) = p.power else { continue };
        assert!(power.host_w_per_node.is_some(), "{name}");
        assert!(p.provenance.contains_key("host_w_per_node"), "{name}");
    }
    let text = include_str!("../../calibration/h100-sxm.toml")
        .replace("host_w_per_node = 4600.0", "host_w_per_node = -1.0");
    let e = GpuProfile::parse(&text, "bad.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("power.host_w_per_node"), "{e}");
}
