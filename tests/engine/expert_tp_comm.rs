//! The expert-TP all-gather and reduce-scatter of MoE layers (Megatron-Core's
//! `MoEAlltoAllTokenDispatcher`: "AG(TP)" of the received rows after the EP all-to-all,
//! "RS(TP)" of the experts' outputs before the combine's, and their mirrors in the backward)
//! against a hand count, and expert TP 1 against the same model with none.

use super::common::{est, group_info};
use parsim::layout::GroupKind;
use parsim::model::CommKind;
use serde_json::{json, Value};

/// 2 MoE layers of 8 experts (top-2, ffn 64, hidden 64), the hottest expert at twice its share,
/// seq 32, bf16, no recomputation; 4 GPUs as tp 2 + SP x dp 2 with ep 2 and expert TP `etp`
/// (16 microbatches of 1 over dp 2: 8 a rank).
fn moe(etp: u32) -> Value {
    json!({
        "model": {
            "num_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
            "num_query_groups": 4, "ffn_hidden_size": 128, "vocab_size": 128,
            "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 64,
            "moe_load_imbalance": 2.0
        },
        "cluster": {"gpu": "h100-sxm", "num_gpus": 4, "gpus_per_node": 8},
        "parallel": {"tp": 2, "sp": true, "expert_tp": etp, "pp": 1, "ep": 2},
        "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 16,
                     "precision": "bf16", "recompute": "none"}
    })
}

#[test]
fn expert_tp_2_sends_the_gathered_rows_four_times_a_layer() {
    // A rank routes its SP shard, 32 / 2 = 16 tokens x top-2 = 32 rows; its EP rank holds
    // 8 / 2 = 4 experts, so the hottest expert at 2x makes it receive
    // 32 x (1 + (2 - 1) / 4) = 40 rows (docs/engine.md, MoE load). The expert-TP all-gather's
    // output is both members' rows, 2 x 40 = 80 rows of 64 bf16 = 10240 bytes, and a ring
    // all-gather or reduce-scatter sends (n - 1)/n of it: 5120 bytes. Four a layer (forward
    // all-gather and reduce-scatter, backward the mirror), 2 layers, 8 microbatches:
    // 5120 x 4 x 2 x 8 = 327680 bytes a step.
    let e = est(moe(2));
    assert_eq!(
        e.communication.per_step_bytes_per_gpu[CommKind::ExpertTp],
        327_680
    );
    let g = group_info(&e, GroupKind::ExpertTp);
    assert_eq!((g.size, g.crosses_nodes), (2, false));
    // Not overlapped: what it sends takes time on the critical path.
    assert!(e.time.exposed_comm_by_group_s[CommKind::ExpertTp] > 0.0);
}

#[test]
fn expert_tp_1_sends_nothing_and_moves_no_other_figure() {
    // Expert TP 1 under TP 2 folds the experts (MoE Parallel Folding) and runs each expert
    // whole on its own rows: no expert-TP traffic. The same model at expert TP 2 differs in the
    // experts' sharding; what else they share must not move. Against expert TP 2 the EP
    // all-to-all's bytes are the same (each rank dispatches its own 32 rows either way).
    let one = est(moe(1));
    let two = est(moe(2));
    let b1 = one.communication.per_step_bytes_per_gpu;
    let b2 = two.communication.per_step_bytes_per_gpu;
    assert_eq!(b1[CommKind::ExpertTp], 0);
    assert_eq!(one.time.exposed_comm_by_group_s[CommKind::ExpertTp], 0.0);
    assert_eq!(
        (
            b1[CommKind::Tp],
            b1[CommKind::Cp],
            b1[CommKind::Pp],
            b1[CommKind::Ep]
        ),
        (
            b2[CommKind::Tp],
            b2[CommKind::Cp],
            b2[CommKind::Pp],
            b2[CommKind::Ep]
        )
    );
    let g = group_info(&one, GroupKind::ExpertTp);
    assert_eq!(g.size, 1);
}
