-- sampler.lua: a seeded random batch sampler over token ids (a tensor or
-- a memory-mapped token file), the same batches at any layout and after a
-- resume (loom.data.Sampler).
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C

local M = {}

local function is_token_file(x)
  local tf = package.loaded["loom.text.token_file"]
  return tf ~= nil and type(x) == "table" and getmetatable(x) == tf.TokenFile
end
M.is_token_file = is_token_file

local Sampler = {}
Sampler.__index = Sampler

-- Sampler(ids, {batch, seq, seed, rank=0, world=1}): next() gives x, y of
-- (batch, seq) i64 with y shifted by one. Offsets come from their own
-- Philox stream (seed, counter), so sampling never moves loom's RNG and a
-- resumed run draws the same batches. With world > 1 each rank takes its
-- slice of a global batch of batch * world rows (data parallelism).
function M.Sampler(ids, opts)
  if not is_token_file(ids) then   -- (a token file is read row by row from the map)
    T.check_tensor(ids, "Sampler", "ids")
    if ids.dtype ~= "i64" or ids:dim() ~= 1 or not ids:is_contiguous() or ids.device ~= "cpu" then
      T.argerror("Sampler", "ids", "a contiguous 1-D i64 CPU tensor",
                 string.format("a %d-D %s tensor on %s", ids:dim(), ids.dtype, ids.device))
    end
  end
  opts = opts or {}
  local self = setmetatable({ ids = ids, batch = opts.batch or 12, seq = opts.seq or 64,
    seed = opts.seed or 1337, counter = opts.counter or 0, rank = opts.rank or 0,
    world = opts.world or 1 }, Sampler)
  for _, k in ipairs { "batch", "seq", "world" } do
    local v = self[k]
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      T.argerror("Sampler", k, "a positive integer", T.describe(v))
    end
  end
  if type(self.rank) ~= "number" or self.rank < 0 or self.rank >= self.world or self.rank ~= math.floor(self.rank) then
    T.argerror("Sampler", "rank", "an integer in [0, world)", T.describe(self.rank))
  end
  if ids:numel() <= self.seq + 1 then
    error(string.format("Sampler: %d tokens are too few for sequences of %d", ids:numel(), self.seq), 2)
  end
  return self
end

local ctr, key, rnd = ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]"), ffi.new("uint32_t[4]")
local function draw(seed, counter, n)   -- a uniform integer in [0, n)
  ctr[0], ctr[1], ctr[2], ctr[3] = counter % 2^32, math.floor(counter / 2^32), 0, 0
  key[0], key[1] = seed % 2^32, 0
  C.lm_philox4x32(ctr, key, rnd)
  return math.floor((rnd[0] * 2^21 + math.floor(rnd[1] / 2^11)) / 2^53 * n)
end

function Sampler:next()
  local b, t = self.batch, self.seq
  local x = loom.empty({ b, t }, { dtype = "i64" })
  local y = loom.empty({ b, t }, { dtype = "i64" })
  local file = is_token_file(self.ids) and self.ids
  local src = not file and ffi.cast("int64_t*", C.lm_data(self.ids))
  local px, py = ffi.cast("int64_t*", C.lm_data(x)), ffi.cast("int64_t*", C.lm_data(y))
  local span = self.ids:numel() - t - 1
  for row = 0, b * self.world - 1 do   -- every rank draws every offset: its rows are its slice
    local off = draw(self.seed, self.counter + row, span)
    local r = row - self.rank * b
    if r >= 0 and r < b and file then
      file:copy_ids(px + r * t, off, t)
      file:copy_ids(py + r * t, off + 1, t)
    elseif r >= 0 and r < b then
      ffi.copy(px + r * t, src + off, 8 * t)
      ffi.copy(py + r * t, src + off + 1, 8 * t)
    end
  end
  self.counter = self.counter + b * self.world
  return x, y
end

-- state for checkpoints: where the stream is
function Sampler:state() return { counter = self.counter, seed = self.seed } end
function Sampler:set_state(s) self.counter, self.seed = s.counter, s.seed end

return M
