-- plan.lua: where each tensor's data lives. On save: every rank's block of
-- every tensor, exchanged, and which rank writes which block (the lowest
-- rank offering it, so replicated data is written once). On load: the part
-- of a saved block that overlaps the block a rank holds now (resharding).
local ffi = require("ffi")
local T = require("loom.tensor")
local C = require("loom.lib").C
local ranks = require("loom.distributed.checkpoint.ranks")

local M = {}

M.MAXD = 8               -- dims of a tensor (lm's limit)
local MAXD = M.MAXD
local W = 3 + 3 * MAXD   -- i64 words per tensor in the exchanged metadata
local ABSENT = -1        -- the dtype word of a path this rank does not hold

local function dist() return require("loom.distributed") end
function M.is_dtensor(x) return T.is_tensor(x) and x.dist ~= nil end
local is_dtensor = M.is_dtensor

M.numel = require("loom.size").Size.numel
M.sizes = require("loom.size").Size.show
local numel = M.numel

-- block_of(x) -> global size, this rank's block (0-based offset, size) and
-- the local tensor; a DTensor's block is its local shard, a plain tensor's
-- is all of it
function M.block_of(x)
  local size = x:size()
  if not is_dtensor(x) then
    local off = {}
    for d = 1, #size do off[d] = 0 end
    return size, off, size, x
  end
  local _, off, lsize = T.shard_block(x)
  local o, s = {}, {}
  for d = 1, #size do o[d], s[d] = tonumber(off[d - 1]), tonumber(lsize[d - 1]) end
  return size, o, s, x:to_local()
end

-- describe(e): fills entry e (from state.flatten) with what save needs:
-- placements, mesh shape, global shape, block and local tensor. Partial
-- DTensors are reduced first (a collective).
local function describe(e)
  local x = e.t:detach()
  e.placements, e.mesh_shape = {}, {}
  if is_dtensor(x) then
    local pl, partial = x.placements, false
    for k, p in ipairs(pl) do
      if p:is_partial() then pl[k], partial = dist().Replicate(), true end
    end
    if partial then x = x:redistribute(pl) end
    for k, p in ipairs(x.placements) do e.placements[k] = tostring(p) end
    for k, s in ipairs(x.device_mesh.shape) do e.mesh_shape[k] = s end
  end
  e.shape, e.boff, e.bsize, e.local_t = M.block_of(x)
  e.dtype = x.dtype
  e.dtype_ = x.dtype_
end

-- each entry's key hash, dtype, shape and block into rp, W values an entry
-- (not a closure over the entries, which a compiled trace would keep)
local function encode(entries, rp)
  for i, e in ipairs(entries) do
    local b = (i - 1) * W
    rp[b] = ffi.cast("int64_t", C.lm_fnv1a(e.key, #e.key, 0))
    if e.absent then
      rp[b + 1] = ABSENT   -- another rank's path (union.lua)
    else
      describe(e)
      rp[b + 1], rp[b + 2] = e.dtype_, #e.shape
      for d = 1, #e.shape do
        rp[b + 2 + d], rp[b + 2 + MAXD + d], rp[b + 2 + 2 * MAXD + d] = e.shape[d], e.boff[d], e.bsize[d]
      end
    end
  end
end

-- writers(entries, rank, world) -> writers, mine: for each entry i,
-- writers[i] = {{rank, offset, size}, ...} (the blocks that cover it, each
-- written once), and mine[i] = true where this rank writes one. Entries
-- marked absent (another rank's paths) are filled with the dtype and size
-- of the lowest rank that holds them. Checks that the ranks holding a
-- tensor agree on it and that their blocks cover it. Collective.
function M.writers(entries, rank, world)
  local n = #entries
  local rec, rp = ranks.i64s(math.max(1, n * W))
  require("loom").no_grad(encode, entries, rp)
  local all = ranks.gather_i64(rec)
  local stride = math.max(1, n * W)
  local function at(r, i, w) return all[r * stride + (i - 1) * W + w] end
  local function off(r, i, d) return at(r, i, 2 + MAXD + d) end
  local function len(r, i, d) return at(r, i, 2 + 2 * MAXD + d) end

  local writers, mine = {}, {}
  for i, e in ipairs(entries) do
    writers[i] = {}
    local covered, first, holders = 0, nil, {}
    for r = 0, world - 1 do
      if at(r, i, 1) ~= ABSENT then first = first or r holders[#holders + 1] = r end
    end
    if e.absent then   -- its dtype and global size, from the first rank that holds it
      e.dtype_, e.shape = tonumber(at(first, i, 1)), {}
      for d = 1, tonumber(at(first, i, 2)) do e.shape[d] = tonumber(at(first, i, 2 + d)) end
    end
    local function held(r) return at(r, i, 1) ~= ABSENT end
    for r = first, world - 1 do
      if held(r) and (at(r, i, 0) ~= at(first, i, 0) or at(r, i, 1) ~= at(first, i, 1)
                      or at(r, i, 2) ~= at(first, i, 2)) then
        error(string.format("checkpoint.save: %s differs between ranks (its name, dtype or dims on rank %d "
                            .. "are not those on rank %d)", e.name, r, first), 0)
      end
      for d = 1, held(r) and #e.shape or 0 do
        if at(r, i, 2 + d) ~= at(first, i, 2 + d) then
          error(string.format("checkpoint.save: %s has another global size on rank %d than on rank %d",
                              e.name, r, first), 0)
        end
      end
      local nonempty, dup = held(r), false
      for d = 1, #e.shape do if len(r, i, d) == 0 then nonempty = false end end
      for q = first, nonempty and r - 1 or -1 do   -- a lower rank offers the same block
        local same = held(q)
        for d = 1, same and #e.shape or 0 do
          if off(q, i, d) ~= off(r, i, d) or len(q, i, d) ~= len(r, i, d) then same = false break end
        end
        if same then dup = true break end
      end
      if nonempty and not dup then
        local o, s = {}, {}
        for d = 1, #e.shape do o[d], s[d] = tonumber(off(r, i, d)), tonumber(len(r, i, d)) end
        writers[i][#writers[i] + 1] = { rank = r, offset = o, size = s }
        covered = covered + numel(s)
        if r == rank then mine[i] = true end
      end
    end
    if covered ~= numel(e.shape) then
      error(string.format("checkpoint.save: the blocks of %s on the ranks that hold it (%s) hold %d elements, "
                          .. "not the %d of its global size %s (overlapping shards, or a rank left it out?)",
                          e.name, table.concat(holders, ", "), covered, numel(e.shape), M.sizes(e.shape)), 0)
    end
  end
  return writers, mine
end

-- overlap(soff, ssize, doff, dsize) -> lo, len (0-based global offset and
-- size per dim) of the intersection of two blocks, or nil when empty
function M.overlap(soff, ssize, doff, dsize)
  local lo, len = {}, {}
  for d = 1, #ssize do
    local a = math.max(soff[d], doff[d])
    local b = math.min(soff[d] + ssize[d], doff[d] + dsize[d])
    if b <= a then return nil end
    lo[d], len[d] = a, b - a
  end
  if numel(dsize) == 0 then return nil end
  return lo, len
end

-- copy(src, soff, dst, doff, lo, len): the region (lo, len) of the global
-- tensor from src (a block at soff) into dst (a block at doff)
function M.copy(src, soff, dst, doff, lo, len)
  local from, to = src, dst
  for d = 1, #len do
    if len[d] ~= src:size(d) then from = from:narrow(d, lo[d] - soff[d] + 1, len[d]) end
    if len[d] ~= dst:size(d) then to = to:narrow(d, lo[d] - doff[d] + 1, len[d]) end
  end
  to:copy_(from)
end

return M
