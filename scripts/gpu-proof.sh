#!/usr/bin/env bash
# The GPU checks of docs/gpu-validation.md in one run: run on the GPU machine from the
# repository root, with the binaries built elsewhere in .device-bin/ (see the doc).
# Writes everything to $OUT (default ./gpu-out).
set -u
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
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
say "machine"; nvidia-smi >>"$LOG" 2>&1
step 120 "$B/parsim" doctor
"$B/parsim" doctor --json >"$OUT/doctor.json" 2>>"$LOG"
step 120 "$B/kernels_gpu" --test-threads=1 --nocapture
step 120 "$B/kernels_gpu_flash" --test-threads=1 --nocapture
step 150 "$B/cuda_twin" --test-threads=1 --nocapture
step 60 "$B/collectives" --test-threads=1 --nocapture
step 120 "$B/executor" cuda --test-threads=1 --nocapture
step 60 "$B/parsim" execute --config tests/fixtures/executor_small.toml --backend cuda
step 60 "$B/parsim" execute --config tests/fixtures/executor_small.toml --backend cuda --precision bf16
step 60 "$B/kernels"
say done
