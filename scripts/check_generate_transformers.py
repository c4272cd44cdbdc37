#!/usr/bin/env python3
"""check_generate_transformers.py: spec/fixtures/<model>/generate.json (the
greedy continuations spec/generate_spec.lua compares loom with) against
transformers' generate(do_sample=False) on the same tiny checkpoints.
Needs torch and transformers (pip install --break-system-packages torch
transformers): a cross-check of the fixtures, never a dependency of loom.
Prints one line per case and "all identical" or "MISMATCH" (exit 1).

    python3 scripts/check_generate_transformers.py
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    ok = True
    for name in ["hf_llama_gqa", "hf_llama_tied", "hf_gpt2"]:
        d = os.path.join(ROOT, "spec", "fixtures", name)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with open(os.path.join(d, "generate.json")) as f:
            cases = json.load(f)["cases"]
        for c in cases:
            prompt = torch.tensor([c["prompt"]])
            n = len(c["greedy"]) - len(c["prompt"])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=n, min_new_tokens=n, pad_token_id=0)[0].tolist()
            same = out == c["greedy"]
            ok = ok and same
            print(f"{name}: prompt of {len(c['prompt'])} + {n} greedy tokens:", "identical" if same else "DIFFERENT")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}:",
          "all identical" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
