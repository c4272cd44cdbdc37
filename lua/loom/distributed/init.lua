-- loom.distributed: ranks, DeviceMesh, collectives on a mesh dim and
-- communication counting. Collectives return new tensors and never write
-- their input (like torch.distributed._functional_collectives).
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local mesh_mod = require("loom.distributed.mesh")
local C = loom.C

local M = {}

local cerr, describe = T.c_error, T.describe   -- cerr(level): the C side's last error, raised at level

---------------------------------------------------------------------------
-- runtime

-- Idempotent; every other call here runs it first. Without a launcher the
-- world has one rank (MPI singleton init).
function M.init()
  if C.lm_dist_init() < 0 then cerr(2) end
end
function M.is_initialized() return C.lm_dist_is_initialized() == 1 end
function M.rank() M.init() return C.lm_dist_rank() end
function M.world_size() M.init() return C.lm_dist_world_size() end
function M.local_world_size() return C.lm_dist_local_size() end
-- PyTorch's names (torch.distributed): get_rank(group) is the rank in a
-- Group when one is given, else in the world; init_process_group starts
-- the runtime (the backend is MPI, and NCCL for CUDA tensors, whatever is
-- asked); destroy_process_group has nothing to do (the runtime ends with
-- the process).
local function of_group(fname, method, world)
  return function(group)
    if group == nil then return M[world]() end
    if getmetatable(group) ~= M.Group then T.argerror(fname, "group", "a dist.Group or nil", describe(group)) end
    return group[method](group)
  end
end
M.get_rank = of_group("get_rank", "rank", "rank")
M.get_world_size = of_group("get_world_size", "size", "world_size")
function M.get_local_rank() M.init() return tonumber(os.getenv("OMPI_COMM_WORLD_LOCAL_RANK") or os.getenv("MPI_LOCALRANKID") or 0) end
function M.is_available() return true end
function M.init_process_group() M.init() end
function M.destroy_process_group() end
function M.get_backend() return "mpi" end
-- Ends the whole job now (MPI_Abort): no rank is left waiting in a collective.
function M.abort(code) C.lm_abort(code or 1) end
-- LOOM_DEBUG_COLLECTIVES: fingerprints checked before every collective.
-- Turn it on or off on all ranks at the same point.
function M.set_debug_collectives(on) C.lm_dist_set_debug(on and 1 or 0) end
function M.debug_collectives() return C.lm_dist_debug() == 1 end

M.DeviceMesh = mesh_mod.DeviceMesh
M.Group = mesh_mod.Group
M.is_mesh = mesh_mod.is_mesh
M.current_mesh = mesh_mod.current_mesh
function M.init_device_mesh(device_type, shape, opts)
  M.init()
  return mesh_mod.init_device_mesh(device_type, shape, opts)
end

local world_group
-- The group of all ranks (no split: the world communicator itself).
function M.world_group()
  M.init()
  world_group = world_group or mesh_mod.wrap_group(C.lm_comm_world(), false)
  return world_group
end

---------------------------------------------------------------------------
-- collectives

local OPS = { sum = C.LM_RED_SUM, avg = C.LM_RED_AVG, max = C.LM_RED_MAX, min = C.LM_RED_MIN }

-- The communicator for (mesh, mesh_dim): mesh defaults to the ambient mesh
-- (mesh:use) and then to the world; a Group may stand in for a mesh.
local function comm_for(fname, t, mesh, mesh_dim)
  M.init()
  mesh = mesh or M.current_mesh()
  if mesh == nil then return C.lm_comm_world() end
  if getmetatable(mesh) == mesh_mod.Group then return mesh.comm end
  if not M.is_mesh(mesh) then
    error(string.format("%s: mesh expected a DeviceMesh (or nil for the world), got %s", fname,
                        describe(mesh)), 3)
  end
  if t ~= nil then
    local dev = t.device
    if dev:match("^[^:]*") ~= mesh.device_type then
      error(string.format("%s: tensor is on %s, but the mesh is a %q mesh", fname, dev,
                          mesh.device_type), 3)
    end
  end
  return mesh:get_group(mesh_dim).comm
end

local function op_of(fname, op)
  local id = OPS[op]
  if not id then
    error(string.format("%s: op expected \"sum\", \"avg\", \"max\" or \"min\", got %s", fname,
                        describe(op)), 3)
  end
  return id
end

local function dim_of(fname, d, argname)
  return T.cdim(d, fname, argname)
end

local Work = {}
Work.__index = Work
M.Work = Work

-- p2p moves host memory (MPI, core/comm/p2p.c): on a device mesh a tensor
-- is staged through the host. The device a receive lands on (nil: cpu),
-- from its tensor or the mesh.
local function staged_device(t, mesh)
  local dev = t ~= nil and t.device or (M.is_mesh(mesh) and mesh.device_type) or "cpu"
  return dev ~= "cpu" and dev or nil
end
-- the received host tensor on device (into it when given)
local function unstage(host, device, into)
  local moved = host:to(into and into.device or device)
  if not into then return moved end
  loom.no_grad(into.copy_, into, moved)
  return into
end

-- work:wait() blocks until the collective is done and returns its result
-- (nil for a barrier); wait again and you get the same tensor.
function Work:wait()
  if self.result == nil and not self.waited then
    if C.lm_work_wait(self.w) < 0 then cerr(2) end
    local r = C.lm_work_result(self.w)
    self.result = r ~= nil and T.wrap(r) or nil
    self.waited = true
    if self.result ~= nil and self.device then self.result = unstage(self.result, self.device, self.into) end
  end
  return self.result
end
function Work:is_completed()
  local r = C.lm_work_test(self.w)
  if r < 0 then cerr(2) end
  return r == 1
end

local function finish(ptr, async, level)
  if async then
    if ptr == nil then cerr(level + 1) end
    return setmetatable({ w = ffi.gc(ptr, C.lm_work_free) }, Work)
  end
  return T.wrap(ptr, level + 1)
end

-- lm_<name>(...) as a tensor, or lm_<name>_async(...) as a Work when async
-- (a tail call, so errors land where finish's level says)
local function issue(name, async, ...)
  if async then return finish(C["lm_" .. name .. "_async"](...), true, 2) end
  return finish(C["lm_" .. name](...), false, 2)
end

local function opts_of(fname, opts)
  if opts == nil then return false, nil end
  if type(opts) ~= "table" then
    error(string.format("%s: options expected a table like {async_op = true}, got %s", fname,
                        describe(opts)), 3)
  end
  return opts.async_op == true, opts
end

local function full_of(fname, opts)
  local f = opts and opts.full_size
  if f == nil then return -1 end
  if type(f) ~= "number" or f < 0 or f ~= math.floor(f) then
    error(string.format("%s: full_size expected an integer >= 0, got %s", fname, describe(f)), 3)
  end
  return f
end

-- all_reduce(t, "sum"|"avg"|"max"|"min", mesh, mesh_dim, {async_op})
function M.all_reduce(t, op, mesh, mesh_dim, opts)
  local f = "all_reduce"
  T.check_tensor(t, f, "tensor")
  local async = opts_of(f, opts)
  local c, o = comm_for(f, t, mesh, mesh_dim), op_of(f, op or "sum")
  return issue("all_reduce", async, c, t, o)
end

-- all_gather(t, gather_dim, mesh, mesh_dim, {full_size, async_op}): the
-- ranks' tensors concatenated on gather_dim. full_size (uneven shards):
-- the gathered size, each rank holding its torch.chunk share of it.
function M.all_gather(t, gather_dim, mesh, mesh_dim, opts)
  local f = "all_gather"
  T.check_tensor(t, f, "tensor")
  local async, o = opts_of(f, opts)
  local c, d, full = comm_for(f, t, mesh, mesh_dim), dim_of(f, gather_dim or 1, "gather_dim"), full_of(f, o)
  return issue("all_gather", async, c, t, d, full)
end

-- agree(what, value, mesh, mesh_dim): every rank of the group (the world
-- without a mesh) must hold the same value (a string: a layout, a
-- schedule, a rotate method); else the same error on every rank naming
-- the first rank that differs from rank 0 of the group and both values.
-- Collective: a hash each, and the values (their first 200 bytes) only
-- when the hashes differ.
local AGREE_BYTES = 200
function M.agree(what, value, mesh, mesh_dim)
  local s = tostring(value)
  local on = { dtype = "i64", device = mesh and mesh.device_type or "cpu" }   -- (a cuda mesh's NCCL takes no host memory)
  local h = loom.tensor({ tonumber(C.lm_fnv1a(s, #s, 0) % 2 ^ 52) }, on)
  local hs = M.all_gather(h, 1, mesh, mesh_dim):totable()
  local first_other
  for r = 2, #hs do if hs[r] ~= hs[1] then first_other = first_other or r end end
  if not first_other then return end
  local bytes = {}
  for i = 1, AGREE_BYTES do bytes[i] = s:byte(i) or 0 end
  local all = M.all_gather(loom.tensor(bytes, on):reshape(1, AGREE_BYTES), 1, mesh, mesh_dim):totable()
  local function text(r)
    local cs = {}
    for _, b in ipairs(all[r]) do if b == 0 then break end cs[#cs + 1] = string.char(b) end
    return table.concat(cs)
  end
  error(string.format("%s differ between the ranks: rank 0 of the group has %q, rank %d has %q", what, text(1),
                      first_other - 1, text(first_other)), 2)
end

-- reduce_scatter(t, op, scatter_dim, mesh, mesh_dim, {async_op}): reduces,
-- then keeps this rank's torch.chunk share of scatter_dim.
function M.reduce_scatter(t, op, scatter_dim, mesh, mesh_dim, opts)
  local f = "reduce_scatter"
  T.check_tensor(t, f, "tensor")
  local async = opts_of(f, opts)
  local c, o, d = comm_for(f, t, mesh, mesh_dim), op_of(f, op or "sum"), dim_of(f, scatter_dim or 1, "scatter_dim")
  return issue("reduce_scatter", async, c, t, o, d)
end

-- all_to_all(t, split_dim, cat_dim, mesh, mesh_dim, {full_size, async_op}):
-- chunk i of split_dim goes to rank i; what arrives is concatenated on
-- cat_dim. full_size: cat_dim's gathered size when ranks hold uneven shares.
function M.all_to_all(t, split_dim, cat_dim, mesh, mesh_dim, opts)
  local f = "all_to_all"
  T.check_tensor(t, f, "tensor")
  local async, o = opts_of(f, opts)
  local c = comm_for(f, t, mesh, mesh_dim)
  local sd, cd = dim_of(f, split_dim or 1, "split_dim"), dim_of(f, cat_dim or 1, "cat_dim")
  local full = full_of(f, o)
  return issue("all_to_all", async, c, t, sd, cd, full)
end

-- broadcast(t, src, mesh, mesh_dim, {async_op}): src's tensor on every rank.
-- src is a rank of the group (its coordinate on mesh_dim; the world rank
-- for the world); other ranks' t gives only the shape and dtype.
function M.broadcast(t, src, mesh, mesh_dim, opts)
  local f = "broadcast"
  T.check_tensor(t, f, "tensor")
  local async = opts_of(f, opts)
  local c = comm_for(f, t, mesh, mesh_dim)
  src = src or 0
  if type(src) ~= "number" or src ~= math.floor(src) then
    error("broadcast: src expected a rank (an integer), got " .. describe(src), 2)
  end
  return issue("broadcast", async, c, t, src)
end

-- barrier(mesh, mesh_dim, {async_op}); no mesh: all ranks.
function M.barrier(mesh, mesh_dim, opts)
  local f = "barrier"
  local async = opts_of(f, opts)
  local c = comm_for(f, nil, mesh, mesh_dim)
  if async then
    local w = C.lm_barrier_async(c)
    if w == nil then cerr(2) end
    return setmetatable({ w = ffi.gc(w, C.lm_work_free) }, Work)
  end
  if C.lm_barrier(c) < 0 then cerr(2) end
end

---------------------------------------------------------------------------
-- all_to_all_single: rows exchanged by split sizes (the token dispatch of
-- expert parallelism), as PyTorch's. Splits are row counts along dim 1, one
-- per rank of the group, given as a Lua list or an i64 tensor; nil means
-- even (the rows divided by the group's size). The ranks check each other's
-- splits before moving data (with the collective fingerprints, on by
-- default): a disagreement fails on every rank, naming the ranks.

-- splits as an i64 tensor of k counts on x's device (nil: even shares of rows)
local function splits_of(fname, arg, s, k, rows, x)
  if s == nil then
    if rows % k ~= 0 then
      error(string.format("%s: %s is nil (even), but %d rows do not divide by the group's %d ranks",
                          fname, arg, rows, k), 4)
    end
    local even = {}
    for q = 1, k do even[q] = rows / k end
    s = even
  end
  if T.is_tensor(s) then
    if s.dtype ~= "i64" or s:dim() ~= 1 or s:size(1) ~= k then
      T.argerror(fname, arg, string.format("an i64 tensor of %d row counts", k),
                 s.dtype .. " tensor of size " .. tostring(s:size()), 4)
    end
    return s.device == x.device and s or s:to(x.device)
  end
  if type(s) ~= "table" or #s ~= k then
    T.argerror(fname, arg, string.format("a list of %d row counts (one per rank of the group)", k), describe(s), 4)
  end
  for q = 1, k do
    if not T.is_int(s[q]) then T.argerror(fname, arg .. "[" .. q .. "]", "an integer row count", describe(s[q]), 4) end
  end
  return loom.tensor(s, { dtype = "i64", device = x.device })
end

-- the op, recorded by autograd: input's rows by the splits over (mesh,
-- mesh_dim); out_rows: the rows nil output_splits shares (input's if nil)
local function a2a(fname, input, output_splits, input_splits, mesh, mesh_dim, out_rows)
  T.check_tensor(input, fname, "input")
  if input:dim() == 0 then T.argerror(fname, "input", "a tensor of at least 1 dim", "a 0-dim tensor", 3) end
  local c = comm_for(fname, input, mesh, mesh_dim)
  local k = C.lm_comm_size(c)
  local os = splits_of(fname, "output_splits", output_splits, k, out_rows or input:size(1), input)
  local is = splits_of(fname, "input_splits", input_splits, k, input:size(1), input)
  return T.op(C.LM_OP_DIST_ALL_TO_ALL_SINGLE, { input, os, is }, nil, nil, { c })
end

-- all_to_all_single(output, input, output_splits, input_splits, mesh, mesh_dim):
-- torch.distributed.all_to_all_single: rank q's rows arrive in output
-- (written in place, returned), not recorded by autograd (the functional
-- form is). output_splits nil: output's rows in even shares.
function M.all_to_all_single(output, input, output_splits, input_splits, mesh, mesh_dim)
  local f = "all_to_all_single"
  T.check_tensor(output, f, "output")
  local rows = output:dim() > 0 and output:size(1) or 0
  local r = loom.no_grad(a2a, f, input, output_splits, input_splits, mesh, mesh_dim, rows)
  -- checked after the exchange, which every rank joins: a wrong output on
  -- one rank fails there without leaving the others waiting
  if not (r:size() == output:size()) then
    T.argerror(f, "output", "a tensor of size " .. tostring(r:size()) .. " (the rows output_splits gives)",
               "one of size " .. tostring(output:size()), 2)
  end
  loom.no_grad(output.copy_, output, r)
  return output
end

-- Differentiable collectives returning new tensors that autograd records,
-- as torch.distributed._functional_collectives (and nn.functional).
M.functional = {}

-- functional.all_to_all_single(input, output_splits, input_splits, mesh, mesh_dim):
-- the rows from every rank of the group, concatenated in rank order; its
-- gradient is the reverse exchange (the splits swapped). Both splits or
-- neither (even), as PyTorch's.
function M.functional.all_to_all_single(input, output_splits, input_splits, mesh, mesh_dim)
  local f = "functional.all_to_all_single"
  if (output_splits == nil) ~= (input_splits == nil) then
    error(f .. ": output_splits and input_splits are given together or both nil (even), got only "
          .. (output_splits == nil and "input_splits" or "output_splits"), 2)
  end
  return a2a(f, input, output_splits, input_splits, mesh, mesh_dim)
end

---------------------------------------------------------------------------
-- point-to-point: peers are ranks of the group (coordinates on mesh_dim;
-- world ranks without a mesh), 0-based like src in broadcast.

local function p2p_args(f, t, peer, pname, mesh, mesh_dim, opts)
  if t ~= nil or f == "send" then T.check_tensor(t, f, "tensor") end
  local async, o = opts_of(f, opts)
  local c = comm_for(f, t, mesh, mesh_dim)
  if type(peer) ~= "number" or peer ~= math.floor(peer) then
    error(string.format("%s: %s expected a rank (an integer), got %s", f, pname, describe(peer)), 3)
  end
  local tag = o and o.tag or 0
  if type(tag) ~= "number" or tag ~= math.floor(tag) then
    error(string.format("%s: tag expected an integer in [0, 32767], got %s", f, describe(tag)), 3)
  end
  return c, async, tag
end

-- send(t, dst, mesh, mesh_dim, {tag, async_op}): t to rank dst of the group.
-- With async_op a Work (wait() returns nil); else it returns once t's bytes
-- are out of t (t may be reused then).
function M.send(t, dst, mesh, mesh_dim, opts)
  local c, async, tag = p2p_args("send", t, dst, "dst", mesh, mesh_dim, opts)
  if staged_device(t, mesh) then t = t:to("cpu") end   -- (the Work keeps the host copy)
  if async then return finish(C.lm_isend(c, t, dst, tag), true, 2) end
  if C.lm_send(c, t, dst, tag) < 0 then cerr(2) end
end

-- recv(t, src, mesh, mesh_dim, {tag, async_op}): fills t (contiguous, the
-- sender's dtype and shape) from rank src and returns it (async: a Work
-- whose wait() returns t). t nil: a new tensor of the sender's shape (on
-- the mesh's device). On a device mesh both ends go through host memory.
function M.recv(t, src, mesh, mesh_dim, opts)
  local c, async, tag = p2p_args("recv", t, src, "src", mesh, mesh_dim, opts)
  local dev = staged_device(t, mesh)
  if async or t == nil or dev then
    local host = (dev and t ~= nil) and loom.empty(t:size(), { dtype = t.dtype }) or t
    local w = finish(C.lm_irecv(c, host, src, tag), true, 2)
    w.device, w.into = dev, dev and t or nil
    return async and w or w:wait()
  end
  if C.lm_recv(c, t, src, tag) < 0 then cerr(2) end
  return t
end
function M.isend(t, dst, mesh, mesh_dim, opts)
  opts = opts or {}
  return M.send(t, dst, mesh, mesh_dim, { tag = opts.tag, async_op = true })
end
function M.irecv(t, src, mesh, mesh_dim, opts)
  opts = opts or {}
  return M.recv(t, src, mesh, mesh_dim, { tag = opts.tag, async_op = true })
end

-- sendrecv(t, dst, src, mesh, mesh_dim, {tag}): sends t to dst while
-- receiving a tensor of t's shape and dtype from src (one step of a ring).
function M.sendrecv(t, dst, src, mesh, mesh_dim, opts)
  local out = loom.empty(t:size(), { dtype = t.dtype, device = t.device })
  local r = M.irecv(out, src, mesh, mesh_dim, opts)
  local s = M.isend(t, dst, mesh, mesh_dim, opts)
  s:wait()
  return r:wait()
end

-- torch.chunk sizes: rows of chunk i (1-based) when n rows split in k.
function M.chunk_size(n, k, i) return tonumber(C.lm_chunk_size(n, k, i - 1)) end
function M.chunk_offset(n, k, i) return tonumber(C.lm_chunk_offset(n, k, i - 1)) end

---------------------------------------------------------------------------
-- counting, like PyTorch's CommDebugMode

local KINDS = { "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier",
                "send", "recv" }
M.collective_kinds = KINDS

local function pack(...) return { n = select("#", ...), ... } end

local function snapshot()
  local n, b = ffi.new("int64_t[?]", #KINDS), ffi.new("int64_t[?]", #KINDS)
  C.lm_comm_stats(n, b)
  return n, b
end

local CommMode = {}
CommMode.__index = CommMode
M.CommMode = CommMode

-- counts of the kinds issued at least once, as PyTorch's get_comm_counts
function CommMode:get_comm_counts()
  local r = {}
  for _, k in ipairs(KINDS) do if self.counts[k] > 0 then r[k] = self.counts[k] end end
  return r
end
function CommMode:get_total_counts()
  local s = 0
  for _, k in ipairs(KINDS) do s = s + self.counts[k] end
  return s
end
function CommMode:__tostring()
  local parts = {}
  for _, k in ipairs(KINDS) do
    if self.counts[k] > 0 then
      parts[#parts + 1] = string.format("%s: %d (%d bytes)", k, self.counts[k], self.bytes[k])
    end
  end
  return "CommMode{" .. table.concat(parts, ", ") .. "}"
end

-- local cm, ... = dist.comm_mode(fn, ...): runs fn(...) and returns the
-- collectives it issued on this rank, then fn's results.
-- cm.counts[kind] and cm.bytes[kind] (every kind, zeros included; bytes are
-- those of the local input tensors), cm:get_comm_counts(), cm:get_total_counts().
function M.comm_mode(fn, ...)
  if type(fn) ~= "function" then
    error("comm_mode: expected a function, got " .. describe(fn), 2)
  end
  local n0, b0 = snapshot()
  local res = pack(fn(...))
  local n1, b1 = snapshot()
  local cm = setmetatable({ counts = {}, bytes = {} }, CommMode)
  for i, k in ipairs(KINDS) do
    cm.counts[k] = tonumber(n1[i - 1] - n0[i - 1])
    cm.bytes[k] = tonumber(b1[i - 1] - b0[i - 1])
  end
  return cm, unpack(res, 1, res.n)
end

---------------------------------------------------------------------------
-- DTensor and its placements under dist, as torch.distributed.tensor
-- names them (loom.distributed.dtensor, which needs this table first)
package.loaded["loom.distributed"] = M
do
  local dt = require("loom.distributed.dtensor")
  for _, name in ipairs { "Shard", "Replicate", "Partial", "is_placement", "is_dtensor", "DTensor", "from_local",
                          "distribute_tensor", "empty", "zeros", "ones", "rand", "randn", "full",
                          "implicit_replication", "visualize_sharding", "_c_mesh", "_sync_rng" } do
    M[name] = dt[name]
  end
end

-- loaded on first use: dist.checkpoint (distributed checkpoints), and the
-- data-parallel wrappers dist.fully_shard (FSDP, loom.distributed.fsdp)
-- and dist.replicate (DDP, loom.distributed.replicate)
local lazy = { checkpoint = function() return require("loom.distributed.checkpoint") end,
               fully_shard = function() return require("loom.distributed.fsdp").fully_shard end,
               replicate = function() return require("loom.distributed.replicate").replicate end }
setmetatable(M, { __index = function(t, k)
  local f = lazy[k]
  if not f then return nil end
  rawset(t, k, f())
  return rawget(t, k)
end })

return M
