//! What nccl_busbw.rs and nccl_latency.rs share: the systems of
//! calibration/data/nccl-tests.json as NCCL fabrics, its collective names, and one entry's
//! prediction by NCCL's tuning model (the algorithm the run forced, else NCCL's choice).

use parsim::model::CollectiveKind;
use parsim::network::nccl::{Algorithm, CollectiveModel, Fabric, Prediction};
use serde_json::Value;

/// The fabric of a data file `system`.
pub fn fabric(system: &str) -> Fabric {
    match system {
        "dgx-h100" => Fabric::dgx_h100(),
        "dgx-a100" => Fabric::dgx_a100(),
        // The same node with four HDR NICs (nccl-tests issue 119's servers).
        "a100-4nic" => Fabric {
            nics_per_node: 4,
            ..Fabric::dgx_a100()
        },
        // Four H100 SXM per node, four 200 Gb/s NICs (nccl-tests issue 252); no NVSwitch
        // assumed (the run forces the ring, which does not use it).
        "hgx-h100-4gpu-4nic" => Fabric {
            nvls: false,
            nics_per_node: 4,
            nic_bytes_per_s: 25.0e9,
            ..Fabric::dgx_h100()
        },
        // Crusoe's A100-80GB SXM VMs: the HGX A100 node, 8 HDR HCAs (mlx5_1..mlx5_8).
        "a100-80gb-8hdr" => Fabric::dgx_a100(),
        other => panic!("unknown system {other}"),
    }
}

pub fn collective(name: &str) -> CollectiveKind {
    match name {
        "all_reduce" => CollectiveKind::AllReduce,
        "all_gather" => CollectiveKind::AllGather,
        "reduce_scatter" => CollectiveKind::ReduceScatter,
        c => panic!("unknown collective {c}"),
    }
}

/// `NCCL_ALGO` as the data file records it (null: NCCL chooses).
pub fn forced(v: &Value) -> Option<Algorithm> {
    match v["nccl_algo"].as_str() {
        None => None,
        Some("RING") => Some(Algorithm::Ring),
        Some("TREE") => Some(Algorithm::Tree),
        Some("NVLS") => Some(Algorithm::Nvls),
        Some(a) => panic!("unknown NCCL_ALGO {a}"),
    }
}

/// The model's prediction of `entry` (its collective, GPUs, nodes, system and forced
/// algorithm) at `bytes`.
pub fn predict(entry: &Value, bytes: f64) -> Prediction {
    let coll = collective(entry["collective"].as_str().unwrap());
    let n = entry["gpus"].as_u64().unwrap() as u32;
    let nodes = entry["nodes"].as_u64().unwrap() as u32;
    let model = CollectiveModel::new(&fabric(entry["system"].as_str().unwrap()), coll, n, nodes);
    match forced(entry) {
        Some(a) => model.predict_with(bytes, a),
        None => model.predict(bytes),
    }
    .expect("modelled collective")
}
