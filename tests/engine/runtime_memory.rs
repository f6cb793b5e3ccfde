//! The runtime lines (src/memory/runtime.rs): the CUDA context, the cuBLAS workspace and NCCL's
//! buffers per process group, each worked out by hand from NCCL's defaults (github.com/NVIDIA/
//! nccl, src/init.cc: LL 8 x 512 x 8 x 16 B, LL128 120 x 640 x 8 x 8 B, Simple 4 MiB per
//! connection; p2p chunks of 128 KiB over the network and 512 KiB over NVLink, 8 steps, 2
//! channels a peer) and the profiles' `[runtime_memory]` figures.

use super::common::{est, resolve};
use parsim::config::Config;
use parsim::config::Layer;
use serde_json::json;

/// One LL, LL128 and Simple buffer: 524,288 + 4,915,200 + 4,194,304 bytes.
const SET: u64 = 9_633_792;
/// The sending side's LL128 and Simple buffers of a network connection.
const SEND: u64 = 4_915_200 + 4_194_304;
const MIB: u64 = 1 << 20;

/// A small dense model on `gpus` A100s with the given degrees (one node is 8 GPUs).
fn a100(gpus: u32, tp: u32, pp: u32) -> serde_json::Value {
    json!({
        "model": {"preset": "llama3-8b"},
        "cluster": {"gpu": "a100-80g", "num_gpus": gpus},
        "parallel": {"tp": tp, "pp": pp},
        "training": {"seq_length": 1024, "micro_batch_size": 1, "global_batch_size": 16,
                     "precision": "bf16"}
    })
}

#[test]
fn a_tp8_dp2_plan_holds_one_set_a_channel_in_its_node_and_both_sides_across() {
    // Two 8-GPU A100 nodes, TP 8 x DP 2. The TP ring lies in a node: 24 channels (the
    // profile's, NVIDIA/nccl#578) x one set. The DP ring joins the two nodes with one member
    // in each, so each rank's neighbours are both across the network: the receiving set and
    // the sending side's LL128 and Simple, on 2 channels per NIC (8 NICs, one a GPU) = 16.
    let e = est(a100(16, 8, 1));
    let m = &e.memory.stages[0];
    assert_eq!(m.nccl_buffers.tp, 24 * SET);
    assert_eq!(m.nccl_buffers.tp, 231_211_008);
    assert_eq!(m.nccl_buffers.dp, 16 * (SET + SEND));
    assert_eq!(m.nccl_buffers.dp, 299_892_736);
    assert_eq!(
        (m.nccl_buffers.pp, m.nccl_buffers.cp, m.nccl_buffers.ep),
        (0, 0, 0)
    );
    // The A100's lazy-loading context and Transformer Engine's pre-Hopper workspace.
    assert_eq!(m.cuda_context, 400 * MIB);
    assert_eq!(m.blas_workspace, 4 * MIB);
    // Counted in buffers, and in every total: one GPU alone holds no NCCL buffer at all.
    let runtime = m.cuda_context + m.blas_workspace + m.nccl_buffers.total();
    assert!(m.buffers >= runtime);
    let alone = est(a100(1, 1, 1));
    assert_eq!(alone.memory.stages[0].nccl_buffers.total(), 0);
}

#[test]
fn eager_module_loading_takes_the_measured_context_or_is_refused() {
    let mut c = a100(1, 1, 1);
    c["training"]["eager_module_loading"] = json!(true);
    // BigScience's 1573 MiB (train/tr11-176B-ml/chronicles-prequel.md).
    assert_eq!(est(c.clone()).memory.stages[0].cuda_context, 1573 * MIB);
    // No H100 measurement under eager loading: refused by name, not guessed.
    c["cluster"]["gpu"] = json!("h100-sxm");
    let cfg = Config::from_layers(&[Layer::overrides(c)]).expect("config loads");
    let err = parsim::config::Resolved::new(cfg).unwrap_err().to_string();
    assert!(err.contains("training.eager_module_loading"), "{err}");
}

#[test]
fn a_bloom_row_by_hand() {
    // Row 89: 195B, TP 4 PP 12 DP 8 on 384 A100s, Jean Zay's 4 NICs a node, the 2022 stack's
    // eager context. Megatron's rank order (tp-cp-ep-dp-pp): TP 4 in a node (24 channels); DP
    // strides 4, two members a node, so the ring enters each node through one of them (the
    // receiving set) on 2 x 4 NICs = 8 channels; PP strides 32 (across nodes): the previous and
    // next stage's p2p buffers, 2 channels x 128 KiB x 8 steps, each way.
    let rows = parsim::validate::bloom::rows().unwrap();
    let row = &rows[89];
    assert_eq!(row.model, "GPT 195B h12288 l106 a96");
    let r = resolve(row.setup.clone().unwrap());
    let lines = parsim::memory::RuntimeLines::of(&r);
    assert_eq!(lines.cuda_context, 1573 * MIB);
    assert_eq!(lines.blas_workspace, 4 * MIB);
    assert_eq!(lines.nccl.tp, 24 * SET);
    assert_eq!(lines.nccl.dp, 8 * SET);
    assert_eq!(lines.nccl.pp, 2 * 2 * 2 * 128 * 1024 * 8);
    assert_eq!((lines.nccl.cp, lines.nccl.ep), (0, 0));
}

#[test]
fn a_bridge_row_by_hand() {
    // GPT-OSS 120B on 64 H100s, EP 8 PP 4 (25.11). The expert all-to-all: 7 peers in the node,
    // 2 channels x 512 KiB x 8 steps each way; the experts' data-parallel group (64 / (8 x 4) =
    // 2, strided 8: one member a node) both network sides on 16 channels; DP 16 (ranks in
    // order: two nodes, 8 a node) the receiving set on 16; PP across nodes, p2p over the
    // network. The Hopper context figure and Transformer Engine's 32 MiB workspace.
    let rows = parsim::validate::megatron_bridge::rows().unwrap();
    let row = rows
        .iter()
        .find(|r| r.label.starts_with("25.11 GPT OSS 120B H100 x64"))
        .expect("the row");
    let r = resolve(row.setup.clone().unwrap());
    let lines = parsim::memory::RuntimeLines::of(&r);
    assert_eq!(lines.cuda_context, 400 * MIB);
    assert_eq!(lines.blas_workspace, 32 * MIB);
    assert_eq!(lines.nccl.tp, 0);
    assert_eq!(
        lines.nccl.ep,
        2 * 7 * 2 * 512 * 1024 * 8 + 16 * (SET + SEND)
    );
    assert_eq!(lines.nccl.dp, 16 * SET);
    assert_eq!(lines.nccl.pp, 2 * 2 * 2 * 128 * 1024 * 8);
}
