"""bench_torch_train.py: PyTorch eager on the config of scripts/bench_train.lua,
the same Llama-style model (RMSNorm, interleaved rotary embeddings, causal
attention, SwiGLU, no biases) and AdamW, for the baseline column of that
benchmark. It is a benchmark aid only: loom never imports PyTorch.
Prints one JSON line: {"step_ms": median, "tokens_per_s": ..., "torch": version}.
Usage: python3 scripts/bench_torch_train.py --layers 4 --dim 128 --heads 4 --seq 64 --batch 12 --steps 20 --dtype f32
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, hd, theta=10000.0):
    inv = theta ** (-torch.arange(0, hd, 2).double() / hd)
    ang = torch.outer(torch.arange(seq).double(), inv)
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):  # x (B, T, H, D), pairs (2i, 2i+1) rotate
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.an, self.fn = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.an(x)
        q, k, v = (w(h).view(b, t, self.heads, -1) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, t, d))
        h = self.fn(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Model(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        ffn = 32 * math.ceil((2 * 4 * dim // 3) / 32)
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.norm, self.out = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids):
        h = self.emb(ids)
        for blk in self.blocks:
            h = blk(h, self.cos, self.sin)
        return self.out(self.norm(h))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=4, dim=128, heads=4, seq=64, batch=12, steps=20, vocab=65, threads=0).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--dtype", default="f32")
    o = ap.parse_args()
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    torch.manual_seed(0)
    model = Model(o.vocab, o.dim, o.layers, o.heads, o.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, o.vocab, (o.batch, o.seq))
    y = torch.randint(0, o.vocab, (o.batch, o.seq))
    amp = o.dtype == "bf16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x).view(-1, o.vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    times = []
    for _ in range(o.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    print(json.dumps({"step_ms": ms, "tokens_per_s": o.batch * o.seq / (ms / 1e3), "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
