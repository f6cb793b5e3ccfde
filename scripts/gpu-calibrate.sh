#!/usr/bin/env bash
# The calibration loop on a lent GPU, within 8 minutes of device time (docs/calibration.md,
# "The GPU loop"): measure the built-in GPU sweep with op timings (`parsim execute --calibrate
# --backend cuda`, every point the fastest of three runs), fit the profile of the GPU found
# (rate tables from the fitting runs' op timings, then the scalars) and print the held-out
# check and the per-class report; then the trace path: one run of parsim's own traced with its
# op timings (`execute --trace --profile-ops`) and a PyTorch reference training of a small GPT
# under torch.profiler (scripts/reference_gpt.py), each fitted by `calibrate --trace`;
# everything goes to $OUT.
#
#   bash scripts/gpu-proof.sh calibrate     # on the GPU machine (sets up the CUDA libraries)
#   bash scripts/gpu-calibrate.sh --dry-run # anywhere: the same steps on the CPU backend with a
#                                           # two-point sweep (CI runs this)
#
# The binary: $PARSIM (default .device-bin/parsim on the GPU machine, target/debug/parsim or
# target/release/parsim in a dry run, whichever exists).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
# The whole loop's device-time budget: the sweep and the fit together.
BUDGET_S="${BUDGET_S:-480}"

if [ "${1:-}" = "--dry-run" ]; then
    if [ -z "${PARSIM:-}" ]; then
        for b in target/debug/parsim target/release/parsim; do
            [ -x "$b" ] && { PARSIM=$b; break; }
        done
    fi
    [ -x "${PARSIM:-}" ] || { echo "gpu-calibrate: no parsim binary (cargo build first)" >&2; exit 1; }
    sweep="$OUT/dry-sweep.jsonl"
    # Two tiny points of the CPU sweep's kind: one fitted, one held out.
    cat >"$sweep" <<'J'
{"label": "dry h64", "holdout": false, "config": {"model": {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 1, "num_query_groups": 1, "ffn_hidden_size": 128, "vocab_size": 128}, "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "pp": 1, "cp": 1, "sp": false}, "training": {"seq_length": 64, "micro_batch_size": 1, "global_batch_size": 1}}}
{"label": "dry h64 s128", "holdout": true, "config": {"model": {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 1, "num_query_groups": 1, "ffn_hidden_size": 128, "vocab_size": 128}, "cluster": {"num_gpus": 1}, "parallel": {"tp": 1, "pp": 1, "cp": 1, "sp": false}, "training": {"seq_length": 128, "micro_batch_size": 1, "global_batch_size": 1}}}
J
    measure=("$PARSIM" execute --calibrate --backend cpu --sweep "$sweep" --out "$OUT/measured.toml")
    profile=cpu
    traced=("$PARSIM" execute --config tests/fixtures/executor_small.toml --backend cpu --steps 2 --warmup 1)
    reference_flags=(--dry-run)
else
    PARSIM="${PARSIM:-${PARSIM_BIN_DIR:-.device-bin}/parsim}"
    # On the lent GPU a GPU test that cannot find its device fails rather than skips (the dry
    # run above leaves the variable alone: it runs where there is no GPU).
    export PARSIM_REQUIRE_GPU=1
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    case "$name" in
        *H200*) profile=h200 ;;
        *H100*) profile=h100-sxm ;;
        *) echo "gpu-calibrate: no H100 or H200 found (nvidia-smi: '${name:-none}'); use --dry-run without a GPU" >&2; exit 1 ;;
    esac
    measure=("$PARSIM" execute --calibrate --backend cuda --gpu "$profile" --out "$OUT/measured.toml")
    traced=("$PARSIM" execute --config tests/fixtures/gpu_layer.toml --backend cuda --gpu "$profile")
    reference_flags=()
fi

start=$(date +%s)
echo "=== measure the sweep: ${measure[*]}"
timeout "$BUDGET_S" "${measure[@]}" >"$OUT/calibrate-sweep.txt" 2>&1 || {
    status=$?
    cat "$OUT/calibrate-sweep.txt"
    echo "gpu-calibrate: the sweep failed (exit $status; 124: past the ${BUDGET_S} s budget)" >&2
    exit "$status"
}
left=$((BUDGET_S - ($(date +%s) - start)))
[ "$left" -gt 0 ] || { echo "gpu-calibrate: no budget left for the fit" >&2; exit 1; }
echo "=== held-out check and per-class report (from $profile)"
timeout "$left" "$PARSIM" calibrate --measurements "$OUT/measured.jsonl" --profile "$profile" \
    --report --ops-png "$OUT/ops.png" --json >"$OUT/calibrate-report.json"
timeout "$left" "$PARSIM" calibrate --measurements "$OUT/measured.jsonl" --profile "$profile" \
    --report | tee "$OUT/calibrate-report.txt"
echo "=== the trace path: parsim's own run as a Kineto trace, fitted by calibrate --trace"
timeout "$left" "${traced[@]}" --profile-ops --trace "$OUT/parsim-trace.json" >"$OUT/traced-run.txt"
timeout "$left" "$PARSIM" calibrate --trace "$OUT/parsim-trace.json" --gpu "$profile" \
    --out "$OUT/trace-fitted.toml" | tee "$OUT/trace-fit.txt"
echo "=== the PyTorch reference trainer under torch.profiler (scripts/reference_gpt.py)"
py="${PYTHON:-/opt/torch/.venv/bin/python3}"
[ -x "$py" ] || py=python3
timeout "$left" "$py" scripts/reference_gpt.py --out "$OUT/reference" "${reference_flags[@]}"
if [ -e "$OUT/reference/trace.json.gz" ]; then
    timeout "$left" "$PARSIM" calibrate --trace "$OUT/reference/trace.json.gz" --gpu "$profile" \
        --out "$OUT/reference-fitted.toml" | tee "$OUT/reference-trace-fit.txt"
fi
echo "=== done in $(( $(date +%s) - start )) s (budget ${BUDGET_S} s); results in $OUT"
