-- rope.lua: rotary embeddings around the rope op (core/ops/attention.c):
-- the cos/sin tables and their use, on loom tensors. loom.F builds the
-- user-facing API on these.
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C
require("loom.tensor_ops")

local M = {}

-- Llama's precompute_freqs_cis as two real tables: for t in [0, seq_len)
-- and i in [0, head_dim/2), angle = t * theta^(-2i/head_dim); returns
-- cos, sin of shape (seq_len, head_dim/2). Angles are computed in f64 and
-- rounded once to opts.dtype (f32 by default). opts: theta (10000), dtype,
-- device.
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
  local half = head_dim / 2
  local t = TC.arange(0, seq_len, 1, { dtype = "f64", device = opts.device }):reshape(seq_len, 1)
  local inv = TC.arange(0, half, 1, { dtype = "f64", device = opts.device })
      :mul(-2 * math.log(theta) / head_dim):exp():reshape(1, half)
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
