-- fsdp_layout.lua: how fully_shard lays parameters out over the
-- data-parallel mesh dim, and the flat buffers of its collectives.
--
-- Each parameter's TP-local tensor (the whole tensor without tensor
-- parallelism) is cut over dp on one dim d in torch.chunk pieces: dp rank
-- r holds rows [r*c0, r*c0 + c_r) of d, where c0 = ceil(n / dp). A unit's
-- parameters travel together: one all-gather and one reduce-scatter per
-- unit, on flat buffers where every rank's segment holds, parameter after
-- parameter, its piece padded to c0 rows (so segments are equal and
-- uneven pieces need no second collective).
local loom = require("loom")
local dist = require("loom.distributed")

local M = {}

local function prod(t, a, b)
  local n = 1
  for i = a, b do n = n * t[i] end
  return n
end

-- info(full, d, k, r): the geometry of a TP-local shape `full` cut on dim
-- d among k dp ranks, seen from dp rank r (0-based)
function M.info(full, d, k, r)
  local n = full[d]
  local c0 = math.ceil(n / k)
  local mine = dist.chunk_size(n, k, r + 1)
  local shard = {}
  for i, s in ipairs(full) do shard[i] = s end
  shard[d] = mine
  local pre, post = prod(full, 1, d - 1), prod(full, d + 1, #full)
  return { full = full, d = d, k = k, n = n, c0 = c0, mine = mine, off = dist.chunk_offset(n, k, r + 1),
           shard = shard, pre = pre, post = post, seg = pre * c0 * post }
end

-- a tensor (pre, m, post) grown to (pre, want, post) with zero rows
local function pad_rows(x, want)
  local m = x:size(2)
  if m == want then return x end
  local z = loom.zeros(x:size(1), want - m, x:size(3), { dtype = x.dtype, device = x.device })
  if m == 0 then return z end
  return loom.cat({ x, z }, 2)
end

-- all-gather input: this rank's pieces (shards[i] of infos[i]), padded,
-- one after the other
function M.pack_shards(infos, shards)
  local parts = {}
  for i, f in ipairs(infos) do
    parts[i] = pad_rows(shards[i]:reshape(f.pre, f.mine, f.post), f.c0):reshape(-1)
  end
  return #parts == 1 and parts[1]:contiguous() or loom.cat(parts, 1)
end

-- all-gather output (k segments) -> the TP-local tensors, each in storage
-- of its own (FSDP releases and restores them one by one)
function M.unpack_full(infos, flat)
  local S = 0
  for _, f in ipairs(infos) do S = S + f.seg end
  local rows, out, at = flat:view(-1, S), {}, 0
  for i, f in ipairs(infos) do
    local x = rows:narrow(2, at + 1, f.seg):reshape(f.k, f.pre, f.c0, f.post):transpose(1, 2)
    x = x:reshape(f.pre, f.k * f.c0, f.post)
    if f.k * f.c0 ~= f.n then x = x:narrow(2, 1, f.n) end
    out[i] = x:clone():view(f.full)
    at = at + f.seg
  end
  return out
end

-- reduce-scatter input: (k, S), row r holding rank r's pieces of every
-- gradient (grads[i] has infos[i].full's shape)
function M.pack_grads(infos, grads)
  local parts = {}
  for i, f in ipairs(infos) do
    local g = pad_rows(grads[i]:reshape(f.pre, f.n, f.post), f.k * f.c0)
    parts[i] = g:reshape(f.pre, f.k, f.c0, f.post):transpose(1, 2):reshape(f.k, f.seg)
  end
  return #parts == 1 and parts[1]:contiguous() or loom.cat(parts, 2)
end

-- reduce-scatter output (1, S) -> this rank's gradient pieces (shard shapes)
function M.unpack_shards(infos, flat)
  local out, at = {}, 0
  flat = flat:reshape(-1)
  for i, f in ipairs(infos) do
    local x = flat:narrow(1, at + 1, f.seg):view(f.pre, f.c0, f.post)
    if f.mine ~= f.c0 then x = x:narrow(2, 1, f.mine) end
    out[i] = x:contiguous():view(f.shard)
    at = at + f.seg
  end
  return out
end

return M
