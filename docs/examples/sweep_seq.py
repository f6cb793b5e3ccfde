"""Sweep the sequence length of Llama-3-8B on 8 H100s and plot the step time (with its p10-p90
interval) and the per-GPU memory against the usable memory. Runs without a display (the Agg
backend); writes the PNG to the path given, else to a temporary directory.

    python docs/examples/sweep_seq.py [OUT.png]
"""

import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import parsim  # noqa: E402

BASE = {
    "model": {"preset": "llama3-8b"},
    "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
    "parallel": {"tp": 2, "cp": 1, "pp": 1},
    "training": {"global_batch_size": 64},
}
GIB = 2**30


def sweep(seqs):
    """One estimate per sequence length; a length the configuration refuses is skipped."""
    rows = []
    for seq in seqs:
        try:
            est = parsim.estimate(BASE, overrides={"training": {"seq_length": seq}})
        except parsim.ConfigError as e:
            print(f"seq {seq}: {e}", file=sys.stderr)
            continue
        rows.append((seq, est["time"], est["memory"]))
    return rows


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "sweep_seq.png")
    rows = sweep([2048, 4096, 8192, 16384, 32768])
    seqs = [s for s, _, _ in rows]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    ax_t.plot(seqs, [t["step_s"] for _, t, _ in rows], marker="o", label="step")
    ax_t.fill_between(
        seqs,
        [t["step_s_p10"] for _, t, _ in rows],
        [t["step_s_p90"] for _, t, _ in rows],
        alpha=0.3,
        label="p10 - p90",
    )
    ax_t.set(xscale="log", xlabel="sequence length", ylabel="step time (s)")
    ax_t.legend()
    ax_m.plot(seqs, [m["per_gpu_max_bytes"] / GIB for _, _, m in rows], marker="o", label="most loaded GPU")
    ax_m.plot(seqs, [m["usable_bytes"] / GIB for _, _, m in rows], linestyle="--", label="usable")
    ax_m.set(xscale="log", xlabel="sequence length", ylabel="memory (GiB)")
    ax_m.legend()
    fig.suptitle("Llama-3-8B on 8 x H100, TP 2, DP 4")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    for seq, t, m in rows:
        fits = "fits" if m["fits"] else "does not fit"
        print(f"seq {seq:6d}: step {t['step_s']:.3f} s, {m['per_gpu_max_bytes'] / GIB:.1f} GiB ({fits})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
