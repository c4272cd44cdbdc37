#!/usr/bin/env python3
"""make_moe_fixtures.py: the reference fixtures of spec/moe_spec.lua, made by
transformers' own MoE blocks (MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock,
eager experts: a loop over experts) built from small configs with random
weights (nothing downloaded), never by loom. Each case is one safetensors
file in spec/fixtures/moe/ holding, in f32:

  x (B, S, H), r (B, S, H)        the input and the upstream weights of the
                                  loss: loss = sum(out * r) + aux_coef * aux
                                  + z_coef * z
  gate.weight (E, H), experts.w1 (E, I, H), experts.w2 (E, H, I),
  experts.w3 (E, I, H)            the block's weights under loom's names
                                  (w1/w3 are HF's gate_up_proj halves)
  out, router_logits, aux, z      the forward: the block's output, the gate's
                                  logits, HF's load_balancing_loss_func of
                                  this layer and the router z-loss
                                  (ST-MoE: mean of logsumexp(logits)^2)
  counts (E)                      top-k assignments per expert
  grad.<name>                     gradients of the loss (x and every weight)
  step.<name>                     the weights after one torch.optim.AdamW step
                                  (lr 1e-2, betas (0.9, 0.999), eps 1e-8,
                                  weight_decay 0.01)
  meta                            [top_k, norm_topk_prob, aux_coef * 1e6, z_coef * 1e6]

Run with the venv that has torch and transformers:
  /opt/hfenv/bin/python scripts/make_moe_fixtures.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "fixtures", "moe")
AUX_COEF, Z_COEF = 0.02, 0.001


def case(name, block, cfg, seed, top_k, norm, E, H, I, unused_expert=None):
    torch.manual_seed(seed)
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.3)
        block.experts.gate_up_proj.normal_(0, 0.2)
        block.experts.down_proj.normal_(0, 0.2)
    x = torch.randn(2, 5, H)
    if unused_expert is not None:
        # positive inputs and a negative router row: that expert is never
        # in any token's top k (an empty group in loom's grouped GEMM)
        x = x.abs()
        with torch.no_grad():
            block.gate.weight[unused_expert] = -block.gate.weight[unused_expert].abs() - 1
    r = torch.randn(2, 5, H)
    x.requires_grad_(True)
    out = block(x)
    logits = block.gate(x.reshape(-1, H))[0]  # the same gate call the block made
    aux = load_balancing_loss_func((logits,), E, top_k)
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    loss = (out * r).sum() + AUX_COEF * aux + Z_COEF * z
    loss.backward()
    top = torch.topk(torch.softmax(logits.float(), -1), top_k, dim=-1).indices
    counts = torch.bincount(top.reshape(-1), minlength=E)
    gu, down = block.experts.gate_up_proj, block.experts.down_proj
    params = {"gate.weight": block.gate.weight, "experts.w1": gu[:, :I], "experts.w3": gu[:, I:],
              "experts.w2": down}
    grads = {"gate.weight": block.gate.weight.grad, "experts.w1": gu.grad[:, :I], "experts.w3": gu.grad[:, I:],
             "experts.w2": down.grad}
    t = {"x": x.detach(), "r": r, "out": out.detach(), "router_logits": logits.detach(),
         "aux": aux.detach().reshape(1), "z": z.detach().reshape(1), "counts": counts,
         "grad.x": x.grad,
         "meta": torch.tensor([top_k, int(norm), AUX_COEF * 1e6, Z_COEF * 1e6], dtype=torch.float32)}
    for k, v in params.items():
        t[k] = v.detach().clone()
        t["grad." + k] = grads[k].clone()
    opt = torch.optim.AdamW([block.gate.weight, gu, down], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.step()
    for k, v in {"gate.weight": block.gate.weight, "experts.w1": gu[:, :I], "experts.w3": gu[:, I:],
                 "experts.w2": down}.items():
        t["step." + k] = v.detach().clone()
    t = {k: v.contiguous() for k, v in t.items()}
    save_file(t, os.path.join(OUT, name + ".safetensors"))
    print(f"{name}: E {E}, top-{top_k}, norm_topk_prob {norm}, counts {counts.tolist()}, aux {aux.item():.6f}")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    H, I = 12, 16
    mix = MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=6, num_experts_per_tok=2,
                        router_jitter_noise=0.0)
    mix._experts_implementation = "eager"
    case("mixtral", MixtralSparseMoeBlock(mix), mix, 1, 2, True, 6, H, I)
    for norm, name, seed in ((False, "qwen3_moe", 2), (True, "qwen3_moe_norm", 3)):
        q = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=8, num_experts_per_tok=3,
                           norm_topk_prob=norm)
        q._experts_implementation = "eager"
        case(name, Qwen3MoeSparseMoeBlock(q), q, seed, 3, norm, 8, H, I, unused_expert=5)


if __name__ == "__main__":
    main()
