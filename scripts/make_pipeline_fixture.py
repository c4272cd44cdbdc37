#!/usr/bin/env python3
"""make_pipeline_fixture.py: what transformers' pipeline does with a folder
loom's hf.save_pretrained(model, dir, {tokenizer = tok}) wrote, into
spec/fixtures/pipeline/expected.json (spec/hf_save_tokenizer_spec.lua holds
loom to it).

The folder is made by loom itself (spec/support/pipeline_model.lua: a tiny
Qwen2-style model with integer-arithmetic weights and the Qwen2 tokenizer
fixture). Recorded: the SHA-256 of each file the pipeline loaded (the spec
checks loom writes the same bytes today), and the pipeline's greedy
continuation of the prompt as 0-based token ids (its tokenizer's encoding
of the prompt, then what model.generate(do_sample=False) adds, stopping at
the saved eos id) and as the pipeline's text.

    python3 -m venv /opt/hfenv && /opt/hfenv/bin/pip install torch transformers safetensors
    /opt/hfenv/bin/python scripts/make_pipeline_fixture.py
"""
import hashlib
import json
import os
import subprocess
import tempfile

from transformers import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT, NEW_TOKENS = "Hello world", 8   # as pipeline_model.lua says


def main():
    folder = tempfile.mkdtemp()
    env = dict(os.environ)
    env["LUA_PATH"] = f"{ROOT}/spec/?.lua;{ROOT}/lua/?.lua;{ROOT}/lua/?/init.lua;;"
    subprocess.run(["luajit", "spec/support/pipeline_model.lua", folder], cwd=ROOT, env=env, check=True)
    files = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            files[name] = hashlib.sha256(f.read()).hexdigest()
    pipe = pipeline("text-generation", model=folder)   # the folder as it is: model, tokenizer, generation config
    text = pipe(PROMPT, do_sample=False, max_new_tokens=NEW_TOKENS, return_full_text=False)[0]["generated_text"]
    prompt_ids = pipe.tokenizer(PROMPT, return_tensors="pt").input_ids
    out = pipe.model.generate(prompt_ids, do_sample=False, max_new_tokens=NEW_TOKENS)
    expected = {
        "transformers": __import__("transformers").__version__,
        "prompt": PROMPT, "max_new_tokens": NEW_TOKENS, "files": files,
        "prompt_ids": prompt_ids[0].tolist(), "generated_ids": out[0, prompt_ids.shape[1]:].tolist(),
        "pipeline_text": text,
    }
    os.makedirs(os.path.join(ROOT, "spec/fixtures/pipeline"), exist_ok=True)
    with open(os.path.join(ROOT, "spec/fixtures/pipeline/expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print(json.dumps(expected, indent=1))


if __name__ == "__main__":
    main()
