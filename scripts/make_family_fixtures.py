#!/usr/bin/env python3
"""make_family_fixtures.py: the tiny Hugging Face checkpoints of the model
families loom imports, and what transformers computes with them, under
spec/fixtures/families/<name>/ (spec/hf_families_spec.lua and
spec/dist/hf_families_spec.lua check loom against them).

Each model is built by transformers from a config (random weights, nothing
downloaded), its parameters nudged by noise so that norms and biases are not
trivial, and saved with save_pretrained (config.json, model.safetensors).
reference.safetensors holds, from transformers in float32 with eager
attention:
  ids, targets     i64 (2, 12), 0-based token ids (HF's)
  logits           f32 (2, 12, vocab): model(ids)
  loss             f64 (1): cross entropy of logits against targets (mean)
  grad.<name>      the gradient of loss for each parameter (HF names)
  step.<name>      each parameter after one torch.optim.AdamW step
                   (lr 1e-3, betas (0.9, 0.95), eps 1e-3, weight_decay 0.1: an eps
                   that keeps the step a smooth function of the gradient, so
                   that rounding in the gradient stays rounding in the step)
  prompt, greedy   i64 (1, 5) and the ids generate(do_sample=False,
                   max_new_tokens=8) returns after it

    python3 -m venv /opt/hfenv && /opt/hfenv/bin/pip install torch transformers safetensors
    /opt/hfenv/bin/python scripts/make_family_fixtures.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "fixtures", "families")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)

FAMILIES = {
    # Llama 3.1's RoPE frequency scaling, untied (the original context short
    # enough that every kind of frequency occurs at head_dim 8)
    "llama3": dict(model_type="llama", tie_word_embeddings=False,
                   rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                        high_freq_factor=4.0, original_max_position_embeddings=16)),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_parameters=dict(rope_type="default",
                                                                                      rope_theta=1000000.0)),
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", sliding_window=5, tie_word_embeddings=False),
    "phi3": dict(model_type="phi3", sliding_window=6, tie_word_embeddings=False, pad_token_id=0),
    "gemma": dict(model_type="gemma", head_dim=16, tie_word_embeddings=True),
    "olmo2": dict(model_type="olmo2", tie_word_embeddings=False),
    # mixtures of experts, their router's load-balancing loss in the loss
    "mixtral": dict(model_type="mixtral", sliding_window=6, tie_word_embeddings=False, num_local_experts=4,
                    num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, tie_word_embeddings=False, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True, output_router_logits=True,
                      router_aux_loss_coef=0.02),
}


def build(name, spec):
    kw = dict(BASE)
    kw.update(spec)
    model_type = kw.pop("model_type")
    config = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def saved_names(model, tensors):
    """name -> tensor in the names and layout save_pretrained writes: a
    mixture of experts' fused gate_up_proj (E, 2I, H) and down_proj as one
    tensor per expert (Mixtral under block_sparse_moe, w1/w3/w2; Qwen3-MoE
    gate_proj/up_proj/down_proj)"""
    mixtral = model.config.model_type == "mixtral"
    out = {}
    for name, t in tensors.items():
        if ".mlp.experts.gate_up_proj" in name or ".mlp.experts.down_proj" in name:
            base = name.split(".mlp.experts.")[0] + (".block_sparse_moe.experts." if mixtral else ".mlp.experts.")
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                if name.endswith("gate_up_proj"):
                    out[base + "%d.%s.weight" % (e, "w1" if mixtral else "gate_proj")] = t[e, :half].clone()
                    out[base + "%d.%s.weight" % (e, "w3" if mixtral else "up_proj")] = t[e, half:].clone()
                else:
                    out[base + "%d.%s.weight" % (e, "w2" if mixtral else "down_proj")] = t[e].clone()
        elif mixtral and ".mlp.gate." in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
        else:
            out[name] = t
    return out


def reference(model, vocab):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, vocab, (2, 12), generator=g)          # no pad/bos/eos ids inside
    targets = torch.randint(0, vocab, (2, 12), generator=g)
    out = {"ids": ids, "targets": targets}
    moe = getattr(model.config, "output_router_logits", False)
    res = model(ids, output_router_logits=True) if moe else model(ids)
    logits = res.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1))
    if moe:   # the router's load-balancing loss, as transformers adds it with labels
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
        experts = getattr(model.config, "num_local_experts", None) or model.config.num_experts
        aux = load_balancing_loss_func(res.router_logits, experts, model.config.num_experts_per_tok)
        loss = loss + model.config.router_aux_loss_coef * aux.double()
    loss.backward()
    out["logits"] = logits.detach().float()
    out["loss"] = loss.detach().reshape(1)
    for name, p in saved_names(model, {n: p.grad.detach().clone() for n, p in model.named_parameters()}).items():
        out["grad." + name] = p
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-3, weight_decay=0.1)
    opt.step()
    for name, p in saved_names(model, {n: p.detach().clone() for n, p in model.named_parameters()}).items():
        out["step." + name] = p
    return out


def main():
    for name, spec in FAMILIES.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        model = build(name, spec)
        model.save_pretrained(d)
        prompt = torch.randint(3, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            kw = {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}
            greedy = model.generate(prompt, do_sample=False, max_new_tokens=8, **kw)
            greedy = greedy if torch.is_tensor(greedy) else greedy.sequences
        ref = reference(model, model.config.vocab_size)
        ref["prompt"], ref["greedy"] = prompt, greedy
        save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(d, "reference.safetensors"))
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors", "reference.safetensors"):
                os.remove(os.path.join(d, f))
        print(name, sum(p.numel() for p in model.parameters()), "parameters")


if __name__ == "__main__":
    main()
