-- dist.checkpoint: distributed checkpoints. Every rank writes the shards it
-- owns, rank 0 writes a manifest, and load reshards onto whatever mesh and
-- placements the given state_dict has. The pieces: format.lua (the files
-- and the atomic replacement), plan.lua (who writes which block, which part
-- of a saved block a rank reads), state.lua (a state_dict as paths),
-- ranks.lua (agreement between ranks), optim.lua (optimizer state),
-- interop.lua (loom.save's files and checkpoint directories read each other).
--
-- Who writes what: every rank offers the block of each tensor it holds
-- (a DTensor's local shard, the whole of a plain tensor); of the ranks
-- offering the same block, the lowest world rank writes it, so replicated
-- data (Replicate dims, meshes that are a slice of the world, plain
-- tensors) is written once. Partial DTensors are reduced first (a
-- redistribute to Replicate on their Partial dims, a collective).
--
-- save and load are collective over the world: every rank calls them (SPMD),
-- with the same paths or, as pipeline stages do, each with its own: save
-- writes the union (union.lua) and load fills whatever paths a rank's
-- state_dict asks for, at any layout. An error on any rank is
-- raised on every rank (the failing rank's message), so none is left
-- waiting in a collective. The directory must be visible to every rank
-- (a shared filesystem on several machines).
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local format = require("loom.distributed.checkpoint.format")
local plan = require("loom.distributed.checkpoint.plan")
local state = require("loom.distributed.checkpoint.state")
local ranks = require("loom.distributed.checkpoint.ranks")
local optim = require("loom.distributed.checkpoint.optim")
local interop = require("loom.distributed.checkpoint.interop")
local union = require("loom.distributed.checkpoint.union")
local fs = require("loom.fs")
local C = loom.C

local M = {}

M.MANIFEST = format.MANIFEST
M.optim_state_dict = optim.optim_state_dict
M.load_optim_state_dict = optim.load_optim_state_dict
M.param_index = optim.param_index

-- A hook for tests: called on every rank with a stage name ("write", after
-- the directory is made and before any shard is written; "rename", after
-- every file is complete and before the rename). An error it raises
-- aborts the save on every rank at that point, as a crash would.
M._hook = nil

local function dist() return require("loom.distributed") end
local together, numel = ranks.together, plan.numel

local function dir_arg(fname, dir)
  if type(dir) ~= "string" or dir == "" then T.argerror(fname, "dir", "a directory name", T.describe(dir), 3) end
  return (dir:gsub("(.)/+$", "%1"))
end

---------------------------------------------------------------------------
-- save

-- the manifest's file and tensor tables, from what every rank wrote
local function manifest_of(entries, writers, done, dstride, world)
  local files = {}
  for r = 0, world - 1 do
    files[r + 1] = { name = format.shard_file(r), size = tonumber(done[r * dstride]),
                     checksum = ffi.cast("uint64_t", done[r * dstride + 1]) }
  end
  local cursor, tensors = {}, {}
  for i, e in ipairs(entries) do
    local shards = {}
    for _, w in ipairs(writers[i]) do
      local nbytes = numel(w.size) * C.lm_dtype_size(e.dtype_)
      local at0 = cursor[w.rank] or 0
      shards[#shards + 1] = { file = w.rank + 1, byte_offset = at0, nbytes = nbytes, offset = w.offset,
                              size = w.size, checksum = ffi.cast("uint64_t", done[w.rank * dstride + 1 + i]) }
      cursor[w.rank] = at0 + nbytes
    end
    tensors[i] = { path = e.keys, name = e.name, shape = e.shape, dtype = e.dtype, placements = e.placements,
                   mesh_shape = e.mesh_shape, shards = shards }
  end
  for r = 0, world - 1 do
    if (cursor[r] or 0) ~= files[r + 1].size then
      error(string.format("checkpoint.save: %s holds %d bytes, expected %d", format.shard_file(r),
                          files[r + 1].size, cursor[r] or 0), 0)
    end
  end
  return files, tensors
end

-- The steps of save, each run by together() on every rank. They are
-- functions of the module taking the save's state (ctx) as an argument, not
-- closures over it, which a compiled trace would keep (and with it the
-- state_dict): docs/architecture.md.
local function flatten_checked(state_dict)
  local ts, vs = state.flatten(state_dict, "checkpoint.save")
  for _, e in ipairs(ts) do
    if e.t:dim() > plan.MAXD then error("checkpoint.save: " .. e.name .. " has more than 8 dims", 0) end
  end
  return { ts, vs }
end
local function union_of(ctx) return { union.union(ctx.entries, ctx.values, ctx.world) } end
local function describe_absent(ctx) union.describe_absent(ctx.entries, ctx.world) end
local function hook(what) if M._hook then M._hook(what) end end
local function make_tmp(ctx)
  if ctx.rank ~= 0 then return end
  ctx.lock = format.lock(ctx.dir)
  format.make_tmp(ctx.dir)
end
local function write_own(ctx)
  return { format.write_shards(ctx.tmp .. "/" .. format.shard_file(ctx.rank), ctx.entries, ctx.mine) }
end
local function write_manifest(ctx, done, dstride)
  if ctx.rank ~= 0 then return end
  local files, tensors = manifest_of(ctx.entries, ctx.writers, done, dstride, ctx.world)
  format.write_manifest(ctx.tmp, { world_size = ctx.world, files = files, tensors = tensors, values = ctx.values })
end
local function install(ctx) if ctx.rank == 0 then format.install(ctx.dir) end end

-- the temporary directory, every rank's shard file, the manifest, then the
-- rename into place
local function write_all(ctx)
  together(make_tmp, ctx)
  together(hook, "write")
  -- this rank's file, then what every rank wrote
  local n = #ctx.entries
  local res = together(write_own, ctx)
  local out, op = ranks.i64s(2 + math.max(1, n))
  op[0], op[1] = res[1], ffi.cast("int64_t", res[2])
  for i = 1, n do op[1 + i] = res[3][i] and ffi.cast("int64_t", res[3][i]) or 0 end
  local done = ranks.gather_i64(out)
  together(write_manifest, ctx, done, 2 + math.max(1, n))
  together(hook, "rename")
  together(install, ctx)
end

-- save(state_dict, dir): collective; see the top of the file.
function M.save(state_dict, dir)
  if type(state_dict) ~= "table" then T.argerror("checkpoint.save", "state_dict", "a table", T.describe(state_dict)) end
  dir = dir_arg("checkpoint.save", dir)
  local D = dist()
  D.init()
  local ctx = { rank = D.rank(), world = D.world_size(), dir = dir, tmp = format.tmp_of(dir) }
  local flat = together(flatten_checked, state_dict)
  ctx.entries, ctx.values = flat[1], flat[2]
  -- every rank's paths (pipeline stages hold different layers)
  local u = together(union_of, ctx)
  ctx.entries, ctx.values = u[1], u[2]
  ctx.writers, ctx.mine = plan.writers(ctx.entries, ctx.rank, ctx.world)
  together(describe_absent, ctx)
  local ok, err = pcall(write_all, ctx)
  fs.unlock(ctx.lock)   -- rank 0's hold on DIR.lock, from make_tmp to install
  if not ok then error(err, 0) end
end

---------------------------------------------------------------------------
-- load

-- fills the tensors of entries (from state.flatten) from the saved tensors
-- (by path key), each rank reading the parts of the saved shards that
-- overlap its own block; read(shard, te) returns a saved shard's tensor
local function fill(entries, saved, read, where, strict, fname)
  for _, e in ipairs(entries) do
    local te = saved[e.key]
    if te == nil then
      if strict then error(string.format("%s: tensor %s is not in the checkpoint %s", fname, e.name, where), 0) end
    else
      local x = e.t
      if x.dtype ~= te.dtype then
        error(string.format("%s: tensor %s: the state_dict's is %s, the checkpoint's (%s) is %s", fname, e.name,
                            x.dtype, where, te.dtype), 0)
      end
      local shape, boff, bsize, L = plan.block_of(x)
      if plan.sizes(shape) ~= plan.sizes(te.shape) then
        error(string.format("%s: tensor %s: the state_dict's has size %s, the checkpoint's (%s) has %s", fname,
                            e.name, plan.sizes(shape), where, plan.sizes(te.shape)), 0)
      end
      for _, p in ipairs(plan.is_dtensor(x) and x.placements or {}) do
        if p:is_partial() then
          error(string.format("%s: tensor %s: cannot load into a Partial DTensor (use Replicate or Shard)",
                              fname, e.name), 0)
        end
      end
      local dst = L.device == "cpu" and L or TC.empty(bsize, { dtype = x.dtype })
      for _, sh in ipairs(te.shards) do
        local lo, len = plan.overlap(sh.offset, sh.size, boff, bsize)
        if lo then plan.copy(read(sh, te), sh.offset, dst, boff, lo, len) end
      end
      if dst ~= L then L:copy_(dst:to(L.device)) end
    end
  end
end

-- the checkpoint dir (or loom.save file) into state_dict, in place
local function load_into(state_dict, dir, strict, fname)
  local saved, close, where = {}, function() end, dir
  local values, read
  if fs.is_file(dir) then
    saved, values, read = interop.read_file(dir, fname)
  else
    local m
    m, where = format.read_manifest(dir, fname)
    for _, te in ipairs(m.tensors) do saved[state.path_key(te.path)] = te end
    values = m.values
    read, close = format.reader(dir, m, fname)
  end
  local entries = state.flatten(state_dict, fname)
  local ok, err = pcall(loom.no_grad, fill, entries, saved, read, where, strict, fname)
  close()
  if not ok then error(err, 0) end
  state.merge_values(values or {}, state_dict)
end

-- load(state_dict, dir, {strict = true}): collective; fills the tensors of
-- state_dict in place (each rank reads the parts of the saved shards that
-- overlap its own block), and assigns the saved non-tensor values into
-- state_dict's tables. strict: a tensor of state_dict missing from the
-- checkpoint is an error (otherwise it is left as it is). Tensors in the
-- checkpoint that state_dict lacks are ignored. Returns state_dict.
-- dir may also be a file that loom.save wrote (a state_dict of whole
-- tensors): each rank then takes its block of them.
function M.load(state_dict, dir, opts)
  if type(state_dict) ~= "table" then T.argerror("checkpoint.load", "state_dict", "a table", T.describe(state_dict)) end
  dir = dir_arg("checkpoint.load", dir)
  local strict = not (opts and opts.strict == false)
  dist().init()
  together(load_into, state_dict, dir, strict, "checkpoint.load")
  return state_dict
end

-- verify(dir): reads every file of the checkpoint and checks its size and
-- checksum against the manifest (no collectives; any rank may call it).
-- Returns true, or raises naming the file.
function M.verify(dir)
  if type(dir) ~= "string" then T.argerror("checkpoint.verify", "dir", "a directory name", T.describe(dir)) end
  format.verify((dir:gsub("(.)/+$", "%1")), "checkpoint.verify")
  return true
end

return M
