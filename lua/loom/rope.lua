-- rope.lua: rotary embeddings around the rope op (core/ops/attention.c):
-- the cos/sin tables and their use, on loom tensors. loom.F builds the
-- user-facing API on these.
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C
require("loom.tensor_ops")

local M = {}

-- Llama 3.1's frequency scaling (rope_type "llama3"): frequencies whose
-- wavelength passes the original context / low_freq_factor divided by
-- factor, those under original / high_freq_factor kept, the ones between
-- blended (transformers' _compute_llama3_parameters)
local function llama3_scaled(inv, s)
  local low_wl = s.original_max_position_embeddings / s.low_freq_factor
  local high_wl = s.original_max_position_embeddings / s.high_freq_factor
  local out = {}
  for i, f in ipairs(inv) do
    local wl = 2 * math.pi / f
    if wl < high_wl then out[i] = f
    elseif wl > low_wl then out[i] = f / s.factor
    else
      local smooth = (s.original_max_position_embeddings / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
      out[i] = (1 - smooth) * f / s.factor + smooth * f
    end
  end
  return out
end

local function check_scaling(s)
  if s == nil then return end
  if type(s) ~= "table" or s.rope_type ~= "llama3" then
    T.argerror("rope_tables", "scaling", "nil or {rope_type = \"llama3\", factor, low_freq_factor, high_freq_factor, "
               .. "original_max_position_embeddings}", T.describe(s))
  end
  for _, k in ipairs { "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" } do
    local v = s[k]
    if type(v) ~= "number" or not (v > 0 and v < math.huge) then
      T.argerror("rope_tables", "scaling." .. k, "a number > 0", T.describe(v))
    end
  end
  if s.high_freq_factor <= s.low_freq_factor then
    T.argerror("rope_tables", "scaling.high_freq_factor", "a number above low_freq_factor " .. s.low_freq_factor,
               T.describe(s.high_freq_factor))
  end
end

-- Llama's precompute_freqs_cis as two real tables: for t in [0, seq_len)
-- and i in [0, head_dim/2), angle = t * theta^(-2i/head_dim); returns
-- cos, sin of shape (seq_len, head_dim/2). Angles are computed in f64 and
-- rounded once to opts.dtype (f32 by default). opts: theta (10000), dtype,
-- device, scaling (nil, or Llama 3.1's: {rope_type = "llama3", factor,
-- low_freq_factor, high_freq_factor, original_max_position_embeddings}).
function M.rope_tables(seq_len, head_dim, opts)
  opts = opts or {}
  if type(seq_len) ~= "number" or seq_len < 0 or seq_len % 1 ~= 0 then
    T.argerror("rope_tables", "seq_len", "an integer >= 0", T.describe(seq_len))
  end
  if type(head_dim) ~= "number" or head_dim < 2 or head_dim % 2 ~= 0 then
    T.argerror("rope_tables", "head_dim", "an even integer >= 2", T.describe(head_dim))
  end
  local theta = opts.theta or 10000
  if type(theta) ~= "number" or theta <= 0 then
    T.argerror("rope_tables", "theta", "a number > 0", T.describe(theta))
  end
  check_scaling(opts.scaling)
  local half = head_dim / 2
  local t = TC.arange(0, seq_len, 1, { dtype = "f64", device = opts.device }):reshape(seq_len, 1)
  local inv
  if opts.scaling then
    local f = {}
    for i = 1, half do f[i] = theta ^ (-2 * (i - 1) / head_dim) end
    inv = TC.tensor(llama3_scaled(f, opts.scaling), { dtype = "f64", device = opts.device }):reshape(1, half)
  else
    inv = TC.arange(0, half, 1, { dtype = "f64", device = opts.device })
        :mul(-2 * math.log(theta) / head_dim):exp():reshape(1, half)
  end
  local angle = t:mul(inv)
  local dtype = opts.dtype or "f32"
  return angle:cos():to(dtype), angle:sin():to(dtype)
end

-- Rotates x (..., seq, heads, head_dim) by the tables of rope_tables, as
-- Llama's apply_rotary_emb (interleaved pairs). The tables must have
-- exactly x's seq rows: narrow them first for an offset.
function M.apply_rotary_emb(x, cos, sin)
  return T.op(C.LM_OP_ROPE, { x, cos, sin })
end

return M
