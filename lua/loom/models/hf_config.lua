-- hf_config.lua: Hugging Face config.json files, read as hostile input
-- (they come from elsewhere): as transformers 4.x writes them (a top-level
-- rope_theta) and as 5.x does (rope_parameters = {rope_theta, rope_type});
-- every numeric field is range-checked (integers that are integers, within
-- sane bounds), kinds of RoPE and scaling loom lacks are refused by name,
-- and check_weights compares the config with the weights file's header
-- before anything is built.
local R = require("loom.safetensors_reader")

local M = {}

M.MAX_BYTES = 10000000   -- a config.json is a few kB
local json_null = require("dkjson").null

-- bounds of the integer fields (anything past them is a corrupt file)
local INT_LIMITS = {
  vocab_size = 2 ^ 31 - 1, hidden_size = 2 ^ 20, num_hidden_layers = 10000, num_attention_heads = 65536,
  num_key_value_heads = 65536, intermediate_size = 2 ^ 24, max_position_embeddings = 2 ^ 26, head_dim = 2 ^ 16,
  n_positions = 2 ^ 26, n_embd = 2 ^ 20, n_layer = 10000, n_head = 65536, n_inner = 2 ^ 24,
  sliding_window = 2 ^ 26, original_max_position_embeddings = 2 ^ 26,
  num_local_experts = 65536, num_experts = 65536, num_experts_per_tok = 65536, moe_intermediate_size = 2 ^ 24,
  decoder_sparse_step = 10000,
}

local function fail(p, fmt, ...) error("hf.read_config: " .. p .. ": " .. string.format(fmt, ...), 0) end
local function unsupported(p, what) fail(p, "%s is not supported", what) end
local function shown(v) return type(v) == "number" and string.format("%.14g", v) or tostring(v) end

-- a reader of the fields of config h (from file p) with their checks
local function fields(h, p)
  local F = {}
  local function get(k, default)
    local v = h[k]
    if v == nil or v == json_null then v = default end
    if v == nil then fail(p, "%s is missing", k) end
    return v
  end
  function F.int(k, default)
    local v = get(k, default)
    if type(v) ~= "number" then fail(p, "%s is %s, not a number", k, shown(v)) end
    if v ~= math.floor(v) then fail(p, "%s is %s, not an integer", k, shown(v)) end
    if v < 1 or v > INT_LIMITS[k] then fail(p, "%s is %s, outside [1, %.0f]", k, shown(v), INT_LIMITS[k]) end
    return v
  end
  function F.real(k, default, lo, hi)
    local v = get(k, default)
    if type(v) ~= "number" then fail(p, "%s is %s, not a number", k, shown(v)) end
    if not (v > lo and v <= hi) then fail(p, "%s is %s, outside (%g, %g]", k, shown(v), lo, hi) end
    return v
  end
  return F
end

-- the RoPE of a Llama-style config: its base, rope_theta (4.x) or
-- rope_parameters.rope_theta (5.x), and its scaling (nil, or Llama 3.1's
-- {rope_type = "llama3", ...}); kinds not in `types` refused by name
local function rope(h, p, F, types)
  local scaling
  local function kind_of(t, where)
    if t == nil or t == json_null then return end
    if type(t) ~= "table" then fail(p, "%s is %s, not an object", where, shown(t)) end
    local kind = t.rope_type or t.type or "default"
    if not types[kind] then
      fail(p, "%s: rope_type %s is not supported (loom implements %s)", where, shown(kind),
           types.llama3 and "the default RoPE and llama3's scaling" or "the default RoPE")
    end
    local prf = t.partial_rotary_factor
    if prf ~= nil and prf ~= json_null and prf ~= 1 then
      fail(p, "%s: partial_rotary_factor %s is not supported (RoPE over the whole head)", where, shown(prf))
    end
    if kind == "llama3" then
      local G = fields(t, p)
      scaling = { rope_type = "llama3", factor = G.real("factor", nil, 0, 1e6),
                  low_freq_factor = G.real("low_freq_factor", nil, 0, 1e6),
                  high_freq_factor = G.real("high_freq_factor", nil, 0, 1e6),
                  original_max_position_embeddings = G.int("original_max_position_embeddings") }
      if scaling.high_freq_factor <= scaling.low_freq_factor then
        fail(p, "%s: high_freq_factor %s must exceed low_freq_factor %s", where, shown(scaling.high_freq_factor),
             shown(scaling.low_freq_factor))
      end
    end
  end
  kind_of(h.rope_scaling, "rope_scaling")
  local rp = h.rope_parameters
  kind_of(rp, "rope_parameters")
  if h.partial_rotary_factor ~= nil and h.partial_rotary_factor ~= json_null and h.partial_rotary_factor ~= 1 then
    fail(p, "partial_rotary_factor %s is not supported (RoPE over the whole head)", shown(h.partial_rotary_factor))
  end
  local theta = F.real("rope_theta", 10000, 0, 1e12)
  if type(rp) == "table" and rp.rope_theta ~= nil then
    local t2 = fields(rp, p).real("rope_theta", nil, 0, 1e12)
    if h.rope_theta ~= nil and h.rope_theta ~= json_null and t2 ~= theta then
      fail(p, "rope_theta %s and rope_parameters.rope_theta %s disagree", shown(theta), shown(t2))
    end
    theta = t2
  end
  return theta, scaling
end

local function gpt2(h, p)
  local F = fields(h, p)
  local act = h.activation_function or "gelu_new"
  if act ~= "gelu_new" and act ~= "gelu_pytorch_tanh" then unsupported(p, "activation_function " .. shown(act)) end
  local d, heads = F.int("n_embd"), F.int("n_head")
  if d % heads ~= 0 then fail(p, "n_embd %d is not a multiple of n_head %d", d, heads) end
  return "gpt2", { vocab_size = F.int("vocab_size"), n_positions = F.int("n_positions"), n_embd = d,
                   n_layer = F.int("n_layer"), n_head = heads, n_inner = F.int("n_inner", 4 * d),
                   layer_norm_epsilon = F.real("layer_norm_epsilon", 1e-5, 0, 1) }
end

-- the families loom reads, by config.json's model_type: every Llama-style
-- one (loom.models.hf_llama) is loom's "llama" family with its variations
local LLAMA_LIKE = require("loom.models.hf_llama").KINDS

-- read(p) -> family ("llama" | "gpt2"), loom config, for the config.json at p
function M.read(p)
  local h = R.decode_json(R.read_text(p, "hf.read_config", M.MAX_BYTES), "hf.read_config", p)
  if type(h) ~= "table" then fail(p, "is not a JSON object") end
  if type(h.model_type) == "string" and LLAMA_LIKE[h.model_type] then
    return "llama", require("loom.models.hf_llama").read(h.model_type, h, p,
                                                         { fields = fields, fail = fail, shown = shown, rope = rope })
  end
  if h.model_type == "gpt2" then return gpt2(h, p) end
  local names = {}
  for k in pairs(LLAMA_LIKE) do names[#names + 1] = k end
  table.sort(names)
  fail(p, "model_type %s is not supported (loom reads %s and gpt2)", shown(h.model_type), table.concat(names, ", "))
end

-- check_weights(arch, cfg, reader, file, cfg_path): the config agrees with
-- the weights file's header (the embedding's shape, the number of layers)
-- before a model is built from it
function M.check_weights(arch, cfg, r, file, cfg_path)
  local vocab, dim, layers = cfg.vocab_size, cfg.dim or cfg.n_embd, cfg.n_layers or cfg.n_layer
  local emb_names = arch == "llama" and { "model.embed_tokens.weight" } or { "transformer.wte.weight", "wte.weight" }
  local layer_pat = arch == "llama" and "^model%.layers%.(%d+)%." or "^h%.(%d+)%."
  local emb
  for _, n in ipairs(emb_names) do emb = emb or r.tensors[n] end
  local function differ(what, c, w)
    error(string.format("hf.from_pretrained: %s says %s %s, the weights file %s holds %s", cfg_path, what, shown(c),
                        file, w), 0)
  end
  if emb and (emb.shape[1] ~= vocab or emb.shape[2] ~= dim) then
    differ("vocab_size x hidden size", vocab .. "x" .. dim, "an embedding of " .. table.concat(emb.shape, "x"))
  end
  local max = -1
  for _, n in ipairs(r.names) do
    local i = tonumber(n:gsub("^transformer%.", ""):match(layer_pat))
    if i and i > max then max = i end
  end
  if max + 1 ~= layers then differ(arch == "llama" and "num_hidden_layers" or "n_layer", layers, (max + 1) .. " layers") end
end

return M
