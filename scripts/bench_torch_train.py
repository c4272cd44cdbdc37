"""bench_torch_train.py: PyTorch eager on the config of scripts/bench_train.lua,
the same Llama-style model (RMSNorm, interleaved rotary embeddings, causal
attention, SwiGLU, no biases) and AdamW, for the baseline column of that
benchmark. It is a benchmark aid only: loom never imports PyTorch.
Prints one JSON line: {"step_ms": median, "tokens_per_s": ..., "torch": version}.
Usage: python3 scripts/bench_torch_train.py --layers 4 --dim 128 --heads 4 --seq 64 --batch 12 --steps 20 --dtype f32
With --tp N (N > 1) it spawns N CPU processes (gloo) and runs the model under
the tensor-parallel plan of loom's transformer.tp_plan (loss_parallel): the
step time is the slowest rank's median, tokens/s counts the global batch, and
the line gains "tp": N. --threads sets the threads of each rank.
With --gemm "M,K,N,ta,tb;..." it times torch.matmul on those shapes instead
(ta/tb 1: that operand is a transposed view), f32 and bf16, best of --reps,
for scripts/bench_gemm.lua: {"gemm": {"f32": [GFLOP/s...], "bf16": [...]}, ...}.
"""
import argparse
import json
import math
import os
import socket
import statistics
import time


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch baseline of scripts/bench_train.lua (one JSON line).")
    for k, v in dict(layers=4, dim=128, heads=4, seq=64, batch=12, steps=20, vocab=65, threads=0).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel degree: N > 1 spawns N CPU ranks (gloo) under loom's tp_plan")
    ap.add_argument("--gemm", default="", help="time torch.matmul on \"M,K,N,ta,tb;...\" instead of training")
    ap.add_argument("--reps", type=int, default=5, help="--gemm: best of this many calls")
    return ap.parse_args()


if __name__ == "__main__":
    parse_args()   # --help and bad flags answer before torch is imported: it need not be installed

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


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
        hd = d // self.heads   # under TP a rank holds heads / tp of them: view by head size
        q, k, v = (w(h).view(b, t, -1, hd) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, t, -1))
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


def timed_steps(o, step, sync=None):
    """3 warm-up steps, then the median of o.steps timed ones (ms); sync() before each"""
    for _ in range(3):
        step()
    times = []
    for _ in range(o.steps):
        if sync:
            sync()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def gemm_main(o):
    """torch.matmul's GFLOP/s on each shape of o.gemm, f32 and bf16, best of o.reps after one warm-up"""
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    out = {"f32": [], "bf16": []}
    for spec in o.gemm.split(";"):
        m, k, n, ta, tb = (int(v) for v in spec.split(","))
        for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(k, m).to(dt).t() if ta else torch.randn(m, k).to(dt)
            b = torch.randn(n, k).to(dt).t() if tb else torch.randn(k, n).to(dt)
            torch.matmul(a, b)
            best = math.inf
            for _ in range(o.reps):
                t0 = time.perf_counter()
                torch.matmul(a, b)
                best = min(best, time.perf_counter() - t0)
            out[name].append(2 * m * n * k / best / 1e9)
    print(json.dumps({"gemm": out, "torch": torch.__version__, "threads": torch.get_num_threads()}))


def main():
    o = parse_args()
    if o.gemm:
        return gemm_main(o)
    if o.tp > 1:
        return tp_main(o)
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

    ms = timed_steps(o, step)
    print(json.dumps({"step_ms": ms, "tokens_per_s": o.batch * o.seq / (ms / 1e3), "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


def tp_plan():
    """loom's transformer.tp_plan with loss_parallel and no sequence parallelism,
    in this model's names: the embedding Rowwise (vocabulary-parallel, output
    replicated), wq/wk/wv and w1/w3 Colwise, wo and w2 Rowwise, the norms
    replicated, the output Colwise kept sharded on the vocabulary (a DTensor)"""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "out": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)}
    for name in ("wq", "wk", "wv", "w1", "w3"):
        plan["blocks.*." + name] = ColwiseParallel()
    for name in ("wo", "w2"):
        plan["blocks.*." + name] = RowwiseParallel()
    return plan


def tp_rank(rank, o, port):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=o.tp)
    torch.set_num_threads(o.threads if o.threads > 0 else 1)
    mesh = init_device_mesh("cpu", (o.tp,), mesh_dim_names=("tp",))
    torch.manual_seed(0)   # the same model and batch on every rank, as in loom's TP run
    model = Model(o.vocab, o.dim, o.layers, o.heads, o.seq)
    parallelize_module(model, mesh, tp_plan(), src_data_rank=None)   # each rank shards its own copy
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, o.vocab, (o.batch, o.seq))
    y = torch.randint(0, o.vocab, (o.batch, o.seq))
    amp = o.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        opt.step()

    ms = timed_steps(o, step, dist.barrier)
    slowest = torch.tensor([ms], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    ms = slowest.item()
    if rank == 0:
        print(json.dumps({"step_ms": ms, "tokens_per_s": o.batch * o.seq / (ms / 1e3), "torch": torch.__version__,
                          "threads": torch.get_num_threads(), "tp": o.tp}), flush=True)
    dist.destroy_process_group()


def tp_main(o):
    """spawns o.tp ranks on this machine over gloo; rank 0 prints the line"""
    import torch.multiprocessing as mp
    if o.heads % o.tp != 0:
        raise SystemExit(f"bench_torch_train.py: --heads {o.heads} must divide by --tp {o.tp}")
    with socket.socket() as s:   # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(tp_rank, args=(o, port), nprocs=o.tp, join=True)


if __name__ == "__main__":
    main()
