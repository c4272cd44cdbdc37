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

-- the RoPE base of a Llama config: rope_theta (4.x) or
-- rope_parameters.rope_theta (5.x); kinds other than "default" refused
local function rope_theta(h, p, F)
  local function kind_of(t, where)
    if t == nil or t == json_null then return end
    if type(t) ~= "table" then fail(p, "%s is %s, not an object", where, shown(t)) end
    local kind = t.rope_type or t.type or "default"
    if kind ~= "default" then
      fail(p, "%s: rope_type %s is not supported (loom implements the default RoPE only)", where, shown(kind))
    end
  end
  kind_of(h.rope_scaling, "rope_scaling")
  local rp = h.rope_parameters
  kind_of(rp, "rope_parameters")
  local theta = F.real("rope_theta", 10000, 0, 1e12)
  if type(rp) == "table" and rp.rope_theta ~= nil then
    local t2 = fields(rp, p).real("rope_theta", nil, 0, 1e12)
    if h.rope_theta ~= nil and h.rope_theta ~= json_null and t2 ~= theta then
      fail(p, "rope_theta %s and rope_parameters.rope_theta %s disagree", shown(theta), shown(t2))
    end
    theta = t2
  end
  return theta
end

local function llama(h, p)
  local F = fields(h, p)
  local theta = rope_theta(h, p, F)
  if h.attention_bias == true or h.mlp_bias == true then unsupported(p, "attention_bias / mlp_bias") end
  if (h.hidden_act or "silu") ~= "silu" then unsupported(p, "hidden_act " .. shown(h.hidden_act)) end
  local dim, heads = F.int("hidden_size"), F.int("num_attention_heads")
  local kv = F.int("num_key_value_heads", heads)
  if dim % heads ~= 0 then fail(p, "hidden_size %d is not a multiple of num_attention_heads %d", dim, heads) end
  if heads % kv ~= 0 then fail(p, "num_attention_heads %d is not a multiple of num_key_value_heads %d", heads, kv) end
  if (dim / heads) % 2 ~= 0 then fail(p, "the head size %d is odd (RoPE rotates pairs)", dim / heads) end
  if h.head_dim ~= nil and h.head_dim ~= json_null and F.int("head_dim") ~= dim / heads then
    unsupported(p, "a head_dim other than hidden_size / num_attention_heads")
  end
  return "llama", { vocab_size = F.int("vocab_size"), dim = dim, n_layers = F.int("num_hidden_layers"),
                    n_heads = heads, n_kv_heads = kv, ffn_dim = F.int("intermediate_size"),
                    norm_eps = F.real("rms_norm_eps", 1e-6, 0, 1), rope_theta = theta,
                    max_seq_len = F.int("max_position_embeddings", 2048), tie_embeddings = h.tie_word_embeddings == true }
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

-- read(p) -> arch ("llama" | "gpt2"), loom config, for the config.json at p
function M.read(p)
  local h = R.decode_json(R.read_text(p, "hf.read_config", M.MAX_BYTES), "hf.read_config", p)
  if type(h) ~= "table" then fail(p, "is not a JSON object") end
  if h.model_type == "llama" then return llama(h, p) end
  if h.model_type == "gpt2" then return gpt2(h, p) end
  fail(p, "model_type %s is not supported (loom reads llama and gpt2)", shown(h.model_type))
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
