#!/usr/bin/env python3
"""make_safetensors_fixtures.py: writes the tiny Hugging Face checkpoints and
reference logits under spec/fixtures/ that spec/safetensors_spec.lua and
spec/dist/safetensors_spec.lua check loom against.

The checkpoints are written by the `safetensors` package (PyPI) in the
layout of transformers' LlamaForCausalLM and GPT2LMHeadModel; the logits
come from an independent numpy forward of those models (float64, written
as f32), with HF's rotate_half RoPE, so nothing here comes from loom.

    python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install numpy safetensors
    /tmp/stvenv/bin/python scripts/make_safetensors_fixtures.py

Each directory holds config.json, model.safetensors and reference.safetensors
(ids: i64 (B, T), 0-based token ids; logits: f32 (B, T, vocab)).
dtypes.safetensors holds one small tensor per dtype, with values the spec
spells out, and __metadata__.
"""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "fixtures")


def save(tensors, path, metadata=None):
    """tensors: name -> (safetensors dtype, numpy array of the storage)"""
    keep, specs = [], {}
    for name, (dtype, a) in tensors.items():
        a = np.array(a, order="C", copy=True)   # (ascontiguousarray would make a 0-d array 1-d)
        keep.append(a)
        specs[name] = TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
    serialize_file(specs, path, metadata=metadata)


def f32(a):
    return ("float32", np.asarray(a, dtype=np.float32))


def write(dirname, config, weights, ids, logits):
    d = os.path.join(OUT, dirname)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save({k: f32(v) for k, v in weights.items()}, os.path.join(d, "model.safetensors"), {"format": "pt"})
    save({"ids": ("int64", ids.astype(np.int64)), "logits": f32(logits)}, os.path.join(d, "reference.safetensors"))


# ---- numpy forwards (float64) ------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def causal_attention(q, k, v):
    """q, k, v: (B, H, T, hd)"""
    t, hd = q.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    return softmax(s) @ v


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def llama_forward(w, c, ids):
    g = {k: v.astype(np.float64) for k, v in w.items()}
    b, t = ids.shape
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    hd, eps = d // nh, c["rms_norm_eps"]
    inv = 1.0 / (c["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], -1)            # (T, hd), HF's layout
    cos, sin = np.cos(emb), np.sin(emb)
    h = g["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        x = rms_norm(h, g[p + "input_layernorm.weight"], eps)
        q = (x @ g[p + "self_attn.q_proj.weight"].T).reshape(b, t, nh, hd).transpose(0, 2, 1, 3)
        k = (x @ g[p + "self_attn.k_proj.weight"].T).reshape(b, t, nkv, hd).transpose(0, 2, 1, 3)
        v = (x @ g[p + "self_attn.v_proj.weight"].T).reshape(b, t, nkv, hd).transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        o = causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        h = h + o @ g[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, g[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ g[p + "mlp.gate_proj.weight"].T, x @ g[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ g[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, g["model.norm.weight"], eps)
    head = g["model.embed_tokens.weight"] if c["tie_word_embeddings"] else g["lm_head.weight"]
    return h @ head.T


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_forward(w, c, ids):
    g = {k: v.astype(np.float64) for k, v in w.items()}
    b, t = ids.shape
    d, nh, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    hd = d // nh
    h = g["transformer.wte.weight"][ids] + g["transformer.wpe.weight"][np.arange(t)]
    for i in range(c["n_layer"]):
        p = "transformer.h.%d." % i
        x = layer_norm(h, g[p + "ln_1.weight"], g[p + "ln_1.bias"], eps)
        qkv = x @ g[p + "attn.c_attn.weight"] + g[p + "attn.c_attn.bias"]   # Conv1D: (in, out)
        q, k, v = (a.reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, -1))
        o = causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        h = h + o @ g[p + "attn.c_proj.weight"] + g[p + "attn.c_proj.bias"]
        x = layer_norm(h, g[p + "ln_2.weight"], g[p + "ln_2.bias"], eps)
        m = gelu_tanh(x @ g[p + "mlp.c_fc.weight"] + g[p + "mlp.c_fc.bias"])
        h = h + m @ g[p + "mlp.c_proj.weight"] + g[p + "mlp.c_proj.bias"]
    h = layer_norm(h, g["transformer.ln_f.weight"], g["transformer.ln_f.bias"], eps)
    return h @ g["transformer.wte.weight"].T


# ---- checkpoints ---------------------------------------------------------------

def llama(rng, c):
    d, nh, nkv, f, v = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                        c["intermediate_size"], c["vocab_size"])
    hd = d // nh
    r = lambda *s, scale=0.3: (rng.standard_normal(s) * scale).astype(np.float32)
    w = {"model.embed_tokens.weight": r(v, d, scale=0.5),
         "model.norm.weight": 1 + r(d, scale=0.1)}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = 1 + r(d, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + r(d, scale=0.1)
        w[p + "self_attn.q_proj.weight"] = r(nh * hd, d)
        w[p + "self_attn.k_proj.weight"] = r(nkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = r(nkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = r(d, nh * hd)
        w[p + "mlp.gate_proj.weight"] = r(f, d)
        w[p + "mlp.up_proj.weight"] = r(f, d)
        w[p + "mlp.down_proj.weight"] = r(d, f)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = r(v, d)
    return w


def llama_config(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "max_position_embeddings": 32, "torch_dtype": "float32"}
    c.update(kw)
    return c


def gpt2(rng, c):
    d, v, n = c["n_embd"], c["vocab_size"], c["n_positions"]
    r = lambda *s, scale=0.3: (rng.standard_normal(s) * scale).astype(np.float32)
    w = {"transformer.wte.weight": r(v, d, scale=0.5), "transformer.wpe.weight": r(n, d, scale=0.2),
         "transformer.ln_f.weight": 1 + r(d, scale=0.1), "transformer.ln_f.bias": r(d, scale=0.1)}
    for i in range(c["n_layer"]):
        p = "transformer.h.%d." % i
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = 1 + r(d, scale=0.1)
            w[p + ln + ".bias"] = r(d, scale=0.1)
        w[p + "attn.c_attn.weight"] = r(d, 3 * d)     # Conv1D weights are (in, out)
        w[p + "attn.c_attn.bias"] = r(3 * d, scale=0.1)
        w[p + "attn.c_proj.weight"] = r(d, d)
        w[p + "attn.c_proj.bias"] = r(d, scale=0.1)
        w[p + "mlp.c_fc.weight"] = r(d, 4 * d)
        w[p + "mlp.c_fc.bias"] = r(4 * d, scale=0.1)
        w[p + "mlp.c_proj.weight"] = r(4 * d, d)
        w[p + "mlp.c_proj.bias"] = r(d, scale=0.1)
    return w


def dtypes():
    """one tensor per dtype; spec/safetensors_spec.lua spells out the values"""
    bf16 = np.array([[1.0, -2.5], [0.15625, -1024.0]], dtype=np.float32).view(np.uint32) >> 16
    save({"f32": f32([[1.5, -2.25, 3.0], [0.0, -0.0, 1e-3]]),
          "f64": ("float64", np.array([1.0 / 3.0, -1e300], dtype=np.float64)),
          "bf16": ("bfloat16", bf16.astype(np.uint16)),
          "f16": ("float16", np.array([0.5, -65504.0, 6.103515625e-05], dtype=np.float16)),
          "i32": ("int32", np.array([-2147483648, 7, 2147483647], dtype=np.int32)),
          "i64": ("int64", np.array([[2 ** 40 + 3], [-5]], dtype=np.int64)),
          "bool": ("bool", np.array([True, False, True], dtype=np.bool_)),
          "scalar": f32(np.float32(4.0).reshape(())),
          "empty": f32(np.zeros((0, 3)))},
         os.path.join(OUT, "dtypes.safetensors"), {"format": "pt", "note": "loom fixture"})


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240611)
    ids = rng.integers(0, 32, size=(2, 8))

    c = llama_config(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=1000.0,
                     tie_word_embeddings=False)
    w = llama(rng, c)
    write("hf_llama_gqa", c, w, ids, llama_forward(w, c, ids))

    c = llama_config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=10000.0,
                     tie_word_embeddings=True)
    w = llama(rng, c)
    write("hf_llama_tied", c, w, ids, llama_forward(w, c, ids))

    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 32, "n_positions": 16,
         "n_embd": 16, "n_layer": 2, "n_head": 4, "n_inner": None, "layer_norm_epsilon": 1e-5,
         "activation_function": "gelu_new", "tie_word_embeddings": True}
    w = gpt2(rng, c)
    write("hf_gpt2", c, w, ids, gpt2_forward(w, c, ids))

    dtypes()


if __name__ == "__main__":
    main()
