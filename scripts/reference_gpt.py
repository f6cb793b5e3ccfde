#!/usr/bin/env python3
"""A PyTorch reference training of a small GPT under torch.profiler (scripts/reference_gpt.toml).

Writes the Kineto trace of its profiled steps (`trace.json.gz`, record_shapes on, one file:
one rank) and the measured step times (`steps.json`) into --out, for
`parsim calibrate --trace` (docs/calibration.md, "The GPU loop"). Without torch or without a
GPU it prints why and exits 0 with --dry-run (CI runs it so), 1 otherwise.
"""
import argparse
import json
import os
import sys
import time
import tomllib


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "reference_gpt.toml"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="skip (exit 0) where torch or a GPU is absent")
    a = ap.parse_args()
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    m, t = cfg["model"], cfg["training"]
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"reference_gpt: skipped: PyTorch is not installed here ({e})")
        return 0 if a.dry_run else 1
    if not torch.cuda.is_available():
        print("reference_gpt: skipped: no CUDA device visible to PyTorch")
        return 0 if a.dry_run else 1
    torch.manual_seed(t["seed"])
    dev = "cuda"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[t["dtype"]]
    h, heads, ffn, vocab = m["hidden_size"], m["num_attention_heads"], m["ffn_hidden_size"], m["vocab_size"]
    s, b = t["seq_length"], t["micro_batch_size"]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(h)
            self.qkv = torch.nn.Linear(h, 3 * h)
            self.proj = torch.nn.Linear(h, h)
            self.ln2 = torch.nn.LayerNorm(h)
            self.up = torch.nn.Linear(h, ffn)
            self.down = torch.nn.Linear(ffn, h)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Gpt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, h)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(m["num_layers"]))
            self.ln = torch.nn.LayerNorm(h)
            self.head = torch.nn.Linear(h, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = Gpt().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = torch.randint(0, vocab, (b, s + 1), device=dev)

    def step():
        with torch.autocast("cuda", dtype=dtype):
            logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(t["warmup_steps"]):
        step()
    torch.cuda.synchronize()
    os.makedirs(a.out, exist_ok=True)
    times = []
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(t["profiled_steps"]):
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            prof.step()
    trace = os.path.join(a.out, "trace.json.gz")
    prof.export_chrome_trace(trace)
    with open(os.path.join(a.out, "steps.json"), "w") as f:
        json.dump({"config": cfg, "step_s": times, "loss": float(loss), "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(0)}, f, indent=1)
    print(f"reference_gpt: {len(times)} profiled steps, median {sorted(times)[len(times) // 2]:.4f} s; wrote {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
