#!/usr/bin/env python3
"""bench_gpu_torch.py: the PyTorch baseline of scripts/bench_gpu.lua, run by
it in a subprocess on the same GPU and the same configs (one JSON argument,
what bench_gpu.lua measures). Prints one JSON object on its last line:
matmul (torch.matmul: cuBLAS/cuBLASLt), attention (F.scaled_dot_product_attention
forward + backward: PyTorch's SDPA backends, flash on H100) and training
steps of the same Llama-style model as loom.models.transformer (RMSNorm,
interleaved rotary, SwiGLU, AdamW; bf16 through torch.autocast with f32
parameters). Times are medians of CUDA-event timings after warm-up. Without
torch or a GPU it prints {"error": why} and exits 0."""
import json
import math
import sys


def main():
    cfg = json.loads(sys.argv[1])
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # not installed: no baseline
        print(json.dumps({"error": "torch not importable: %s" % e}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch finds no CUDA device"}))
        return
    dev = torch.device("cuda")

    def timed(fn, reps):
        """median ms of reps calls, each between CUDA events, after 3 warm-ups"""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        return times[len(times) // 2]

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "matmul": [], "attention": [], "train": []}

    for m in cfg["matmul"]:
        n, kind = m["n"], m["dtype"]
        torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
        dt = torch.bfloat16 if kind == "bf16" else torch.float32
        pairs = [(torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt))
                 for _ in range(2 if n >= 4096 else 4)]  # rotate inputs: small ones would sit in L2
        it = [0]

        def mm():
            a, b = pairs[it[0] % len(pairs)]
            it[0] += 1
            return a @ b
        ms = timed(mm, m["reps"])
        out["matmul"].append({"n": n, "dtype": kind, "ms": ms, "tflops": 2 * n ** 3 / ms / 1e9})
    torch.backends.cuda.matmul.allow_tf32 = False

    for a in cfg["attention"]:
        B, H, T, D = a["batch"], a["heads"], a["seq"], a["head_dim"]
        dt = torch.bfloat16 if a["dtype"] == "bf16" else torch.float32
        q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, D, device=dev, dtype=dt)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=a["causal"])
            o.backward(g)
        ms = timed(step, a["reps"])
        out["attention"].append(dict(a, ms=ms))

    for t in cfg["train"]:
        out["train"].append(train_step(torch, F, dev, t, timed))
    print(json.dumps(out))


def train_step(torch, F, dev, t, timed):
    """ms per step of the Llama-style model, forward + backward + AdamW"""
    nn = torch.nn
    D, L, H, T, B, V = t["dim"], t["layers"], t["heads"], t["seq"], t["batch"], t["vocab"]
    hd, ffn = D // H, t["ffn_dim"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * self.weight

    inv = torch.exp(torch.arange(0, hd // 2, dtype=torch.float64) * (-2 * math.log(10000.0) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)

    def rope(x):  # (B, T, H, hd), pairs (2i, 2i+1) rotated
        xr = x.float().reshape(*x.shape[:-1], -1, 2)
        a, b = xr[..., 0], xr[..., 1]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))
            self.w1, self.w3 = nn.Linear(D, ffn, bias=False), nn.Linear(D, ffn, bias=False)
            self.w2 = nn.Linear(ffn, D, bias=False)

        def forward(self, x):
            h = self.n1(x)
            q, k, v = (w(h).view(B, T, H, hd) for w in (self.wq, self.wk, self.wv))
            q, k = rope(q), rope(k)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(B, T, D))
            h = self.n2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm, self.out = RMSNorm(), nn.Linear(D, V, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.out(self.norm(x))

    torch.manual_seed(0)
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)
    bf16 = t["dtype"] == "bf16"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float().view(-1, V), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    ms = timed(step, t["steps"])
    return dict(t, ms=ms, params=sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
