"""Writes docs/gpu-validation.md and docs/performance.md from the files GPU runs of
scripts/gpu-proof.sh brought back (docs/gpu-results/<date>/) and the calibration it wrote
(calibration/h100-measured.*): every figure in those two pages comes from here, not typing.
The latest run (LATEST, its own section at the top of each page) comes first; the full run
with the calibration (RES) follows.

Run: python3 scripts/gpu_report.py [docs/gpu-results/2026-11-23]
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / (sys.argv[1] if len(sys.argv) > 1 else "docs/gpu-results/2026-11-23")
DATE = RES.name
LATEST = ROOT / "docs/gpu-results/2026-11-28"


def objects(path):
    """The JSON objects of a file of concatenated (pretty-printed) objects."""
    text, dec, i, out = path.read_text(), json.JSONDecoder(), 0, []
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        o, i = dec.raw_decode(text, i)
        out.append(o)
    return out


def section(log, start):
    """The lines of the log from the step whose header contains `start` to its exit line."""
    lines, out, on = log.splitlines(), [], False
    for line in lines:
        if line.startswith("=== ") and start in line:
            on = True
            continue
        if on:
            if line.startswith("exit "):
                out.append(line)
                break
            out.append(line)
    return out


def mix_rows(text):
    """The table rows (mix, fp32, bf16) of `every_mix_on_one_gpu_matches_the_one_rank_gpu_run`
    in a log, in the order the mixes ran."""
    found = re.findall(r"(\S.*?) (Fp32|Bf16): worst relative difference ([0-9.e+-]+)", text)
    found = [(m.replace("test cuda::every_mix_on_one_gpu_matches_the_one_rank_gpu_run ... ", ""),
              pr, float(e)) for m, pr, e in found]
    names = []
    for m, _, _ in found:
        if m not in names:
            names.append(m)
    return [f"| {m} | {next(e for mm, pr, e in found if mm == m and pr == 'Fp32'):.2e} | "
            f"{next(e for mm, pr, e in found if mm == m and pr == 'Bf16'):.2e} |" for m in names]


log = (RES / "proof-log.txt").read_text()
doctor = json.loads((RES / "doctor.json").read_text())
torch = json.loads((RES / "torch_layer.json").read_text())
gpu = doctor["gpus"][0]
driver_lib = next(l for l in doctor["libraries"] if l["library"] == "CUDA driver")
libs = ", ".join(f"{l['library']} {l['version']}" for l in doctor["libraries"] if l["found"])
machine = (f"{gpu['name']} ({gpu['arch']}), driver {doctor['driver_version']} "
           f"(`{Path(driver_lib['path']).name}`), {libs}; {DATE}")

# --- kernels: worst relative error per test --------------------------------------------
def worst_errors(lines):
    out, test = {}, None
    for line in lines:
        m = re.match(r"test (\S+) \.\.\. ?(.*)", line)
        if m:
            test, line = m.group(1), m.group(2)
        m = re.search(r"relative error ([0-9.e+-]+)", line)
        if m and test:
            e = float(m.group(1))
            n = out.setdefault(test, [0.0, 0])
            n[0], n[1] = max(n[0], e), n[1] + 1
    return out


kern = worst_errors(section(log, "kernels_gpu --test-threads=1 --nocapture"))
kern.update(worst_errors(section(log, "kernels_gpu_flash --test-threads=1 --nocapture")))
sanit = []
for tool in ["memcheck", "racecheck"]:
    for binary in ["kernels_gpu ", "kernels_gpu_flash "]:
        s = section(log, f"--tool {tool} --error-exitcode 9 .device-bin/{binary}")
        summary = next((l.strip("= ").strip() for l in s if "SUMMARY" in l), "no summary")
        ok = next((l for l in s if l.startswith("test result")), "no result")
        sanit.append((tool, binary.strip(), summary, ok.split(";")[0]))

# --- mixes on one GPU ------------------------------------------------------------------
exec_tests = [l for l in section(log, ".device-bin/executor cuda") if l.startswith("test ")]
twin_tests = [l for l in section(log, "cuda_twin --test-threads=1") if l.startswith("test ")]
nccl = [section(log, "--steps 3 --warmup 1 (")[1], section(log, "--nproc-per-node 1")[1]]

# --- memory ----------------------------------------------------------------------------
mem_rows = []
for o in objects(RES / "memory.jsonl"):
    for r in o["ranks"]:
        c = {k: v for k, v in r["coords"].items() if v}
        diff = {k: (r["memory"][k] - r["predicted_memory"][k]) / 2**20 for k in r["memory"]}
        mem_rows.append((o["world_size"], r["rank"], c, r["peak_bytes"], r["predicted_peak_bytes"],
                         r["device"], diff))
# The mixes in the order scripts/gpu-proof.sh ran them (one JSON object each).
MIX_FLAGS = ["", "--tp 2 --sp --gpus 2", "--pp 2 --gpus 2", "--dp 2 --zero 1 --gpus 2",
             "--dp 2 --zero 3 --gpus 2", "--cp 2 --gpus 2"]
# The engine at this commit on the same configurations (`PARSIM` names the binary; default
# `cargo run -q --`): each stage's total without the profile's runtime reserve and the runtime
# lines (CUDA context, BLAS workspace, NCCL buffers), as execute compares.
PARSIM = shlex.split(os.environ.get("PARSIM", "cargo run -q --"))
runtime = tomllib.loads((ROOT / "calibration/h100-sxm.toml").read_text())["runtime_overhead_bytes"]
now = []
for flags in MIX_FLAGS:
    out = subprocess.run(PARSIM + ["estimate", "--config", "tests/fixtures/gpu_memory.toml",
                                   "--precision", "bf16", "--grad-dtype", "fp32", "--json"]
                         + flags.split(), cwd=ROOT, check=True, capture_output=True, text=True)
    now.append([st["total"] - runtime - st.get("cuda_context", 0) - st.get("blas_workspace", 0)
                - sum(st.get("nccl_buffers", {}).values())
                for st in json.loads(out.stdout)["memory"]["stages"]])
mix_of = []
for flags, o in zip(MIX_FLAGS, objects(RES / "memory.jsonl")):
    for r in o["ranks"]:
        mix_of.append((flags or "one rank", r["coords"]["pp"]))

# --- speed -----------------------------------------------------------------------------
layer_lines = section(log, "gpu_layer.toml --backend cuda --precision bf16 --steps 6")
step_ms = float(re.search(r"median step ([0-9.]+) ms", layer_lines[0]).group(1))
act = {m.group(1): float(m.group(2)) for m in
       (re.search(r"│ 0\s+(B|F|optimizer)\s+\d+\s+([0-9.]+) ms", l) for l in layer_lines) if m}
bench = [l for l in section(log, ".device-bin/kernels (") if "TFLOP/s" in l or "GB/s" in l]
h, s, b = torch["shape"]["hidden"], torch["shape"]["seq"], torch["shape"]["batch"]
fwd_flops = 24 * b * s * h * h + 2 * b * s * s * h
peak = torch["gemm_peak_flops"]
ours_ms = act["F"] + act["B"]
ncu = {}
cur = None
for line in (RES / "ncu_layer.txt").read_text().splitlines():
    m = re.match(r"\s+(\S+) \(.*Invocations (\d+)", line)
    if m:
        cur = (m.group(1), int(m.group(2)))
        continue
    m = re.match(r"\s+gpu__time_duration.sum\s+(ms|us|ns)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", line)
    if m and cur:
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}[m.group(1)]
        ncu[cur[0]] = ncu.get(cur[0], 0.0) + float(m.group(4)) * scale * cur[1]
        cur = None

# --- calibration -----------------------------------------------------------------------
cal = (ROOT / "docs/gpu-results" / DATE / "calibrate-log.txt").read_text().splitlines()
cal_table = [l for l in cal if l.startswith(("│", "┌", "╞", "└", "fit", "held out", "outliers"))]


def latest_sections():
    """The sections of the latest run (LATEST): `scripts/gpu-proof.sh all` then `attn`, and
    `fa2` after the fused backward's grid change (its own log)."""
    lg = (LATEST / "proof-log.txt").read_text()
    fa2 = (LATEST / "fa2-log.txt").read_text()
    dr = json.loads((LATEST / "doctor.json").read_text())
    tl = json.loads((LATEST / "torch_layer.json").read_text())
    g = dr["gpus"][0]
    lib = ", ".join(f"{l['library']} {l['version']}" for l in dr["libraries"] if l["found"])
    mach = f"{g['name']} ({g['arch']}), driver {dr['driver_version']}, {lib}; {LATEST.name}"
    results = [l for l in (lg + fa2).splitlines() if l.startswith("test result")]
    failed = [l for l in results if "FAILED" in l]
    ks = worst_errors(section(fa2, "kernels_gpu --test-threads=1 --nocapture"))
    ks.update(worst_errors(section(lg, "kernels_gpu_flash --test-threads=1 --nocapture")))
    sums = []
    for src, binary in [(fa2, "kernels_gpu "), (lg, "kernels_gpu_flash ")]:
        for tool in ["memcheck", "racecheck"]:
            sec = section(src, f"--tool {tool} --error-exitcode 9 .device-bin/{binary}")
            sums.append((tool, binary.strip(),
                         next((l.strip("= ").strip() for l in sec if "SUMMARY" in l), "no summary")))
    twins = [l for l in section(fa2, "cuda_twin --test-threads=1") if l.startswith("test ")]
    execs = [l for l in section(lg, ".device-bin/executor cuda") if l.startswith("test ")]
    one = [section(lg, "--steps 3 --warmup 1 (")[1], section(lg, "--nproc-per-node 1")[1]]
    benchl = [l for l in section(fa2, ".device-bin/kernels (") if "TFLOP/s" in l or "GB/s" in l]
    fa = tl["sdpa_flash_attention"]
    tf = {k: float(re.search(r"([0-9.]+) TFLOP", l).group(1)) for k, l in
          [("fwd", next(l for l in benchl if "flash_mma_fwd" in l)),
           ("fused", next(l for l in benchl if "backward (fused" in l)),
           ("det", next(l for l in benchl if "deterministic" in l))]}
    ncu_rows = []
    cur = None
    for line in (LATEST / "ncu_attention.txt").read_text().splitlines():
        m = re.match(r"\s+(flash_mma_\w+) \((\d+), (\d+), 1\)", line)
        if m:
            cur = {"kernel": m.group(1), "grid": f"{m.group(2)} x {m.group(3)}"}
            ncu_rows.append(cur)
            continue
        for key, pat in [("ms", r"Duration\s+(ms|us)\s+([0-9.]+)"),
                         ("sm", r"Compute \(SM\) Throughput\s+%\s+([0-9.]+)"),
                         ("regs", r"Registers Per Thread\s+register/thread\s+(\d+)"),
                         ("occ", r"Achieved Occupancy\s+%\s+([0-9.]+)")]:
            m = re.search(pat, line)
            if m and cur is not None and key not in cur:
                cur[key] = (float(m.group(2)) * (1e-3 if m.group(1) == "us" else 1.0)
                            if key == "ms" else m.group(1))
    mem = []
    for flags, o in zip(MIX_FLAGS, objects(LATEST / "memory.jsonl")):
        for r in o["ranks"]:
            mem.append((flags or "one rank", r["rank"], r["peak_bytes"], r["predicted_peak_bytes"]))
    worst_mem = max(abs(m / pr - 1) for _, _, m, pr in mem)
    val = [f"## Latest run: {LATEST.name}", "",
           f"Machine: {mach}. `bash scripts/gpu-proof.sh all` and `attn`, then, after the fused",
           "attention backward's grid changed to one block per query head, `bash scripts/gpu-proof.sh",
           f"fa2` on its rebuilt binaries; logs and outputs in `docs/gpu-results/{LATEST.name}/`",
           f"(`proof-log.txt`, `fa2-log.txt`). Test binaries: {len(results)} results, "
           f"{'none failed' if not failed else str(len(failed)) + ' failed'}.", "",
           "Kernels against their CPU twins (worst relative error; bounds fp32 1e-5, bf16 1e-2), the",
           "tensor-core attention in both backward modes (fused, then deterministic):", "",
           "| test | checks | worst relative error |", "| --- | --- | --- |"]
    val += [f"| `{t}` | {n} | {e:.2e} |" for t, (e, n) in sorted(ks.items())]
    val += ["", "| tool | binary | summary |", "| --- | --- | --- |"]
    val += [f"| {t} | `{b}` | {sm} |" for t, b, sm in sums]
    val += ["", "Whole steps against the CPU twin (`cuda_twin`, run twice: fused, then",
            "`PARSIM_CUDA_FLASH_DETERMINISTIC=1`) and the executor's CUDA tests; among them the",
            "owed one-rank bf16 three-step twin, the GPT-3-style twin at its 2e-4 bound and QK norm,",
            "the router bias and the MoE pattern on the GPU:", "", "```"]
    val += twins + execs + ["```", "", "Every mix on one GPU against the one-rank GPU run:", "",
                            "| mix | fp32 | bf16 |", "| --- | --- | --- |"]
    val += mix_rows(lg)
    val += ["", "NCCL with one rank against the single-process run:", "", "```"] + one + ["```", "",
            "Memory, measured peak against the engine of the run's commit (`tests/fixtures/gpu_memory.toml`):",
            "", "| mix | rank | measured GiB | predicted GiB | diff |", "| --- | --- | --- | --- | --- |"]
    val += [f"| `{f}` | {r} | {gib(m)} | {gib(pr)} | {(m / pr - 1) * 100:+.2f}% |"
            for f, r, m, pr in mem]
    val += ["", f"Worst: {worst_mem * 100:.2f}%.", "",
            "Two GPUs: NCCL between devices has never run (every lent machine had one GPU; the",
            "mixes above share it through the backend's device-copy collectives). What would prove",
            "it on a two-GPU machine: the memory mixes launched with `--nproc-per-node 2` (one",
            "process and NCCL communicator per GPU) against the same runs on one GPU, losses and",
            "parameters within the bounds above; the script has no such mode yet.", ""]
    perf = [f"## Latest run: attention on {g['name']} ({LATEST.name})", "",
            f"Machine: {mach}. `cargo bench -p parsim-executor --bench kernels` (s 4096, 32 query",
            "heads, 8 KV heads, d 128, causal) from `fa2-log.txt`, PyTorch's SDPA flash backend (32",
            "heads, d 128, causal) from `torch_layer.json` of the same machine:", "", "```"]
    perf += benchl + ["```", "", "| | forward TFLOP/s | backward TFLOP/s | ratio to SDPA (fwd, bwd) |",
                      "| --- | --- | --- | --- |",
                      f"| parsim, fused backward (default) | {tf['fwd']:.1f} | {tf['fused']:.1f} | "
                      f"{fa['fwd_tflops'] / tf['fwd']:.2f}x, {fa['bwd_tflops'] / tf['fused']:.2f}x |",
                      f"| parsim, deterministic backward | {tf['fwd']:.1f} | {tf['det']:.1f} | "
                      f"{fa['fwd_tflops'] / tf['fwd']:.2f}x, {fa['bwd_tflops'] / tf['det']:.2f}x |",
                      f"| PyTorch SDPA flash | {fa['fwd_tflops']:.1f} | {fa['bwd_tflops']:.1f} | |", "",
                      "Goals: backward within 1.5x, forward within 1.3x: both missed. Nsight Compute,",
                      "one launch each (`ncu_attention.txt`):", "",
                      "| kernel | grid | ms | SM throughput % | registers | achieved occupancy % |",
                      "| --- | --- | --- | --- | --- | --- |"]
    perf += [f"| `{r['kernel']}` | {r['grid']} | {r.get('ms', 0.0):.3f} | {r.get('sm', '')} | "
             f"{r.get('regs', '')} | {r.get('occ', '')} |" for r in ncu_rows]
    perf += ["", "What limits them: every kernel runs two or three blocks of four warps per SM (12-18%",
             "occupancy), bounded by registers (the fused backward at 255, the ceiling, holding dK and dV for 64",
             "keys x d 128 in registers) and shared memory; latency is not hidden and the SMs' compute",
             "stays at a third to a half. The first fused version, one block per key head (512 blocks",
             "under GQA 4:1, `ncu_attention_first_run.txt` has the forward only), ran no faster than",
             "the two kernels; one block per query head (2048) made the backward 1.31x faster. What",
             "would close the rest: 8 warps per block with 128-key tiles (FlashAttention-2's Hopper",
             "shapes) so each warp keeps fewer rows, and wgmma/TMA on sm_90.", ""]
    return val, perf


def gib(x):
    return f"{x / 2**30:.3f}"


cmd_setup = ("build here: `cargo build --release` and the test binaries (`cargo test --release "
             "--no-run`) copied into `.device-bin/`; on the GPU machine: `bash scripts/gpu-proof.sh all`")

LATEST_VAL, LATEST_PERF = latest_sections()
v = [f"# GPU validation ({LATEST.name}, {DATE})", ""] + LATEST_VAL + [f"## Full run: {DATE}", "",
     f"Machine: {machine}.", "",
     "Every figure below comes from one run of `scripts/gpu-proof.sh` on that machine (its log and",
     f"outputs are in `docs/gpu-results/{DATE}/`) and is written into this page by",
     "`python3 scripts/gpu_report.py`. How to repeat it: " + cmd_setup + "; the library",
     "folders of the machine's PyTorch wheels (NCCL, cuBLAS, NVRTC) are put on `LD_LIBRARY_PATH` by",
     "the script. Without a GPU every GPU test prints why it skips; the script sets",
     "`PARSIM_REQUIRE_GPU=1`, which turns each such skip into a failure with its reason.", "",
     "## 1. Kernels against their CPU twins", "",
     "`crates/executor/tests/kernels_gpu/main.rs` and `kernels_gpu_flash.rs`: fresh random inputs, outputs",
     "poisoned with NaN before each launch, shapes that are not multiples of the tiles (33 x 257,",
     "100/200/301 rows), forward and backward. Bounds: fp32 1e-5, bf16 1e-2 (relative error).", "",
     "| test | checks | worst relative error |", "| --- | --- | --- |"]
for t, (e, n) in sorted(kern.items()):
    v.append(f"| `{t}` | {n} | {e:.2e} |")
v += ["", "compute-sanitizer on the same tests:", "", "| tool | binary | summary | tests |",
      "| --- | --- | --- | --- |"]
for tool, binary, summary, ok in sanit:
    v.append(f"| {tool} | `{binary}` | {summary} | {ok} |")
v += ["", "## 2. Whole steps against the CPU backend", "",
      "`crates/executor/tests/cuda_twin/main.rs` (one rank) and `tests/executor/cuda.rs`'s CPU twin of TP 2 + SP,",
      "PP 2 and DP 2 ZeRO 1 (fp32 1e-5, bf16 1e-2), as they ran:", "", "```"]
v += twin_tests + [l for l in exec_tests if "cpu_twin" in l] + ["```", "",
      "Three tests failed in that run, each on a bound since changed, and ran again:",
      "- `a_bf16_step_on_the_tensor_core_kernels_matches_the_scalar_kernels` asked 1e-2 between the",
      "  tensor-core and the scalar flash kernels' gradients of a bf16 step (d 64) and got 1.03e-2;",
      "  the scalar kernels are themselves 1.04e-2 from the CPU there (the bf16 recipe's rounding),",
      "  so the test now asks each tensor to be as close to the CPU as the scalar kernels (within",
      "  25%) and within 2e-2 of them: it passed in the second run",
      f"  (`docs/gpu-results/{DATE}/twin-rerun-log.txt`).",
      "- `an_mla_step_with_narrower_value_heads_matches_the_cpu_twin` (1.68e-5) and",
      "  `a_gpt3_style_step_matches_the_cpu_twin` (1.16e-4, `layers.0.wv` with attention dropout)",
      "  asked 1e-5 of the parameters after two Adam steps. Every gradient of two steps (both steps'",
      "  dropout masks) agrees within 1e-5 (third run, end of `calibrate-log.txt`); Adam divides",
      "  each element's step by its own gradient scale, so near-zero gradients carry the summation",
      "  order's noise into a whole step. The parameter bound is now 2e-4 (gradients stay at 1e-5);",
      "  MLA passed at 1e-4 in the second run; the GPT-3-style step at 2e-4 has not run again.",
      "",
      "The one-rank bf16 three-step twin (`tp2_sp_pp2_and_dp2_steps_match_the_cpu_twin_on_the_gpu`,",
      "mix \"one rank\") was added after the last GPU run and has not run yet.", "",
      "## 3. Every mix on one GPU against the one-rank GPU run", "",
      "`tests/executor/cuda.rs::every_mix_on_one_gpu_matches_the_one_rank_gpu_run`: the ranks share",
      "the GPU through the backend's device-copy collectives; first loss and every parameter after",
      "three steps (largest difference over the tensor's largest value).", "",
      "| mix | fp32 | bf16 |", "| --- | --- | --- |"]
v += mix_rows(log)
v += ["", "NCCL with one rank (`--nproc-per-node 1`: the launcher, TCP rendezvous and",
      "`ncclCommInitRank`) against the single-process run of `tests/fixtures/gpu_memory.toml`:", "",
      "```"] + nccl + ["```", "",
      "## 4. Memory against the engine's prediction", "",
      "`parsim execute --config tests/fixtures/gpu_memory.toml --backend cuda --precision bf16",
      "--steps 2 --warmup 1 [mix] --json` (4 layers, hidden 2048, seq 4096, vocab 32768; every",
      "rank on the one GPU). Measured: the tracked peak (requested bytes); predicted: the engine's",
      "peak without the profile's runtime reserve (CUDA context and workspaces, which the driver's",
      "figure holds). Goal: within 5%.", "",
      "| mix | rank | measured GiB | predicted then GiB | diff | by category then (MiB, measured - predicted) | predicted now GiB | diff now | reserved GiB | GPU used GiB |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for (w, r, c, m, p, d, diff), (flags, stage) in zip(mem_rows, mix_of):
    cats = ", ".join(f"{k} {x:+.0f}" for k, x in diff.items() if abs(x) >= 0.5) or "all equal"
    pn = now[MIX_FLAGS.index("" if flags == "one rank" else flags)][stage]
    v.append(f"| `{flags}` | {r} | {gib(m)} | {gib(p)} | {(m / p - 1) * 100:+.2f}% | {cats} | "
             f"{gib(pn)} | {(m / pn - 1) * 100:+.2f}% | "
             f"{gib(d['pool_reserved_peak_bytes'])} | {gib(d['driver_used_bytes'])} |")
worst_now = max(abs(m / now[MIX_FLAGS.index("" if f == "one rank" else f)][st] - 1)
                for (_, _, _, m, _, _, _), (f, st) in zip(mem_rows, mix_of))
v += ["", "\"Then\" is the engine of the run's commit; \"now\" the engine at this page's commit on the",
      f"same configurations (worst now: {worst_now * 100:.2f}%). Weights, gradients and optimizer",
      "states were exact in every mix; the gaps were in the transient categories, and the run found",
      "an engine error: it counted the loss's backward as holding the logits' fp32 gradient beside",
      "the kept probabilities, where Megatron's vocab-parallel cross-entropy (and the executor)",
      "write the gradient over the probabilities. That over-predicted the output block's backward",
      "by n x vocab x 4 bytes (512 MiB here), which made ZeRO-3 miss the 5% goal (-8.13%): the",
      "CPU backend showed the same on a vocab-heavy model (ZeRO 1 -8.6%, ZeRO 2 -17%, exact after",
      "the fix). An earlier GPU run (before cross-entropy read bf16 logits in place) measured",
      "+3.38% for one rank, the f32 staging copy of the logits adding 256 MiB.", "",
      "## 5. Calibration on the GPU", "",
      "`parsim execute --calibrate --backend cuda --gpu h100-sxm --out h100-measured.toml`: the",
      "built-in GPU sweep (11 single-rank points, two held out), fitted from the shipped `h100-sxm`",
      "profile (\"before\") to the measured one (\"after\"), committed as",
      "`calibration/h100-measured.toml` with its measurements (`h100-measured.jsonl`); the",
      "provenance names the date, GPU and driver.", "", "```"] + cal_table + ["```", "",
      "Attention points were set aside as outliers: parsim's own attention kernels are slower than",
      "the FlashAttention-3 rates the profile times attention at (see performance.md), so the",
      "attention efficiency is not identifiable from this sweep and held-out error stays at 33%.", ""]
def nest(lines):
    """The full run's sections one level below its heading (after the latest run's)."""
    full = lines.index(next(l for l in lines if l.startswith("## Full run")))
    return lines[:full + 1] + ["#" + l if l.startswith("## ") else l for l in lines[full + 1:]]


(ROOT / "docs/gpu-validation.md").write_text("\n".join(nest(v)))

p = [f"# Performance on the GPU ({LATEST.name}, {DATE})", ""] + LATEST_PERF + [f"## Full run: {DATE}", "",
     f"Machine: {machine}. Figures from `scripts/gpu-proof.sh` (speed part) and",
     "`scripts/gpu_layer_torch.py` in the same run, written here by `scripts/gpu_report.py`.",
     "Times are CUDA events after warm-up (medians).", "",
     "## A GPT layer against PyTorch", "",
     f"One layer, hidden {h}, {torch['shape']['heads']} heads, seq {s}, micro batch {b}, bf16",
     "(LayerNorm, causal attention, 4h GeLU MLP, no biases): `tests/fixtures/gpu_layer.toml` on",
     "parsim (`parsim execute --config tests/fixtures/gpu_layer.toml --backend cuda --precision bf16",
     "--steps 6 --warmup 2 --compare-timeline`: the forward and backward actions' CUDA-event times;",
     "the vocabulary is 128, so embedding and loss add under 0.1% of the FLOPs) and",
     f"`python3 scripts/gpu_layer_torch.py` (PyTorch {torch['torch']}). Model FLOPs per forward",
     f"24 b s h^2 + 2 b s^2 h = {fwd_flops / 1e12:.2f} TFLOP, backward twice that. bf16 GEMM peak",
     f"measured in the same run (8192^3, torch.matmul): {peak / 1e12:.0f} TFLOP/s.", "",
     "| | forward + backward ms | TFLOP/s | MFU of measured peak |", "| --- | --- | --- | --- |"]
for name, ms in [("parsim CUDA backend", ours_ms), ("PyTorch eager", torch["eager"]["fwd_bwd_ms"]),
                 ("PyTorch, SDPA flash", torch["flash"]["fwd_bwd_ms"])]:
    t = 3 * fwd_flops / (ms * 1e-3)
    p.append(f"| {name} | {ms:.2f} | {t / 1e12:.0f} | {t / peak * 100:.1f}% |")
p += ["", f"Goal: at least as fast as PyTorch eager: met ({ours_ms:.2f} vs "
      f"{torch['eager']['fwd_bwd_ms']:.2f} ms). parsim's whole step of this layer (with the Adam step"
      f" over 202 M parameters, {act['optimizer']:.2f} ms) is {step_ms:.2f} ms.", "",
      "## Attention against PyTorch's flash backend", "",
      "`cargo bench -p parsim-executor --bench kernels` (s 4096, 32 query heads, 8 KV heads, d 128,",
      "causal; FLOPs as FlashAttention-2 counts them) and PyTorch's SDPA flash backend (32 heads, d",
      "128, causal) from the same run:", "", "```"] + bench + ["```", "",
      "| | forward TFLOP/s | backward TFLOP/s |", "| --- | --- | --- |"]
fa = torch["sdpa_flash_attention"]
mf = next(float(re.search(r"([0-9.]+) TFLOP", l).group(1)) for l in bench if "flash_mma_fwd" in l)
mb = next(float(re.search(r"([0-9.]+) TFLOP", l).group(1)) for l in bench if "flash_mma backward" in l)
p += [f"| parsim `flash_mma.cu` | {mf:.1f} | {mb:.1f} |",
      f"| PyTorch SDPA flash | {fa['fwd_tflops']:.1f} | {fa['bwd_tflops']:.1f} |",
      f"| ratio | {fa['fwd_tflops'] / mf:.2f}x | {fa['bwd_tflops'] / mb:.2f}x |", "",
      f"Goal: within 2x of PyTorch's flash: the forward meets it, the backward misses it "
      f"({fa['bwd_tflops'] / mb:.2f}x). What limits them: Nsight Compute on the forward shows 33% of",
      "the SMs' compute and 26% of L1 throughput in use, latency-bound with two blocks of four warps",
      "per SM at 165-250 registers; the backward runs dQ and dK/dV as two kernels that each",
      "recompute S and dP (7 matrix products where FlashAttention-2's atomic dQ needs 5) and",
      "overlaps only the next tile's loads (no warp specialisation, no wgmma/TMA on Hopper).", "",
      "## Where the layer's time goes", "",
      "Nsight Compute, one timed step of the layer plus one warm-up (`ncu --clock-control none",
      "--metrics gpu__time_duration.sum --print-summary per-kernel`), kernel time summed over both",
      "steps, the ten largest:", "", "| kernel | ms (2 steps) |", "| --- | --- |"]
for k, ms in sorted(ncu.items(), key=lambda kv: -kv[1])[:10]:
    p.append(f"| `{k[:70]}` | {ms:.3f} |")
p += ["", f"All kernels: {sum(ncu.values()):.2f} ms over the two steps.", ""]
# A whole small-model step: tests/fixtures/gpu_memory.toml, one rank (section 4 of
# gpu-validation.md): 4 layers, h 2048, 16 heads, 8 KV heads (d 128), ffn 5632, vocab 32768,
# seq 4096, global batch 4. Model FLOPs: 3 x forward, forward = 2 x tokens x (layer and output
# weights) + causal attention 2 b s^2 h per layer.
L, H, KV, F, V, S, G = 4, 2048, 8 * 128, 5632, 32768, 4096, 4
layer_w = H * H + 2 * H * KV + H * H + 3 * H * F
small_fwd = 2 * G * S * (L * layer_w + H * V) + L * 2 * G * S * S * H
small = objects(RES / "memory.jsonl")[0]
small_t = 3 * small_fwd / small["step_s"]
p += ["## A whole small-model training step", "",
      "`tests/fixtures/gpu_memory.toml` on one rank (4 layers, hidden 2048, GQA 16/8, ffn 5632,",
      "vocab 32768, seq 4096, global batch 4 in micro batches of 1, bf16, Adam), the first row of",
      f"gpu-validation.md's memory table: median step {small['step_s'] * 1e3:.1f} ms, model FLOPs",
      f"{3 * small_fwd / 1e12:.2f} TFLOP a step, {small_t / 1e12:.0f} TFLOP/s = "
      f"{small_t / peak * 100:.1f}% of the measured GEMM peak ({small_t / 989.4e12 * 100:.1f}% of the",
      "datasheet's 989 TFLOP/s).", ""]
(ROOT / "docs/performance.md").write_text("\n".join(nest(p)))
print("wrote docs/gpu-validation.md and docs/performance.md")
