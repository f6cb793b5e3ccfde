"""Issue 16's speed reference: one GPT layer (pre-LayerNorm, fused QKV, causal attention,
output projection, 4h GeLU MLP; no biases, no dropout) forward + backward in bf16 on one GPU,
in PyTorch eager (attention as softmax(QK^T)V with the mask) and with
scaled_dot_product_attention's flash backend, plus the bf16 GEMM peak measured in the same run.
Times are CUDA events after warm-up, median of 20. Prints one JSON object.

Run on the GPU machine: python3 scripts/gpu_layer_torch.py [--hidden 4096 --heads 32 --seq 4096]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup=3, runs=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


class Layer(torch.nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h, bias=False)
        self.proj = torch.nn.Linear(h, h, bias=False)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, ffn, bias=False)
        self.fc2 = torch.nn.Linear(ffn, h, bias=False)

    def attention(self, q, k, v, how):
        if how == "eager":
            s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            n = s.shape[-1]
            mask = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x, how):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        a = self.attention(q, k, v, how).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    h, s, b, heads = a.hidden, a.seq, a.batch, a.heads
    torch.manual_seed(0)
    dev = "cuda"
    # GEMM peak: 8192^3 bf16 on random data.
    n = 8192
    x, y = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    gemm_ms = median_ms(lambda: x @ y)
    peak = 2 * n**3 / (gemm_ms * 1e-3)
    del x, y
    layer = Layer(h, heads, 4 * h).to(dev, torch.bfloat16)
    inp = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16)
    # Model FLOPs (causal attention counted half): forward 24 b s h^2 + 2 b s^2 h, backward 2x.
    fwd_flops = 24 * b * s * h * h + 2 * b * s * s * h
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "gemm_peak_flops": peak, "shape": {"hidden": h, "heads": heads, "seq": s, "batch": b}}
    for how in ["eager", "flash"]:
        fwd_ms = median_ms(lambda: layer(inp, how))
        def step():
            inp.grad = None
            layer(inp, how).backward(grad)
        step_ms = median_ms(step)
        out[how] = {"fwd_ms": fwd_ms, "fwd_bwd_ms": step_ms,
                    "tflops": 3 * fwd_flops / (step_ms * 1e-3) / 1e12,
                    "mfu_of_measured_peak": 3 * fwd_flops / (step_ms * 1e-3) / peak}
    # Attention alone (forward + backward) with the flash backend, causal, d = h / heads.
    q, k, v = (torch.randn(b, heads, s, h // heads, device=dev, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fa_fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        def fa_step():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
        fa_step_ms = median_ms(fa_step)
    att = 4 * b * heads * s * s * (h // heads) / 2
    out["sdpa_flash_attention"] = {"fwd_ms": fa_fwd, "fwd_tflops": att / (fa_fwd * 1e-3) / 1e12,
                                   "bwd_ms": fa_step_ms - fa_fwd,
                                   "bwd_tflops": 2.5 * att / ((fa_step_ms - fa_fwd) * 1e-3) / 1e12}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
