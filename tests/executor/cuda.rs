//! `parsim execute --backend cuda` on a machine without the CUDA driver: a clear error naming
//! the library and where the loader looked, a nonzero exit, no panic. On a machine with a
//! driver these print why they skip.

use assert_cmd::Command;
use parsim_plan::GroupKind;

const SMALL: &str = "tests/fixtures/executor_small.toml";

/// Whether libcuda.so.1 can be loaded here (the same probe the backend makes).
fn driver_present() -> bool {
    parsim_executor::backend::cuda::Library::Driver.present()
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::cargo_bin("parsim")
        .expect("binary")
        .args(args)
        .env("LD_LIBRARY_PATH", "/nonexistent/cuda-libs")
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_names_the_driver(ok: bool, err: &str) {
    assert!(!ok, "must exit nonzero without a driver");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("CUDA driver"), "{err}");
    assert!(err.contains("libcuda.so.1"), "{err}");
    // Where the loader looked: LD_LIBRARY_PATH's folders, then the system's.
    assert!(err.contains("/nonexistent/cuda-libs"), "{err}");
    assert!(err.contains("/usr/lib"), "{err}");
}

#[test]
fn execute_cuda_without_a_driver_names_the_library_and_exits_nonzero() {
    if driver_present() {
        eprintln!("skipped: a CUDA driver is present on this machine");
        return;
    }
    let (ok, err) = run(&[
        "execute",
        "--config",
        SMALL,
        "--backend",
        "cuda",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]);
    assert_names_the_driver(ok, &err);
}

#[test]
fn calibrate_cuda_without_a_driver_fails_before_the_sweep() {
    if driver_present() {
        eprintln!("skipped: a CUDA driver is present on this machine");
        return;
    }
    let (ok, err) = run(&["execute", "--calibrate", "--backend", "cuda"]);
    assert_names_the_driver(ok, &err);
}

/// The CUDA layout makes a communicator for every group the executor runs collectives over
/// and no other: a CP 2 x DP 2 plan states the dense DP groups too (the Plan holds every
/// kind), but the dense gradients reduce over DP x CP, so those are left out.
#[test]
fn the_cuda_layout_leaves_out_the_dense_dp_groups_it_never_uses() {
    use parsim_executor::runner::{cuda_layout, CudaWorld};
    use std::collections::BTreeSet;
    let mix = super::common::Mix {
        cp: 2,
        dp: 2,
        ..super::common::Mix::single()
    };
    let plan = super::common::plan(super::common::config(&mix, 8, true, "rmsnorm", "swiglu"));
    assert_eq!(plan.world(), 4);
    let used = [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::DpCp,
        GroupKind::Pp,
        GroupKind::Ep,
        GroupKind::ExpertDp,
        GroupKind::ExpertTp,
    ];
    let mut want: BTreeSet<Vec<u32>> = plan
        .ranks
        .iter()
        .flat_map(|rp| used.map(|k| rp.groups.get(k).to_vec()))
        .collect();
    want.insert((0..plan.world()).collect());
    let got: BTreeSet<Vec<u32>> = cuda_layout(&plan, &CudaWorld::SingleProcess, 4)
        .unwrap()
        .groups
        .into_iter()
        .map(|g| g.members)
        .collect();
    assert_eq!(got, want);
    // The dense DP groups differ from every used one here, and none was made.
    for rp in &plan.ranks {
        let dp = rp.groups.get(GroupKind::Dp).to_vec();
        assert_eq!(dp.len(), 2);
        assert!(!got.contains(&dp), "{dp:?}");
    }
}

/// A TP 2 x PP 2 x DP 2 plan lowered by the engine: on one GPU every group of two or more
/// ranks uses the device-copy collectives (so it runs on a workstation); on eight GPUs every
/// such group uses NCCL; on two GPUs the TP pairs (adjacent ranks) share a GPU and the rest
/// spans both.
#[test]
fn a_tp_pp_dp_plan_places_on_one_two_and_eight_gpus() {
    use parsim_executor::backend::cuda::comm::groups::Transport;
    use parsim_executor::runner::{cuda_layout, CudaWorld};
    let mix = super::common::Mix {
        tp: 2,
        pp: 2,
        dp: 2,
        ..super::common::Mix::single()
    };
    let plan = super::common::plan(super::common::config(&mix, 8, true, "rmsnorm", "swiglu"));
    assert_eq!(plan.world(), 8);
    let multi = |g: &parsim_executor::backend::cuda::comm::groups::GroupSpec| g.members.len() > 1;
    let one = cuda_layout(&plan, &CudaWorld::SingleProcess, 1).unwrap();
    assert!(one.local.iter().all(|&(_, d)| d == 0));
    assert!(one
        .groups
        .iter()
        .filter(|g| multi(g))
        .all(|g| g.transport == Transport::Local));
    assert!(!one.needs_nccl());
    let eight = cuda_layout(&plan, &CudaWorld::SingleProcess, 8).unwrap();
    assert!(eight
        .groups
        .iter()
        .filter(|g| multi(g))
        .all(|g| g.transport == Transport::Nccl));
    // Every rank's TP, PP and DP group is among the groups, with the world.
    for rp in &plan.ranks {
        for grp in [
            rp.groups.get(GroupKind::Tp),
            rp.groups.get(GroupKind::Pp),
            rp.groups.get(GroupKind::DpCp),
        ] {
            assert!(eight.groups.iter().any(|g| g.members == grp), "{grp:?}");
        }
    }
    assert!(eight
        .groups
        .iter()
        .any(|g| g.members == (0..8).collect::<Vec<u32>>()));
    let two = cuda_layout(&plan, &CudaWorld::SingleProcess, 2).unwrap();
    for rp in &plan.ranks {
        let t = |m: &[u32]| {
            two.groups
                .iter()
                .find(|g| g.members == m)
                .unwrap()
                .transport
        };
        let devs: Vec<u32> = rp
            .groups
            .get(GroupKind::Tp)
            .iter()
            .map(|&r| two.local[r as usize].1)
            .collect();
        let want = if devs.windows(2).all(|w| w[0] == w[1]) {
            Transport::Local
        } else {
            Transport::Nccl
        };
        assert_eq!(
            t(rp.groups.get(GroupKind::Tp)),
            want,
            "tp group {:?} on {devs:?}",
            rp.groups.get(GroupKind::Tp)
        );
    }
}

/// Why the GPU twin runs cannot run here, if they cannot (no driver, or no GPU).
fn no_gpu() -> Option<String> {
    if !driver_present() {
        return Some("no CUDA driver (libcuda.so.1) on this machine".into());
    }
    parsim_executor::backend::cuda::device::context::visible_gpus()
        .err()
        .map(|e| e.to_string())
}

/// The small fixture under `mix` on the GPUs at hand (ranks sharing a GPU use the device-copy
/// collectives) against the CPU twin: the loss of the first step, and every parameter after
/// three steps, within `tol` relative (fp32 1e-5, bf16 1e-2: the bf16 recipe rounds where
/// the GPU stores, as the CPU twin does, but sums in a different order).
fn gpu_twin(
    label: &str,
    mix: super::common::Mix,
    precision: parsim_plan::plan::Precision,
    tol: f64,
) {
    let gbs = u64::from(mix.dp) * 2;
    let plan = super::common::plan(super::common::config(&mix, gbs, true, "rmsnorm", "swiglu"));
    gpu_twin_plan(label, &plan, precision, tol);
}

/// [`gpu_twin`] of a given Plan.
fn gpu_twin_plan(
    label: &str,
    plan: &parsim_plan::plan::Plan,
    precision: parsim_plan::plan::Precision,
    tol: f64,
) {
    use parsim_executor::runner::{run_cpu, run_cuda, CudaWorld, RunOptions};
    let plan = plan.clone();
    let opts = RunOptions {
        steps: 3,
        warmup: 1,
        export_params: true,
        precision,
        ..RunOptions::default()
    };
    let want = run_cpu(&plan, &opts).unwrap_or_else(|e| panic!("{label}: cpu run: {e}"));
    let got = run_cuda(&plan, &opts, CudaWorld::SingleProcess)
        .unwrap_or_else(|e| panic!("{label}: cuda run: {e}"));
    let (a, b) = (got.loss[0], want.loss[0]);
    assert!(
        (a - b).abs() <= tol * b.abs(),
        "{label}: first loss {a} vs the CPU's {b}"
    );
    let (gp, wp) = (got.params.expect("params"), want.params.expect("params"));
    assert_eq!(gp.len(), wp.len(), "{label}");
    for ((name, g), (_, w)) in gp.iter().zip(&wp) {
        let e = super::common::rel_diff(g, w);
        assert!(e < tol, "{label}: {name} after 3 steps: relative error {e}");
    }
    // The device's memory figures are reported next to the tracked categories.
    for r in &got.ranks {
        let d = r.device.expect("device memory in the report");
        assert!(
            d.pool_reserved_peak_bytes >= r.reserved_peak.total(),
            "{label}"
        );
        assert!(d.driver_used_bytes <= d.driver_total_bytes, "{label}");
    }
}

#[test]
fn tp2_sp_pp2_and_dp2_steps_match_the_cpu_twin_on_the_gpu() {
    use parsim_plan::plan::Precision;
    if let Some(reason) = no_gpu() {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(&reason);
        return;
    }
    use super::common::Mix;
    let mixes = [
        ("one rank", Mix::single()),
        ("tp2+sp", Mix::tp2_sp()),
        ("pp2", Mix::pp2("1f1b", 1)),
        ("dp2 zero1", Mix::dp2(1)),
    ];
    for (label, mix) in mixes {
        gpu_twin(label, mix.clone(), Precision::Fp32, 1e-5);
        gpu_twin(&format!("{label} bf16"), mix, Precision::Bf16, 1e-2);
    }
}

/// ZeRO 0/1 gradient buckets during backward on the GPU (one bucket per block,
/// `ddp_bucket_size` = 1; TP 2 + SP x DP 2): every parameter after three steps is the CPU
/// twin's, and the trace puts every DP reduction inside the last backward (on one GPU the
/// ranks share the device and reduce in place; across GPUs NCCL reduces on the gradient
/// stream, joined at the optimizer step).
#[test]
fn grad_buckets_during_backward_match_the_cpu_twin_on_the_gpu() {
    use parsim_executor::runner::{run_cuda, CudaWorld, RunOptions};
    use parsim_executor::trace::Clock;
    use parsim_plan::plan::{Action, Precision};
    if let Some(reason) = no_gpu() {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(&reason);
        return;
    }
    for zero in [0u8, 1] {
        let mix = super::common::Mix {
            tp: 2,
            sp: true,
            dp: 2,
            zero,
            ..super::common::Mix::single()
        };
        let mut v = super::common::config(&mix, 4, true, "rmsnorm", "swiglu");
        v["parallel"]["ddp_bucket_size"] = 1.into();
        let plan = super::common::plan(v);
        assert!(plan.parallel.grad_bucket_params.is_some());
        let label = format!("dp2 zero{zero} buckets");
        gpu_twin_plan(&label, &plan, Precision::Fp32, 1e-5);
        gpu_twin_plan(&format!("{label} bf16"), &plan, Precision::Bf16, 1e-2);
        let opts = RunOptions {
            steps: 2,
            warmup: 1,
            trace: Some(Clock::new()),
            ..RunOptions::default()
        };
        let r = run_cuda(&plan, &opts, CudaWorld::SingleProcess)
            .unwrap_or_else(|e| panic!("{label}: traced cuda run: {e}"));
        for (rp, t) in plan.ranks.iter().zip(r.traces.expect("traces")) {
            let last_b = rp
                .actions
                .iter()
                .rposition(|a| matches!(a, Action::Backward { .. }))
                .expect("a backward");
            let dp: Vec<_> = super::timeline_grad_buckets::collectives(&t)
                .into_iter()
                .filter(|c| super::timeline_grad_buckets::is_reduction(c, rp))
                .collect();
            assert_eq!(dp.len(), 10, "{label} rank {}: {dp:?}", rp.rank);
            assert!(dp.iter().all(|c| c.0 == last_b), "{label}: {dp:?}");
        }
    }
}

/// One run of `v` on the GPUs at hand in `precision`: the first step's loss and the
/// parameters after three steps.
fn gpu_run(
    label: &str,
    v: serde_json::Value,
    precision: parsim_plan::plan::Precision,
) -> parsim_plan::run_report::RunReport {
    use parsim_executor::runner::{run_cuda, CudaWorld, RunOptions};
    let opts = RunOptions {
        steps: 3,
        warmup: 0,
        export_params: true,
        precision,
        ..RunOptions::default()
    };
    run_cuda(&super::common::plan(v), &opts, CudaWorld::SingleProcess)
        .unwrap_or_else(|e| panic!("{label}: cuda run: {e}"))
}

/// `got` against the one-rank GPU run `want`: the first loss and every parameter after three
/// steps within `tol` (largest difference over the tensor's largest value). Returns the worst.
fn against_one_rank(
    label: &str,
    got: &parsim_plan::run_report::RunReport,
    want: &parsim_plan::run_report::RunReport,
    tol: f64,
) -> f64 {
    let (a, b) = (got.loss[0], want.loss[0]);
    let mut worst = (a - b).abs() / b.abs();
    assert!(worst <= tol, "{label}: first loss {a} vs one rank's {b}");
    let (gp, wp) = (
        got.params.as_ref().expect("params"),
        want.params.as_ref().expect("params"),
    );
    assert_eq!(gp.len(), wp.len(), "{label}");
    for (name, w) in wp {
        let e = super::common::rel_diff(&gp[name], w);
        assert!(e < tol, "{label}: {name} after 3 steps: relative error {e}");
        worst = worst.max(e);
    }
    worst
}

/// Issue 16's grid on one GPU (the ranks share it through the backend's device-copy
/// collectives): every mix against the one-rank GPU run of the same model, in fp32 (1e-5) and
/// in the bf16 recipe (1e-2; the collectives round a reduced sum once where one rank rounds
/// its whole matmul output once).
#[test]
fn every_mix_on_one_gpu_matches_the_one_rank_gpu_run() {
    use super::common::Mix;
    use parsim_plan::plan::Precision;
    if let Some(reason) = no_gpu() {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(&reason);
        return;
    }
    let mixes = [
        ("tp2+sp", Mix::tp2_sp()),
        ("pp2 1f1b", Mix::pp2("1f1b", 1)),
        ("pp2 interleaved", Mix::pp2("interleaved-1f1b", 2)),
        ("pp2 zb-v", Mix::pp2("zb-v", 2)),
        ("dp2 zero1", Mix::dp2(1)),
        ("dp2 zero3", Mix::dp2(3)),
        ("cp2 p2p", Mix::cp2("p2p")),
        ("cp2 zigzag", Mix::cp2("zigzag")),
        ("cp2 allgather", Mix::cp2("allgather")),
        ("cp2 a2a", Mix::cp2("a2a")),
    ];
    let gbs = 4;
    let dense = |m: &Mix| super::common::config(m, gbs, true, "rmsnorm", "swiglu");
    for (precision, tol) in [(Precision::Fp32, 1e-5), (Precision::Bf16, 1e-2)] {
        let one = gpu_run("one rank", dense(&Mix::single()), precision);
        for (label, mix) in &mixes {
            let got = gpu_run(label, dense(mix), precision);
            let worst = against_one_rank(label, &got, &one, tol);
            println!("{label} {precision:?}: worst relative difference {worst:.2e}");
        }
        // Expert parallelism: the MoE model, EP 2 over DP 2, against its own one-rank run.
        let moe = super::moe::Moe {
            ep: 2,
            dp: 2,
            ..super::moe::BASE
        };
        let one = gpu_run(
            "moe one rank",
            super::moe::moe_config(&moe.single()),
            precision,
        );
        let got = gpu_run("ep2", super::moe::moe_config(&moe), precision);
        let worst = against_one_rank("ep2", &got, &one, tol);
        println!("ep2 dp2 {precision:?}: worst relative difference {worst:.2e}");
    }
}

/// Op profiling on the GPU (CUDA events on the compute stream, read after each step): TP 2 +
/// SP x PP 2 in bf16 records the same GEMM, attention shape and collective keys with the same
/// call counts as the CPU twin (the keys are the plan's, whatever the backend), attention
/// under a CUDA kernel's name, and every rank's records sum with its host gaps to its actions'
/// time within the events' resolution.
#[test]
fn profiled_ops_on_the_gpu_have_the_cpu_twins_keys_and_cover_the_actions() {
    use parsim_executor::runner::{run_cpu, run_cuda, CudaWorld, RunOptions};
    use parsim_plan::op_timing::OpKey;
    use parsim_plan::plan::Precision;
    use std::collections::BTreeMap;
    if let Some(reason) = no_gpu() {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(&reason);
        return;
    }
    let mix = super::common::Mix {
        tp: 2,
        sp: true,
        pp: 2,
        ..super::common::Mix::single()
    };
    let plan = super::common::plan(super::common::config(&mix, 4, true, "rmsnorm", "swiglu"));
    let steps = 3;
    let opts = RunOptions {
        steps,
        warmup: 1,
        precision: Precision::Bf16,
        profile_ops: true,
        ..RunOptions::default()
    };
    let gpu = run_cuda(&plan, &opts, CudaWorld::SingleProcess).expect("cuda run");
    let cpu = run_cpu(&plan, &opts).expect("cpu run");
    // Keys with the kernel name left out (it names the backend's implementation).
    let keys = |r: &parsim_plan::run_report::RankReport| -> BTreeMap<String, u64> {
        r.ops
            .iter()
            .filter(|t| t.key != OpKey::HostGap)
            .map(|t| {
                let mut k = t.key.clone();
                if let OpKey::Attention { kernel, .. } = &mut k {
                    kernel.clear();
                }
                (format!("{k:?}"), t.calls)
            })
            .collect()
    };
    for (g, c) in gpu.ranks.iter().zip(&cpu.ranks) {
        assert_eq!(keys(g), keys(c), "rank {}", g.rank);
        for t in &g.ops {
            t.validate()
                .unwrap_or_else(|e| panic!("rank {}: {t:?}: {e}", g.rank));
            if let OpKey::Attention { kernel, .. } = &t.key {
                assert!(
                    ["flash_mma", "flash_scalar"].contains(&kernel.as_str()),
                    "{kernel}"
                );
            }
        }
        let ops_s: f64 = g.ops.iter().map(|t| t.total_s).sum();
        let p = &g.phases;
        let actions_s = f64::from(steps - 1)
            * (p.forward_s + p.backward_s + p.backward_weight_s + p.p2p_s + p.optimizer_s);
        let gaps = g
            .ops
            .iter()
            .find(|t| t.key == OpKey::HostGap)
            .expect("host gap");
        assert!(
            (ops_s - actions_s).abs() <= 2e-6 * gaps.calls as f64,
            "rank {}: ops {ops_s} s, actions {actions_s} s",
            g.rank
        );
    }
}
