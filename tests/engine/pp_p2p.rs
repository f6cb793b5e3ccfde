//! `parallel.pp_p2p`: DeepSpeed's pipeline engine blocks on its sends and receives by default
//! (deepspeed/runtime/pipe/engine.py runs `_exec_send_activations` ... `_exec_recv_grads` as
//! blocking `p2p.send` / `p2p.recv` instructions between its compute instructions), the other
//! frameworks overlap them; an explicit setting wins; a blocking hop is busy time of the two
//! stages at its ends, not a delay on the way.

use super::common::{est, resolve};
use parsim::config::{Config, Layer, PpP2p};
use parsim::estimate::pipeline;
use parsim::model::CommKind;
use serde_json::{json, Value};

/// Llama-3-8B over 4 pipeline stages of 8 GPUs each (TP `tp`) under `framework`.
fn cfg(framework: &str, tp: u32, sp: bool) -> Value {
    json!({
        "model": {"preset": "llama3-8b"},
        "cluster": {"num_gpus": 4 * tp},
        "parallel": {"tp": tp, "sp": sp, "pp": 4},
        "training": {"framework": framework, "global_batch_size": 16},
    })
}

fn mode(v: Value) -> PpP2p {
    let r = resolve(v);
    r.config.parallel.pp_p2p_under(r.config.training.framework)
}

#[test]
fn deepspeed_blocks_by_default_and_an_explicit_setting_wins() {
    assert_eq!(mode(cfg("deepspeed", 1, false)), PpP2p::Blocking);
    assert_eq!(mode(cfg("megatron-core", 1, false)), PpP2p::Overlapped);
    assert_eq!(mode(cfg("fsdp", 1, false)), PpP2p::Overlapped);
    let mut v = cfg("deepspeed", 1, false);
    v["parallel"]["pp_p2p"] = json!("overlapped");
    assert_eq!(mode(v.clone()), PpP2p::Overlapped);
    let overrides = est(v).framework_overrides;
    assert!(
        overrides
            .iter()
            .any(|o| o.starts_with("parallel.pp_p2p = \"overlapped\"")),
        "{overrides:?}"
    );
    // Setting the framework's own default is no override.
    let mut v = cfg("deepspeed", 1, false);
    v["parallel"]["pp_p2p"] = json!("blocking");
    assert!(est(v).framework_overrides.is_empty());
    // The framework named in a later layer than the setting: the setting still wins.
    let layers = [
        Layer::overrides(json!({"parallel": {"pp_p2p": "overlapped"}})),
        Layer::overrides(json!({"training": {"framework": "deepspeed"}})),
    ];
    let c = Config::from_layers(&layers).unwrap();
    assert_eq!(
        c.parallel.pp_p2p_under(c.training.framework),
        PpP2p::Overlapped
    );
}

#[test]
fn a_bad_value_is_refused_naming_the_field() {
    let mut v = cfg("megatron-core", 1, false);
    v["parallel"]["pp_p2p"] = json!("async");
    let err = Config::from_layers(&[Layer::overrides(v)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("pp_p2p"), "{err}");
}

/// Without TP the blocking hop is the overlapped one (same bytes, same link), moved into the
/// sender's forward and the receiver's input-gradient backward: F'[s] = F[s] + hop(s) for
/// every stage with a next one, I'[s] = I[s] + hop(s - 1) for every stage with a previous
/// one, and the simulator's hops cost nothing. The step is no shorter, and the moved seconds
/// show as exposed pipeline communication.
#[test]
fn a_blocking_hop_is_busy_time_at_both_ends() {
    let overlapped = resolve(cfg("megatron-core", 1, false));
    let mut v = cfg("megatron-core", 1, false);
    v["parallel"]["pp_p2p"] = json!("blocking");
    let blocking = resolve(v.clone());
    let (_, o) = pipeline(&overlapped).unwrap();
    let (_, b) = pipeline(&blocking).unwrap();
    let n = o.num_stages();
    assert!(o.hop(0) > 0.0);
    assert_eq!(b.p2p_latency, 0.0);
    assert!(b.hop_transfer.iter().all(|&x| x == 0.0));
    for s in 0..n {
        let sent = if s + 1 < n { o.hop(s as u32) } else { 0.0 };
        let received = if s > 0 { o.hop(s as u32 - 1) } else { 0.0 };
        assert!(
            (b.forward[s] - o.forward[s] - sent).abs() < 1e-12,
            "stage {s}"
        );
        assert!(
            (b.input_grad[s] - o.input_grad[s] - received).abs() < 1e-12,
            "stage {s}"
        );
        assert_eq!(b.weight_grad[s], o.weight_grad[s]);
    }
    let (eo, eb) = (est(cfg("megatron-core", 1, false)), est(v));
    assert!(
        eb.time.step_s >= eo.time.step_s,
        "{} vs {}",
        eb.time.step_s,
        eo.time.step_s
    );
    assert!(
        eb.time.exposed_comm_by_group_s[CommKind::Pp]
            > eo.time.exposed_comm_by_group_s[CommKind::Pp]
    );
}

/// With TP and no sequence parallelism both blocking engines split the activation over the
/// TP ranks before the pipeline send and all-gather it after (2021 Megatron-LM's
/// scatter/gather, Narayanan et al. 2021 Section 4.1; DeepSpeed's `pipe_partitioned`): the
/// inter-node link carries 1/8 of the bytes, so a blocking hop between nodes costs less
/// than the overlapped hop of the whole activation. With sequence parallelism the activation
/// sent is already the 1/t shard and the blocking hop is the overlapped one.
#[test]
fn blocking_hops_scatter_and_gather_over_tp() {
    let hops = |tp: u32, sp: bool| {
        let o = pipeline(&resolve(cfg("megatron-core", tp, sp))).unwrap().1;
        let b = pipeline(&resolve(cfg("deepspeed", tp, sp))).unwrap().1;
        (o.hop(0), b.forward[0] - o.forward[0])
    };
    let (overlapped, blocking) = hops(8, false);
    assert!(
        blocking > 0.0 && blocking < overlapped,
        "{blocking} vs {overlapped}"
    );
    let (overlapped, blocking) = hops(8, true);
    assert!(
        (blocking - overlapped).abs() < 1e-12,
        "{blocking} vs {overlapped}"
    );
}
