#!/usr/bin/env python3
"""make_generate_fixtures.py: the greedy continuations of the tiny Hugging
Face checkpoints under spec/fixtures/ (hf_llama_gqa, hf_llama_tied, hf_gpt2),
written as spec/fixtures/<name>/generate.json for spec/generate_spec.lua.

Greedy decoding as transformers' generate(do_sample=False): at each step the
argmax of the last position's logits, from the full forward of the sequence
so far. The forwards are make_safetensors_fixtures.py's independent numpy
models (float64, HF's layouts), not loom's. (PyTorch could not be installed
on the machine that made them: download.pytorch.org was unreachable and
PyPI's wheel brings gigabytes of CUDA libraries.) Each step's margin
between the best and the second logit is checked, so f32 cannot flip it.
scripts/check_generate_transformers.py checks the result against
transformers' generate (identical with transformers 5.24, torch 2.15).

    pip install --break-system-packages numpy safetensors
    python3 scripts/make_generate_fixtures.py
Ids in the file are 0-based (HF's); loom's are one more.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_safetensors_fixtures import OUT, gpt2_forward, llama_forward  # noqa: E402

MIN_MARGIN = 1e-3


def greedy(forward, w, c, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        logits = forward(w, c, np.array([ids]))[0, -1]
        order = np.argsort(-logits, kind="stable")
        margins.append(float(logits[order[0]] - logits[order[1]]))
        ids.append(int(order[0]))
    return ids, min(margins)


def main():
    for name, forward, max_pos in [("hf_llama_gqa", llama_forward, "max_position_embeddings"),
                                   ("hf_llama_tied", llama_forward, "max_position_embeddings"),
                                   ("hf_gpt2", gpt2_forward, "n_positions")]:
        d = os.path.join(OUT, name)
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        w = load_file(os.path.join(d, "model.safetensors"))
        cases = []
        for seed in range(20):
            rng = np.random.default_rng(seed)
            prompt = [int(x) for x in rng.integers(0, c["vocab_size"], size=int(rng.integers(1, 6)))]
            n = c[max_pos] - len(prompt)
            ids, margin = greedy(forward, w, c, prompt, n)
            if margin >= MIN_MARGIN:
                cases.append({"prompt": prompt, "greedy": ids, "min_margin": margin})
            if len(cases) == 3:
                break
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump({"cases": cases}, f, indent=1)
        print(name, [len(x["greedy"]) for x in cases], "min margins", [round(x["min_margin"], 4) for x in cases])


if __name__ == "__main__":
    main()
