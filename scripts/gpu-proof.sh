#!/usr/bin/env bash
# The GPU checks of docs/gpu-validation.md in one run: run on the GPU machine from the
# repository root, with the binaries built elsewhere in .device-bin/ (see the doc).
# Writes everything to $OUT (default ./gpu-out).
set -u
# Every GPU test's "skipped" (no driver, no GPU, a library missing) fails here instead: on the
# lent GPU a broken device lookup must not pass as a skip.
export PARSIM_REQUIRE_GPU=1
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
B="${PARSIM_BIN_DIR:-.device-bin}"
LOG="$OUT/log.txt"
say() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
step() { local t="$1"; shift; say "$*"; timeout "$t" "$@" >>"$LOG" 2>&1; echo "exit $?" | tee -a "$LOG"; }
# Libraries: the NCCL, cuBLAS and NVRTC of the machine's PyTorch wheels.
PY=/opt/torch/.venv/bin/python3
SP=$($PY -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
mkdir -p /tmp/parsim-lib
for l in libnccl.so.2 libcublasLt.so.13 libcublas.so.13 libnvrtc.so.13; do
  f=$(find "$SP/nvidia" -name "$l" 2>/dev/null | head -1)
  [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "$l: ${f:-not found}" >>"$LOG"
done
f=$(find "$SP/nvidia" -name libnccl.so.2 | head -1); [ -n "$f" ] && ln -sf "$f" /tmp/parsim-lib/libnccl.so
export LD_LIBRARY_PATH="/tmp/parsim-lib:$LD_LIBRARY_PATH"
# Test binaries carry their build paths: make them resolve here.
mkdir -p target/release && cp "$B/parsim" target/release/parsim
# The root they were built in: /work/main, or the one named in $B/build-root.
for root in /work/main $(cat "$B/build-root" 2>/dev/null); do
  [ -e "$root" ] || { mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; }
done
say "machine"; nvidia-smi >>"$LOG" 2>&1
step 120 "$B/parsim" doctor
"$B/parsim" doctor --json >"$OUT/doctor.json" 2>>"$LOG"
case "${1:-all}" in
all|check)
step 120 "$B/kernels_gpu" --test-threads=1 --nocapture
step 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/kernels_gpu" --test-threads=1
step 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/kernels_gpu" --test-threads=1
step 120 "$B/kernels_gpu_flash" --test-threads=1 --nocapture
step 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/kernels_gpu_flash" --test-threads=1
step 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/kernels_gpu_flash" --test-threads=1
step 150 "$B/cuda_twin" --test-threads=1 --nocapture
# The whole-step twins again on the deterministic two-kernel attention backward.
PARSIM_CUDA_FLASH_DETERMINISTIC=1 step 150 "$B/cuda_twin" --test-threads=1 --nocapture
step 60 "$B/numerics" collectives:: --test-threads=1 --nocapture
step 300 "$B/executor" cuda --test-threads=1 --nocapture
# NCCL with one rank: the launcher's path (TCP rendezvous, ncclCommInitRank) against the
# single-process run of the same one-GPU configuration: the losses must agree.
step 120 "$B/parsim" execute --config tests/fixtures/gpu_memory.toml --backend cuda --precision bf16 --steps 3 --warmup 1
step 120 "$B/parsim" execute --config tests/fixtures/gpu_memory.toml --backend cuda --precision bf16 --steps 3 --warmup 1 --nproc-per-node 1
;;&
all|speed)
# Speed: issue 16's GPT layer, ours and PyTorch's, and the kernel bench.
step 180 "$B/parsim" execute --config tests/fixtures/gpu_layer.toml --backend cuda --precision bf16 --steps 6 --warmup 2 --compare-timeline
"$B/parsim" execute --config tests/fixtures/gpu_layer.toml --backend cuda --precision bf16 --steps 6 --warmup 2 --json >"$OUT/layer.json" 2>>"$LOG"
say "torch layer"; $PY scripts/gpu_layer_torch.py >"$OUT/torch_layer.json" 2>>"$LOG"; cat "$OUT/torch_layer.json" >>"$LOG"
step 60 "$B/kernels"
;;&
all|memory)
# Memory: measured peak per rank against the engine's prediction, several mixes on one GPU.
for mix in "" "--tp 2 --sp --gpus 2" "--pp 2 --gpus 2" "--dp 2 --zero 1 --gpus 2" "--dp 2 --zero 3 --gpus 2" "--cp 2 --gpus 2"; do
  say "memory $mix"
  timeout 120 "$B/parsim" execute --config tests/fixtures/gpu_memory.toml --backend cuda --precision bf16 --steps 2 --warmup 1 $mix --json >>"$OUT/memory.jsonl" 2>>"$LOG"
  echo "exit $?" | tee -a "$LOG"
done
;;&
profile)
# Kernel time by kernel over one timed step of the layer (Nsight Compute, clocks left alone).
say "ncu layer"; timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel "$B/parsim" execute --config tests/fixtures/gpu_layer.toml --backend cuda --precision bf16 --steps 2 --warmup 1 >"$OUT/ncu_layer.txt" 2>&1; echo "exit $?" | tee -a "$LOG"
;;
fa2)
# The attention backward alone (after a kernel change): its twins in both modes, the
# sanitizers, the whole-step twins, the bench, then Nsight Compute as in `attn`.
step 120 "$B/kernels_gpu" --test-threads=1 --nocapture
step 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/kernels_gpu" --test-threads=1
step 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/kernels_gpu" --test-threads=1
step 150 "$B/cuda_twin" --test-threads=1 --nocapture
PARSIM_CUDA_FLASH_DETERMINISTIC=1 step 150 "$B/cuda_twin" --test-threads=1 --nocapture
step 60 "$B/kernels"
;;&
attn|fa2)
# What limits the attention kernels: Nsight Compute on one launch each of the tensor-core
# forward and the fused and deterministic backwards at the bench's shape (clocks left alone).
: >"$OUT/ncu_attention.txt"
for k in fwd bwd dq dkdv; do
  say "ncu flash_mma_${k}_d128"; timeout 120 ncu --clock-control none -k "flash_mma_${k}_d128" -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "$B/kernels" >>"$OUT/ncu_attention.txt" 2>&1; echo "exit $?" | tee -a "$LOG"
done
;;
calibrate)
# The calibration loop with op timings and its held-out check, within 8 minutes (the script
# keeps its own budget): docs/calibration.md, "The GPU loop".
say "calibrate"; OUT="$OUT" PARSIM="$B/parsim" bash scripts/gpu-calibrate.sh >>"$LOG" 2>&1; echo "exit $?" | tee -a "$LOG"
;;
esac
say done
