//! LoRA fine-tuning executed (Hu et al. 2021) on the small Llama-style model (RMSNorm, SwiGLU,
//! rotary, GQA), adapters of rank 4 with alpha 16 on every target the engine knows (qkv, proj,
//! fc1, fc2), B drawn from the seed so the adapters act from the first step: every parallel mix
//! matches the single-rank run (loss after one step, parameters after three, 1e-5 relative;
//! the frozen base weights bit for bit equal to their initial values), and every rank's peak
//! memory lies within 2% of the engine's prediction.

use super::common::*;
use super::equivalence::{compare, GBS};
use parsim_plan::plan::Plan;
use parsim_plan::run_report::RunReport;
use parsim_plan::GroupKind;
use serde_json::{json, Value};

/// The small model with LoRA adapters of rank 4, alpha 16, on `targets`.
fn lora(mix: &Mix, targets: &[&str]) -> Value {
    let mut v = config(mix, GBS, true, "rmsnorm", "swiglu");
    v["training"]["mode"] = "lora".into();
    v["training"]["lora"] = json!({"rank": 4, "alpha": 16.0, "targets": targets});
    v
}

const ALL: [&str; 4] = ["qkv", "proj", "fc1", "fc2"];

/// The plan of `v` with B seeded (nonzero), so that the test cannot pass with an adapter path
/// that does nothing.
fn seeded(v: Value) -> parsim_plan::plan::Plan {
    let mut p = plan(v);
    p.lora.as_mut().expect("lora plan").seeded_b = true;
    p
}

/// LoRA's contract on `reference` (a LoRA run of three steps): against `frozen` (the model
/// trained in full for one step at lr 0, so its initial parameters: Adam's update, weight
/// decay included, is scaled by lr) every base weight keeps its initial bits and the
/// parameters are the base plus the adapters; against `untrained` (the LoRA plan at lr 0)
/// every adapter tensor trained, and the adapters changed the model's first loss. Returns the
/// adapters' names.
fn check_lora_contract(
    reference: &RunReport,
    mut frozen: Plan,
    mut untrained: Plan,
) -> Vec<String> {
    let rp = reference.params.as_ref().expect("params");
    frozen.adam.lr = 0.0;
    let init = run(&frozen, 1);
    let ip = init.params.as_ref().expect("params");
    for (name, want) in ip {
        assert_eq!(&rp[name], want, "{name}: a frozen base weight moved");
    }
    let adapters: Vec<String> = rp
        .keys()
        .filter(|k| k.contains("_lora_"))
        .cloned()
        .collect();
    assert_eq!(rp.len(), ip.len() + adapters.len());
    untrained.adam.lr = 0.0;
    let before = run(&untrained, 1);
    let bp = before.params.as_ref().expect("params");
    for name in &adapters {
        let moved = rel_diff(&rp[name], &bp[name]);
        assert!(moved > 1e-4, "{name} did not train ({moved:e})");
    }
    let l0 = (reference.loss[0] - init.loss[0]).abs();
    assert!(l0 > 1e-4, "the adapters did not act on the loss ({l0:e})");
    adapters
}

/// Each mix's three-step run against `reference` by `cmp`, printing its loss and worst
/// parameter difference.
fn compare_mixes<M>(
    mixes: impl IntoIterator<Item = (String, M)>,
    plan_of: impl Fn(&M) -> Plan,
    reference: &RunReport,
    cmp: fn(&str, &RunReport, &RunReport),
) {
    let rp = reference.params.as_ref().expect("params");
    for (name, mix) in mixes {
        let got = run(&plan_of(&mix), 3);
        cmp(&name, &got, reference);
        let gp = got.params.as_ref().expect("params");
        let worst = rp
            .iter()
            .map(|(k, want)| rel_diff(&gp[k], want))
            .fold(0.0, f64::max);
        let l0 = (got.loss[0] - reference.loss[0]).abs() / reference.loss[0];
        println!("{name}: loss rel {l0:.1e}, worst parameter rel {worst:.1e}");
    }
}

/// Every rank of `v`'s run: weights (frozen and adapters), gradients and optimizer states
/// (adapters only) exactly the engine's, and its peak within 2% of the prediction.
fn check_memory(name: &str, v: Value) {
    check_memory_but(name, v, false);
}

/// [`check_memory`] with each rank's weights the router's expert bias below the engine's count
/// when `router_bias` (DeepSeek-V3: fp32 per expert and MoE layer of the rank; its ZeRO-3
/// shard), which the engine counts and the executor keeps outside its tracker.
fn check_memory_but(name: &str, v: Value, router_bias: bool) {
    use super::memory::weight_bytes;
    let p = plan(v.clone());
    let untracked = |rank: u32| -> i64 {
        let (m, rp) = (&p.model, &p.ranks[rank as usize]);
        let experts = m.moe.as_ref().map_or(0, |e| e.num_experts) as i64;
        let layers = rp
            .stages
            .iter()
            .flat_map(|&s| p.stages[s as usize].layers.clone());
        let moe_layers = layers.filter(|&l| m.is_moe_layer(l)).count() as i64;
        // Under ZeRO-3 the engine counts its shard over the dense replicas (DP x CP).
        let reps = if p.parallel.zero >= 3 {
            (p.parallel.dp * p.parallel.cp) as i64
        } else {
            1
        };
        if router_bias {
            4 * experts * moe_layers / reps
        } else {
            0
        }
    };
    for (rank, m, p, mb, pb) in &super::memory::compare_config(v) {
        let untracked_bytes = untracked(*rank);
        let rest = |s: &str| {
            let head = s.split(" a ").next().unwrap_or("");
            head.split_once(" g ").map(|x| x.1.to_string())
        };
        assert_eq!(
            (weight_bytes(mb) + untracked_bytes, rest(mb)),
            (weight_bytes(pb), rest(pb)),
            "{name} rank {rank}: weights/gradients/optimizer"
        );
        let pct = (*m as f64 - *p as f64) / *p as f64 * 100.0;
        println!("{name} rank {rank}: measured {m} predicted {p} ({pct:+.2}%)\n  measured  {mb}\n  predicted {pb}");
        assert!(
            pct.abs() <= 2.0,
            "{name} rank {rank}: {pct:+.2}%\n  measured  {mb}\n  predicted {pb}"
        );
    }
}

fn mixes() -> Vec<(&'static str, Mix)> {
    let s = Mix::single;
    vec![
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("tp2", Mix { tp: 2, ..s() }),
        (
            "cp2 p2p + tp2 sp",
            Mix {
                cp: 2,
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        (
            "pp2 full recompute",
            Mix {
                pp: 2,
                recompute: "full",
                ..s()
            },
        ),
        ("pp2 1f1b", Mix { pp: 2, ..s() }),
        (
            "dp2 zero1",
            Mix {
                dp: 2,
                zero: 1,
                ..s()
            },
        ),
        (
            "dp2 zero3",
            Mix {
                dp: 2,
                zero: 3,
                ..s()
            },
        ),
        (
            "dp2 zero3 + pp2 zb-v",
            Mix {
                dp: 2,
                zero: 3,
                pp: 2,
                vpp: 2,
                schedule: "zb-v",
                ..s()
            },
        ),
        (
            "dp2 zero2 + tp2 sp",
            Mix {
                dp: 2,
                zero: 2,
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        (
            "pp2 zb-v",
            Mix {
                pp: 2,
                vpp: 2,
                schedule: "zb-v",
                ..s()
            },
        ),
    ]
}

#[test]
fn lora_runs_match_the_single_rank_run_under_every_mix() {
    let reference = run(&seeded(lora(&Mix::single(), &ALL)), 3);
    let adapters = check_lora_contract(
        &reference,
        plan(config(&Mix::single(), GBS, true, "rmsnorm", "swiglu")),
        seeded(lora(&Mix::single(), &ALL)),
    );
    // Per layer: qkv A and B (q, k, v rows), proj A, B, fc1 A and B (gate, up rows), fc2 A, B.
    assert_eq!(adapters.len(), 8 * (4 + 2 + 3 + 2));
    let named = mixes().into_iter().map(|(n, m)| (n.to_string(), m));
    compare_mixes(named, |m| seeded(lora(m, &ALL)), &reference, compare);
}

#[test]
fn lora_on_the_attention_only_matches_under_tp2_sp_and_pp2() {
    // The engine's default targets (qkv, proj): the MLP has no adapters.
    let reference = run(&seeded(lora(&Mix::single(), &["qkv", "proj"])), 3);
    let s = Mix::single;
    for (name, mix) in [
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("pp2", Mix { pp: 2, ..s() }),
    ] {
        let got = run(&seeded(lora(&mix, &["qkv", "proj"])), 3);
        compare(name, &got, &reference);
    }
}

#[test]
fn lora_memory_is_within_two_percent_per_rank() {
    let mut all = mixes();
    all.insert(0, ("single", Mix::single()));
    for (name, mix) in all {
        check_memory(name, lora(&mix, &ALL));
    }
}

#[test]
fn lora_mixes_not_executed_are_refused_by_field() {
    // MLA lowers without a `qkv` adapter (the engine counts none: no fused QKV projection);
    // a plan that asks for one anyway is refused by field.
    let mut p = plan(lora_mla(&Mix::single()));
    let l = p.lora.as_mut().expect("lora plan");
    assert!(!l.qkv && l.proj && l.fc1 && l.fc2, "{l:?}");
    l.qkv = true;
    let err = p.validate().expect_err("refused").to_string();
    assert!(err.contains("lora.qkv"), "{err}");
}

/// Mixed precision: the frozen weights as bf16 copies without fp32 masters, the adapters with
/// their fp32 masters and moments. Every parameter after three steps within bf16's 1e-2 of
/// the fp32 run, and each rank's peak within 2% of the bf16 prediction (weights, gradients and
/// optimizer states exactly).
#[test]
fn lora_in_bf16_matches_fp32_and_its_memory_prediction() {
    use parsim_executor::runner::{run_cpu, RunOptions};
    use parsim_plan::plan::Precision;
    let opts = |precision, export_params| RunOptions {
        steps: 3,
        warmup: 0,
        export_params,
        precision,
        ..RunOptions::default()
    };
    let fp32 = run(&seeded(lora(&Mix::single(), &ALL)), 3);
    let tp2 = Mix {
        tp: 2,
        sp: true,
        ..Mix::single()
    };
    for (name, mix) in [("single", Mix::single()), ("tp2+sp", tp2)] {
        let mut v = lora(&mix, &ALL);
        v["training"]["precision"] = "bf16".into();
        let res = resolve(v);
        let est = parsim::estimate::estimate(&res).expect("estimate");
        let mut p = parsim::lower::lower(&res, &options()).expect("lowers");
        p.lora.as_mut().expect("lora").seeded_b = true;
        let rep = run_cpu(&p, &opts(Precision::Bf16, true)).expect("runs");
        let (gp, rp) = (rep.params.as_ref(), fp32.params.as_ref().expect("params"));
        for (k, want) in rp {
            let d = rel_diff(&gp.expect("params")[k], want);
            assert!(d <= 1e-2, "{name}: {k} differs by {d:e} from fp32");
        }
        for r in &rep.ranks {
            let s = &est.memory.stages[r.coords.pp as usize];
            let m = r.peak;
            assert_eq!(
                (m.weights, m.gradients, m.optimizer),
                (s.weights, s.gradients, s.optimizer),
                "{name} rank {}",
                r.rank
            );
            let pct = (m.total() as f64 - s.total as f64) / s.total as f64 * 100.0;
            println!("bf16 {name} rank {}: {pct:+.2}%", r.rank);
            assert!(pct.abs() <= 2.0, "bf16 {name} rank {}: {pct:+.2}%", r.rank);
        }
    }
}

/// [`lora`] on the MLA model of `tests/executor/mla.rs` (query latent 32, key/value latent 16,
/// heads of 8 + 4 rotary query/key features and 6 value features, 4 layers).
fn lora_mla(mix: &Mix) -> Value {
    let mut v = super::mla::mla_config(mix, "none", true);
    v["training"]["mode"] = "lora".into();
    v["training"]["lora"] = json!({"rank": 4, "alpha": 16.0, "targets": ALL});
    v
}

/// LoRA with MLA's TP 2 + SP and PP 2 (1F1B) mixes.
fn mla_mixes() -> [(&'static str, Mix); 2] {
    let s = Mix::single;
    [
        (
            "mla tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("mla pp2 1f1b", Mix { pp: 2, ..s() }),
    ]
}

#[test]
fn lora_with_mla_matches_the_single_rank_run() {
    let reference = run(&seeded(lora_mla(&Mix::single())), 3);
    // Every MLA projection, latent norm and the rest of the base stays at its initial bits.
    let adapters = check_lora_contract(
        &reference,
        plan(super::mla::mla_config(&Mix::single(), "none", true)),
        seeded(lora_mla(&Mix::single())),
    );
    // The engine counts no `qkv` adapter under MLA (its layers have no fused QKV projection,
    // NeMo's `linear_qkv`), so per layer: proj A and B, fc1 A and B (gate, up rows), fc2 A, B.
    assert_eq!(adapters.len(), 4 * (2 + 3 + 2));
    assert!(adapters.iter().all(|k| !k.contains("qkv")), "{adapters:?}");
    let named = mla_mixes().into_iter().map(|(n, m)| (n.to_string(), m));
    compare_mixes(named, |m| seeded(lora_mla(m)), &reference, compare);
}

#[test]
fn lora_with_mla_memory_is_within_two_percent_per_rank() {
    let mut all = mla_mixes().to_vec();
    all.insert(0, ("mla single", Mix::single()));
    for (name, mix) in all {
        check_memory(name, lora_mla(&mix));
    }
}

/// [`lora`]'s adapters (rank 4, alpha 16) on `targets` of the small MoE model of
/// `tests/executor/moe.rs` (8 experts, top-2, expert ffn 64, SwiGLU, 4 layers, the first
/// dense): with `fc1`/`fc2`, one adapter pair on every routed expert's fc1/fc2 (the engine's
/// count); the experts' weights and the router stay frozen.
fn lora_moe(c: &super::moe::Moe, targets: &[&str]) -> Value {
    let mut v = super::moe::moe_config(c);
    v["training"]["mode"] = "lora".into();
    v["training"]["lora"] = json!({"rank": 4, "alpha": 16.0, "targets": targets});
    v
}

/// The target lists with MoE, and the adapter tensors each exports: per layer qkv's A and B
/// (q, k, v rows), proj's A and B; with fc1/fc2 the dense first layer's fc1 A and B (gate,
/// up rows), fc2 A and B, and each of the 3 MoE layers' 8 experts' fc1 A, B and fc2 A, B.
const MOE_TARGETS: [(&[&str], usize); 2] = [
    (&["qkv", "proj"], 4 * (4 + 2)),
    (&ALL, 4 * (4 + 2) + (3 + 2) + 3 * 8 * 4),
];

/// LoRA with MoE's mixes: EP 2 with ZeRO-1, TP 2 + SP with expert-TP 2, PP 2 (1F1B, and ZB-V,
/// whose W actions hold the adapters' weight-gradient tasks).
fn moe_mixes() -> [(&'static str, super::moe::Moe); 4] {
    use super::moe::{Moe, BASE};
    let base = Moe {
        first_dense: 1,
        ..BASE
    };
    [
        (
            "moe ep2 zero1",
            Moe {
                ep: 2,
                dp: 2,
                zero: 1,
                ..base
            },
        ),
        (
            "moe tp2+sp etp2",
            Moe {
                tp: 2,
                sp: true,
                ..base
            },
        ),
        ("moe pp2 1f1b", Moe { pp: 2, ..base }),
        (
            "moe pp2 zb-v",
            Moe {
                pp: 2,
                vpp: 2,
                schedule: "zb-v",
                ..base
            },
        ),
    ]
}

#[test]
fn lora_with_moe_matches_the_single_rank_run() {
    for (targets, count) in MOE_TARGETS {
        lora_with_moe_matches(targets, count);
    }
}

fn lora_with_moe_matches(targets: &[&str], count: usize) {
    let single = moe_mixes()[0].1.single();
    let reference = run(&seeded(lora_moe(&single, targets)), 3);
    // The routed experts, the router, every norm and projection keep their initial bits.
    let frozen = plan(super::moe::moe_config(&single));
    let adapters = check_lora_contract(&reference, frozen, seeded(lora_moe(&single, targets)));
    assert!(
        reference
            .params
            .as_ref()
            .expect("params")
            .keys()
            .any(|k| k.contains("expert") && !k.contains("_lora_")),
        "no frozen expert weight"
    );
    assert_eq!(adapters.len(), count, "{targets:?}");
    let named = moe_mixes()
        .into_iter()
        .map(|(n, c)| (format!("{n} {targets:?}"), c));
    compare_mixes(
        named,
        |c| seeded(lora_moe(c, targets)),
        &reference,
        super::moe::compare,
    );
}

#[test]
fn lora_with_moe_memory_is_within_two_percent_per_rank() {
    // Forced load balancing: the routing, hence every rank's expert rows, known by
    // construction (the engine's balanced load). Under PP 2 ZB-V rank 0 holds the first
    // chunk and the last (an MoE layer and the output block): it measures -0.70% (qkv + proj)
    // and -0.60% (all targets); it was -3.26% while the engine took the MoE layer's backward
    // transient (56 KiB) with the output block's saved set still live, and a chunk's forward
    // with any chunk's largest transient.
    let mut all = moe_mixes().to_vec();
    all.insert(0, ("moe single", moe_mixes()[0].1.single()));
    let cases = all
        .into_iter()
        .flat_map(|(name, c)| MOE_TARGETS.map(|(targets, _)| (name, c, targets)));
    for (name, c, targets) in cases {
        let name = format!("{name} {targets:?}");
        let c = super::moe::Moe {
            force_balance: true,
            ..c
        };
        check_memory(&name, lora_moe(&c, targets));
    }
}

/// The DeepSeek-style MoE of `tests/executor/moe.rs` (sigmoid routing with the expert bias, 4
/// groups, one shared expert of ffn 64, the first layer dense) with every LoRA target: NeMo's
/// LoRA (and the engine: `moe.shared.fc1_lora`/`fc2_lora`) wraps the shared experts'
/// linear_fc1/fc2 as the dense MLP's, beside the routed experts' adapters. `variant`: plain,
/// with linear biases (each expert's and the shared expert's fc1/fc2 biases frozen), or with
/// MLA (no fused QKV to adapt).
fn lora_ds(c: &super::moe::Moe, variant: &str) -> Value {
    let c = super::moe::Moe {
        first_dense: 1,
        deepseek: true,
        ..*c
    };
    let mut v = match variant {
        "mla" => super::mla::deepseek_mla(&c),
        _ => super::moe::moe_config(&c),
    };
    if variant == "bias" {
        v["model"]["add_bias_linear"] = true.into();
    }
    v["training"]["mode"] = "lora".into();
    v["training"]["lora"] = json!({"rank": 4, "alpha": 16.0, "targets": ALL});
    v
}

/// The adapter tensors [`lora_ds`] exports: per layer qkv's A and B (q, k, v rows; none with
/// MLA) and proj's A and B; the dense first layer's fc1 A and B (gate, up rows) and fc2 A and
/// B; per MoE layer (3) its shared expert's five likewise and its 8 experts' fc1 A, B and fc2
/// A, B.
fn ds_adapters(variant: &str) -> usize {
    let attention = if variant == "mla" { 2 } else { 4 + 2 };
    4 * attention + 5 + 3 * (5 + 8 * 4)
}

/// EP 2 with ZeRO-1, TP 2 + SP with expert-TP 2, TP 2 + SP with whole experts (expert-TP 1),
/// PP 2 with 1F1B.
fn ds_mixes() -> Vec<(&'static str, super::moe::Moe, u32)> {
    use super::moe::{Moe, BASE};
    vec![
        (
            "ep2 zero1",
            Moe {
                ep: 2,
                dp: 2,
                zero: 1,
                ..BASE
            },
            1,
        ),
        (
            "tp2+sp etp2",
            Moe {
                tp: 2,
                sp: true,
                ..BASE
            },
            2,
        ),
        (
            "tp2+sp etp1",
            Moe {
                tp: 2,
                sp: true,
                ..BASE
            },
            1,
        ),
        ("pp2 1f1b", Moe { pp: 2, ..BASE }, 1),
    ]
}

/// [`lora_ds`] with expert TP `etp`.
fn lora_ds_etp(c: &super::moe::Moe, variant: &str, etp: u32) -> Value {
    let mut v = lora_ds(c, variant);
    v["parallel"]["expert_tp"] = etp.into();
    v
}

/// LoRA with shared experts, linear biases and MLA: the contract (every base weight, the
/// shared and routed experts' included, keeps its bits; every adapter trains, the shared
/// experts' too) and every mix against the single-rank run.
#[test]
fn lora_with_shared_experts_biases_and_mla_matches_the_single_rank_run() {
    for variant in ["plain", "bias", "mla"] {
        let single = super::moe::BASE;
        let reference = run(&seeded(lora_ds(&single, variant)), 3);
        let mut frozen = lora_ds(&single, variant);
        frozen["training"]["mode"] = "full".into();
        let adapters =
            check_lora_contract(&reference, plan(frozen), seeded(lora_ds(&single, variant)));
        assert_eq!(adapters.len(), ds_adapters(variant), "{variant}");
        // The MoE layers' shared experts carry fc1 and fc2 adapters (layers 1-3).
        for l in 1..4 {
            for t in ["fc1_lora_a", "fc2_lora_b"] {
                let name = format!("layers.{l}.{t}");
                assert!(adapters.contains(&name), "{variant}: no {name}");
            }
        }
        let named = ds_mixes()
            .into_iter()
            .map(|(n, c, etp)| (format!("{variant} {n}"), (c, etp)));
        compare_mixes(
            named,
            |(c, etp)| seeded(lora_ds_etp(c, variant, *etp)),
            &reference,
            super::moe::compare,
        );
    }
}

#[test]
fn lora_with_shared_experts_biases_and_mla_memory_is_within_two_percent_per_rank() {
    let mut all = ds_mixes();
    all.insert(0, ("single", super::moe::BASE, 1));
    for variant in ["plain", "bias", "mla"] {
        for (name, c, etp) in &all {
            let c = super::moe::Moe {
                force_balance: true,
                ..*c
            };
            let v = lora_ds_etp(&c, variant, *etp);
            check_memory_but(&format!("{variant} {name}"), v, true);
        }
    }
}

/// LoRA with MoE under ZeRO-3 with EP: the frozen routed experts lie in a space of their own,
/// sharded (as trained experts) over the expert-data-parallel group, so each rank holds
/// 1 / expert-DP of its EP rank's frozen experts (the engine's count) and gathers them per
/// layer. EP 2 over DP 4 (expert DP 2) on qkv + proj (the frozen experts block alone) and on
/// all four targets (the experts' adapters beside them), every layer MoE; and TP 2 + SP with
/// whole experts, EP 2 over DP 2 (expert DP 2: the TP ranks), DeepSeek-style with a shared
/// expert and the first layer dense.
fn zero3_ep_mixes() -> Vec<(&'static str, Value)> {
    use super::moe::{Moe, BASE};
    let ep2 = Moe {
        ep: 2,
        dp: 4,
        zero: 3,
        ..BASE
    };
    let tp = Moe {
        tp: 2,
        sp: true,
        ep: 2,
        dp: 2,
        zero: 3,
        ..BASE
    };
    vec![
        ("ep2 dp4 zero3 qkv+proj", lora_moe(&ep2, &["qkv", "proj"])),
        ("ep2 dp4 zero3 all", lora_moe(&ep2, &ALL)),
        ("tp2+sp etp1 ep2 zero3 ds", lora_ds_etp(&tp, "plain", 1)),
    ]
}

#[test]
fn lora_with_moe_under_zero3_and_ep_matches_the_single_rank_run() {
    for (name, v) in zero3_ep_mixes() {
        let single = |v: &Value| {
            let mut s = v.clone();
            let p = &mut s["parallel"];
            for k in ["tp", "ep", "dp", "expert_tp"] {
                p[k] = 1.into();
            }
            p["zero"] = 0.into();
            p["sp"] = false.into();
            s["cluster"]["num_gpus"] = 1.into();
            s
        };
        let reference = run(&seeded(single(&v)), 3);
        let p = seeded(v);
        // The frozen experts shard over the expert-DP group (2 members on every rank).
        assert!(
            p.ranks
                .iter()
                .all(|r| r.groups.get(GroupKind::ExpertDp).len() == 2),
            "{name}"
        );
        compare_mixes(
            [(name.to_string(), p)],
            Plan::clone,
            &reference,
            super::moe::compare,
        );
    }
}

#[test]
fn lora_with_moe_under_zero3_and_ep_memory_is_within_two_percent_per_rank() {
    for (name, mut v) in zero3_ep_mixes() {
        let m = &mut v["model"];
        m["moe_router_force_load_balancing"] = true.into();
        m["moe_router_num_groups"] = 0.into();
        m["moe_router_group_topk"] = 0.into();
        let bias = name.ends_with("ds");
        check_memory_but(name, v, bias);
    }
}
