-- hf_llama.lua: the Llama-style families in Hugging Face's layout, onto
-- loom.models.transformer and its variations: each model_type's config
-- reader (what it may say; anything loom would compute differently is
-- refused by name), its name map both ways, and the config.json written
-- back. One table says what each family changes:
--   llama    Llama 2 and 3.x (rope_type "llama3": Llama 3.1's scaling)
--   mistral  a sliding window over every layer
--   qwen2    biases on q, k and v (Qwen2, Qwen2.5)
--   qwen3    RMSNorm of each head of q and k, an explicit head_dim
--   phi3     fused qkv_proj and gate_up_proj (split on load, fused again on
--            save), a sliding window
--   gemma    RMSNorm by (1 + weight), GeGLU (gelu tanh), embeddings times
--            sqrt(hidden), an explicit head_dim, tied embeddings
--   olmo2    norms after attention and feed-forward, RMSNorm of the whole
--            q and k projections
--   mixtral  Mistral with a mixture of experts in every layer
--   qwen3_moe  Qwen3 with a mixture of experts in every layer
-- The experts come one HF tensor per expert (as transformers saves them),
-- or fused as transformers 5 holds them (experts.gate_up_proj, down_proj).
-- HF's q_proj and k_proj rows are permuted per head for its rotate_half
-- RoPE; loom's RoPE pairs interleaved rows as Meta's code does, so each
-- head of q and k (and their biases and per-row norm weights) is
-- un-permuted on load and permuted back on save (entries with `heads`).
local M = {}

local KINDS = {
  llama = { arch = "LlamaForCausalLM", rope_types = { default = true, llama3 = true } },
  mistral = { arch = "MistralForCausalLM", window = true },
  qwen2 = { arch = "Qwen2ForCausalLM", qkv_bias = true, window_flag = true },
  qwen3 = { arch = "Qwen3ForCausalLM", qk_norm = "head", window_flag = true },
  phi3 = { arch = "Phi3ForCausalLM", fused = true, window = true },
  gemma = { arch = "GemmaForCausalLM", norm_offset = 1, act = "gelu_tanh", embed_scale = true },
  olmo2 = { arch = "Olmo2ForCausalLM", qk_norm = "proj", post_norm = true },
  mixtral = { arch = "MixtralForCausalLM", window = true, moe = "mixtral" },
  qwen3_moe = { arch = "Qwen3MoeForCausalLM", qk_norm = "head", window_flag = true, moe = "qwen3_moe" },
}
M.KINDS = KINDS

-- fields that change the math in ways loom does not compute: refused when
-- set (null, false and absent are fine)
local REFUSED = { "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                  "use_bidirectional_attention", "sliding_window_pattern", "mlp_bias", "logits_scaling" }

local json_null = require("dkjson").null
local function set(v) return v ~= nil and v ~= json_null and v ~= false end

-- the gate's activation of a config: silu, or Gemma's gelu (tanh form;
-- its configs say "gelu" for it, as transformers reads them)
local function activation(kind, h, fail, shown)
  local act = h.hidden_activation
  if not set(act) then act = h.hidden_act end
  if not set(act) then act = kind.act and "gelu_pytorch_tanh" or "silu" end
  if act == "silu" then return "silu" end
  if kind.act == "gelu_tanh" and (act == "gelu_pytorch_tanh" or act == "gelu") then return "gelu_tanh" end
  fail("hidden_act %s is not supported", shown(act))
end

-- the sliding window of a config, or nil; windows over some layers only
-- (a layer pattern loom lacks) refused
local function window_of(kind, h, F, fail)
  local w
  if kind.window and set(h.sliding_window) then w = F.int("sliding_window") end
  if kind.window_flag and h.use_sliding_window == true then
    fail("use_sliding_window (a window over some layers, from max_window_layers on) is not supported")
  end
  if not kind.window and not kind.window_flag and set(h.sliding_window) then
    fail("sliding_window is not supported for model_type %s", h.model_type)
  end
  local want = w and "sliding_attention" or "full_attention"
  for i, t in ipairs(type(h.layer_types) == "table" and h.layer_types or {}) do
    if t ~= want then fail("layer_types[%d] is %s: a layer pattern loom lacks (every layer %s)", i, tostring(t), want) end
  end
  return w
end

-- the mixture of experts of a config (loom.models.transformer's moe):
-- experts, top_k, their width, Qwen3-MoE's norm_topk_prob (Mixtral always
-- renormalises), the load-balancing loss's coefficient when the config
-- asks for the router's loss (output_router_logits); dense layers among
-- the sparse ones and router noise refused
local function moe_of(kind, h, F, fail)
  if kind.moe == "mixtral" then
    if set(h.router_jitter_noise) and h.router_jitter_noise ~= 0 then fail("router_jitter_noise is not supported") end
  else
    if set(h.decoder_sparse_step) and F.int("decoder_sparse_step") ~= 1 then
      fail("decoder_sparse_step %s: dense layers among the sparse ones are a layer pattern loom lacks", tostring(h.decoder_sparse_step))
    end
    if type(h.mlp_only_layers) == "table" and #h.mlp_only_layers > 0 then
      fail("mlp_only_layers: dense layers among the sparse ones are a layer pattern loom lacks")
    end
  end
  local mixtral = kind.moe == "mixtral"
  local coef = F.real("router_aux_loss_coef", 0.001, -1, 1e6)
  -- (transformers 5 writes num_local_experts for Qwen3-MoE too)
  return { experts = F.int(set(h.num_local_experts) and "num_local_experts" or "num_experts"),
           top_k = F.int("num_experts_per_tok"),
           hidden = F.int(mixtral and "intermediate_size" or "moe_intermediate_size"),
           norm_topk_prob = mixtral or h.norm_topk_prob == true,
           aux_loss_coef = h.output_router_logits == true and math.max(coef, 0) or 0 }
end

-- read(model_type, h, p, R) -> loom.models.transformer config of the HF
-- config h (from file p). R: hf_config's readers ({fields, fail, shown, rope}).
function M.read(model_type, h, p, R)
  local kind = KINDS[model_type]
  local F = R.fields(h, p)
  local function fail(fmt, ...) R.fail(p, fmt, ...) end
  for _, k in ipairs(REFUSED) do
    if set(h[k]) then fail("%s is %s: not supported", k, R.shown(h[k])) end
  end
  if h.attention_bias == true then fail("attention_bias (a bias on every projection) is not supported") end
  local theta, scaling = R.rope(h, p, F, kind.rope_types or { default = true })
  local dim, heads = F.int("hidden_size"), F.int("num_attention_heads")
  local kv = F.int("num_key_value_heads", heads)
  local hd = set(h.head_dim) and F.int("head_dim") or nil
  if not hd and dim % heads ~= 0 then fail("hidden_size %d is not a multiple of num_attention_heads %d", dim, heads) end
  hd = hd or dim / heads
  if heads % kv ~= 0 then fail("num_attention_heads %d is not a multiple of num_key_value_heads %d", heads, kv) end
  if hd % 2 ~= 0 then fail("the head size %d is odd (RoPE rotates pairs)", hd) end
  local c = { vocab_size = F.int("vocab_size"), dim = dim, n_layers = F.int("num_hidden_layers"), n_heads = heads,
              n_kv_heads = kv, head_dim = hd, ffn_dim = F.int("intermediate_size"),
              norm_eps = F.real("rms_norm_eps", 1e-6, 0, 1), rope_theta = theta, rope_scaling = scaling,
              max_seq_len = F.int("max_position_embeddings", 2048), tie_embeddings = h.tie_word_embeddings == true,
              act = activation(kind, h, fail, R.shown), qkv_bias = kind.qkv_bias or nil, qk_norm = kind.qk_norm,
              norm_offset = kind.norm_offset, post_norm = kind.post_norm or nil,
              sliding_window = window_of(kind, h, F, fail), model_type = model_type }
  if kind.embed_scale then c.embed_scale = math.sqrt(dim) end
  if kind.moe then
    c.moe = moe_of(kind, h, F, fail)
    if c.moe.top_k > c.moe.experts then fail("num_experts_per_tok %d exceeds the experts, %d", c.moe.top_k, c.moe.experts) end
  end
  for _, k in ipairs { "bos_token_id", "eos_token_id", "pad_token_id" } do
    if type(h[k]) == "number" then c[k] = h[k] end
  end
  return c
end

---------------------------------------------------------------------------
-- name maps: loom FQN -> {hf = name, shape = the HF tensor's full shape,
-- slice = {dim, start} (HF coordinates), heads = head_dim}

-- the name map entries of layer prefix l's mixture of experts (h: its HF
-- prefix), per-expert tensors or transformers 5's fused ones (file_names
-- says which the file holds)
local function moe_entries(put, kind, c, l, h, file_names)
  local m, E = c.moe, c.moe.experts
  local base = h .. (kind.moe == "mixtral" and "block_sparse_moe." or "mlp.")
  local F = m.hidden or c.ffn_dim
  if file_names and file_names[h .. "mlp.experts.gate_up_proj"] then   -- fused, as transformers 5 holds them
    put(l .. "feed_forward.gate.weight", h .. "mlp.gate.weight", { E, c.dim })
    put(l .. "feed_forward.experts.w1", h .. "mlp.experts.gate_up_proj", { E, 2 * F, c.dim }, { slice = { 2, 0 } })
    put(l .. "feed_forward.experts.w3", h .. "mlp.experts.gate_up_proj", { E, 2 * F, c.dim }, { slice = { 2, F } })
    put(l .. "feed_forward.experts.w2", h .. "mlp.experts.down_proj", { E, c.dim, F })
    return
  end
  put(l .. "feed_forward.gate.weight", base .. "gate.weight", { E, c.dim })
  local names = kind.moe == "mixtral" and { w1 = "w1", w2 = "w2", w3 = "w3" }
                or { w1 = "gate_proj", w2 = "down_proj", w3 = "up_proj" }
  for w, hname in pairs(names) do
    local list = {}
    for e = 0, E - 1 do list[e + 1] = base .. "experts." .. e .. "." .. hname .. ".weight" end
    put(l .. "feed_forward.experts." .. w, list[1], w == "w2" and { c.dim, F } or { F, c.dim }, { experts = list })
  end
end

function M.name_map(c, file_names)
  local kind = KINDS[c.model_type or "llama"]
  local m, hd = {}, c.head_dim or c.dim / c.n_heads
  local q, kv, f = c.n_heads * hd, c.n_kv_heads * hd, c.ffn_dim
  local function put(fqn, hf, shape, opts)
    opts = opts or {}
    m[fqn] = { hf = hf, shape = shape, heads = opts.heads, slice = opts.slice, experts = opts.experts }
  end
  put("tok_embeddings.weight", "model.embed_tokens.weight", { c.vocab_size, c.dim })
  put("norm.weight", "model.norm.weight", { c.dim })
  if not c.tie_embeddings then put("output.weight", "lm_head.weight", { c.vocab_size, c.dim })
  else   -- listed only if the tie was broken (a dtype conversion per module): the embedding again
    put("output.weight", "model.embed_tokens.weight", { c.vocab_size, c.dim })
    m["output.weight"].tied = true
  end
  for i = 1, c.n_layers do
    local l, h = "layers." .. i .. ".", "model.layers." .. (i - 1) .. "."
    if kind.post_norm then
      put(l .. "attention_norm.weight", h .. "post_attention_layernorm.weight", { c.dim })
      put(l .. "ffn_norm.weight", h .. "post_feedforward_layernorm.weight", { c.dim })
    else
      put(l .. "attention_norm.weight", h .. "input_layernorm.weight", { c.dim })
      put(l .. "ffn_norm.weight", h .. "post_attention_layernorm.weight", { c.dim })
    end
    local a = l .. "attention."
    if kind.fused then
      local qkv, gu = h .. "self_attn.qkv_proj.weight", h .. "mlp.gate_up_proj.weight"
      put(a .. "wq.weight", qkv, { q + 2 * kv, c.dim }, { heads = hd, slice = { 1, 0 } })
      put(a .. "wk.weight", qkv, { q + 2 * kv, c.dim }, { heads = hd, slice = { 1, q } })
      put(a .. "wv.weight", qkv, { q + 2 * kv, c.dim }, { slice = { 1, q + kv } })
      put(l .. "feed_forward.w1.weight", gu, { 2 * f, c.dim }, { slice = { 1, 0 } })
      put(l .. "feed_forward.w3.weight", gu, { 2 * f, c.dim }, { slice = { 1, f } })
    else
      put(a .. "wq.weight", h .. "self_attn.q_proj.weight", { q, c.dim }, { heads = hd })
      put(a .. "wk.weight", h .. "self_attn.k_proj.weight", { kv, c.dim }, { heads = hd })
      put(a .. "wv.weight", h .. "self_attn.v_proj.weight", { kv, c.dim })
      if not c.moe then
        put(l .. "feed_forward.w1.weight", h .. "mlp.gate_proj.weight", { f, c.dim })
        put(l .. "feed_forward.w3.weight", h .. "mlp.up_proj.weight", { f, c.dim })
      end
    end
    if c.moe then moe_entries(put, kind, c, l, h, file_names) end
    if c.qkv_bias then
      put(a .. "wq.bias", h .. "self_attn.q_proj.bias", { q }, { heads = hd })
      put(a .. "wk.bias", h .. "self_attn.k_proj.bias", { kv }, { heads = hd })
      put(a .. "wv.bias", h .. "self_attn.v_proj.bias", { kv })
    end
    if c.qk_norm == "head" then
      put(a .. "q_norm.weight", h .. "self_attn.q_norm.weight", { hd }, { heads = hd })
      put(a .. "k_norm.weight", h .. "self_attn.k_norm.weight", { hd }, { heads = hd })
    elseif c.qk_norm == "proj" then
      put(a .. "q_norm.weight", h .. "self_attn.q_norm.weight", { q }, { heads = hd })
      put(a .. "k_norm.weight", h .. "self_attn.k_norm.weight", { kv }, { heads = hd })
    end
    put(a .. "wo.weight", h .. "self_attn.o_proj.weight", { c.dim, q })
    if not c.moe then put(l .. "feed_forward.w2.weight", h .. "mlp.down_proj.weight", { c.dim, f }) end
  end
  -- in the file but not parameters: RoPE buffers of old checkpoints; a tied head
  local ignore = { "^model%.layers%.%d+%.self_attn%.rotary_emb%.inv_freq$" }
  if c.tie_embeddings then ignore[#ignore + 1] = "^lm_head%.weight$" end
  return m, ignore
end

---------------------------------------------------------------------------
-- config.json of a model

function M.write(c)
  local mt = c.model_type or "llama"
  local kind = KINDS[mt]
  local rope = { rope_type = c.rope_scaling and c.rope_scaling.rope_type or "default", rope_theta = c.rope_theta }
  for k, v in pairs(c.rope_scaling or {}) do rope[k] = v end
  local h = { architectures = { kind.arch }, model_type = mt, vocab_size = c.vocab_size, hidden_size = c.dim,
              num_hidden_layers = c.n_layers, num_attention_heads = c.n_heads, num_key_value_heads = c.n_kv_heads,
              head_dim = c.head_dim, intermediate_size = c.ffn_dim, rms_norm_eps = c.norm_eps,
              rope_parameters = rope, max_position_embeddings = c.max_seq_len,
              hidden_act = c.act == "gelu_tanh" and "gelu_pytorch_tanh" or "silu",
              tie_word_embeddings = c.tie_embeddings, bos_token_id = c.bos_token_id, eos_token_id = c.eos_token_id,
              pad_token_id = c.pad_token_id }
  if mt ~= "qwen2" then h.attention_bias = false end
  local m = c.moe
  if m and mt == "mixtral" then
    h.num_local_experts, h.intermediate_size = m.experts, m.hidden
  elseif m then
    h.num_experts, h.moe_intermediate_size, h.norm_topk_prob = m.experts, m.hidden, m.norm_topk_prob
    h.decoder_sparse_step, h.mlp_only_layers = 1, {}
  end
  if m then
    h.num_experts_per_tok, h.output_router_logits = m.top_k, (m.aux_loss_coef or 0) > 0
    h.router_aux_loss_coef = (m.aux_loss_coef or 0) > 0 and m.aux_loss_coef or 0.001
  end
  if kind.window then h.sliding_window = c.sliding_window or require("dkjson").null end
  if kind.window_flag then h.use_sliding_window = false end
  return h
end

return M
