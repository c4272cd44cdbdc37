"""bench_moe_torch.py: PyTorch eager running transformers' MixtralSparseMoeBlock
on the config of scripts/bench_moe.lua, for the baseline column of that
benchmark: forward, and forward + backward of sum(out * r), with the experts
as transformers runs them ("eager": a loop over the experts that received
tokens; "grouped_mm": torch's grouped GEMM, transformers' default for whole
models). A benchmark aid only: loom never imports PyTorch.
Prints one JSON line: {"torch": version, "<impl>": {"fwd_ms": ..., "fwd_bwd_ms": ...}, ...},
each the best of --rounds medians of --iters calls.
Usage: python3 scripts/bench_moe_torch.py --dim 512 --hidden 1024 --experts 8 --top-k 2 --tokens 2048 --threads 2
"""
import argparse
import json
import statistics
import time


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch baseline of scripts/bench_moe.lua (one JSON line).")
    for k, v in dict(dim=512, hidden=1024, experts=8, top_k=2, tokens=2048, iters=5, rounds=3, threads=0).items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--impls", default="eager,grouped_mm")
    return ap.parse_args()


if __name__ == "__main__":
    args = parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402
from transformers import MixtralConfig  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: E402


def timed(fn, iters, rounds):
    fn()
    fn()
    best = float("inf")
    for _ in range(rounds):
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        best = min(best, statistics.median(ts))
    return best * 1e3


def main():
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for impl in args.impls.split(","):
        cfg = MixtralConfig(hidden_size=args.dim, intermediate_size=args.hidden, num_local_experts=args.experts,
                            num_experts_per_tok=args.top_k, router_jitter_noise=0.0)
        cfg._experts_implementation = impl
        block = MixtralSparseMoeBlock(cfg)
        with torch.no_grad():
            block.gate.weight.normal_(0, 0.02)
            block.experts.gate_up_proj.normal_(0, 0.02)
            block.experts.down_proj.normal_(0, 0.02)
        x = torch.randn(1, args.tokens, args.dim, requires_grad=True)
        r = torch.randn(1, args.tokens, args.dim)

        def fwd():
            with torch.no_grad():
                block(x)

        def fwd_bwd():
            block.zero_grad(set_to_none=True)
            x.grad = None
            (block(x) * r).sum().backward()

        try:
            out[impl] = {"fwd_ms": timed(fwd, args.iters, args.rounds), "fwd_bwd_ms": timed(fwd_bwd, args.iters, args.rounds)}
        except Exception as e:  # an implementation this torch cannot run on the CPU
            out[impl] = {"error": str(e)[:200]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
