-- fsdp.lua: fully_shard, sharded data parallelism with PyTorch FSDP2's
-- semantics, composed with tensor parallelism.
--
--   fsdp.fully_shard(block, {mesh = mesh["dp"], reshard_after_forward = true})  -- each block,
--   fsdp.fully_shard(model, {mesh = mesh["dp"]})                                -- then the root
--
-- Between steps a unit's parameters are DTensors sharded over dp on top of
-- their TP placement (a TP weight on mesh["tp"] becomes a DTensor on the 2-D
-- {dp, tp} mesh), so state_dict, optimizers, clip_grad_norm_ and
-- checkpoints see ordinary DTensors holding 1/(dp*tp) of each tensor.
--
-- One step of a unit:
--   forward pre-hook  all-gather the unit's shards over dp (one flat
--                     collective) into plain leaves `u` holding the TP-local
--                     tensors, bound into the modules (as the TP DTensor,
--                     via from_local) for the forward; the next unit's
--                     all-gather is started (prefetch)
--   forward hook      the sharded parameters bound again; with
--                     reshard_after_forward the gathered data is released
--                     (autograd's saved tensors keep only its address) and a
--                     pre-backward hook goes on the unit's output
--   pre-backward      the data gathered again (or the prefetched gather
--                     waited for) and restored in place; the next unit in
--                     backward order is prefetched
--   grad-ready hooks  once every `u` of the unit has its gradient, one
--                     async reduce-scatter (avg over dp) starts while
--                     backward goes on; `u` is released
--   end of backward   the reduce-scatters are waited for; each result is
--                     the sharded parameter's .grad (accumulated if one is
--                     there)
-- The root unit (the one no other unit contains) keeps its parameters
-- gathered from forward to the end of backward, as FSDP2 does.
-- Under no_grad (evaluation) the forward gathers into temporaries that are
-- freed after it, with no hooks.
local loom = require("loom")
local T = require("loom.tensor")
local dist = require("loom.distributed")
local hooks = require("loom.autograd_hooks")
local L = require("loom.distributed.fsdp_layout")
local setup = require("loom.distributed.fsdp_setup")
local C = loom.C

local M = {}

-- what one backward has under way, across all units
-- (sync false: backwards accumulate into the gathered leaves and reduce
-- nothing, for pipeline microbatches; see set_requires_gradient_sync)
local G = { queued = false, pending = {}, touched = {}, pre = {}, sync = true }

-- units with gathered data or a gather in flight, in the order they got it
local function touch(unit)
  if G.touched[unit] then return end
  G.touched[unit] = true
  G.touched[#G.touched + 1] = unit
end

---------------------------------------------------------------------------
-- gathering

-- the sharded parameters' versions: a gather is stale once one changed
local function versions(unit)
  local v = {}
  for i, e in ipairs(unit.entries) do v[i] = e.sharded:_version() end
  return v
end
local function changed(unit, v)
  for i, e in ipairs(unit.entries) do
    if e.sharded:_version() ~= v[i] then return true end
  end
  return false
end
local function stale(unit) return unit.live == nil or changed(unit, unit.live.versions) end

-- the unit's local shards packed into one flat tensor. (This and assign_all
-- are functions of the module, not closures over units, which a compiled
-- trace would keep: docs/architecture.md.)
local function pack_unit(unit)
  local shards = {}
  for i, e in ipairs(unit.entries) do shards[i] = e.sharded:to_local() end
  return L.pack_shards(unit.infos, shards)
end

-- the dp all-gather of a unit's shards, started (the flat input is kept
-- with the Work until it is waited for)
local function start_gather(unit)
  touch(unit)
  local flat = loom.no_grad(pack_unit, unit)   -- (forward pre-hooks run with autograd on)
  unit.inflight = { flat = flat, versions = versions(unit),
                    work = dist.all_gather(flat, 1, unit.mesh, 1, { async_op = true }) }
end

-- the TP-local tensors of the unit, from the gather in flight (started now
-- when none is)
local function take_gather(unit)
  if #unit.entries == 0 then return {} end
  if unit.inflight and changed(unit, unit.inflight.versions) then   -- a prefetch from before a step
    unit.inflight.work:wait()
    unit.inflight = nil
  end
  if not unit.inflight then start_gather(unit) end
  local out = unit.inflight.work:wait()
  unit.inflight = nil
  return loom.no_grad(L.unpack_full, unit.infos, out)
end

-- what the module sees: the TP DTensor over the gathered local tensor
local function view_of(e, t)
  if e.tp then return dist.from_local(t, e.tp.mesh, e.tp.placements, { shape = e.tp.shape }) end
  return t
end

local function bind(unit, tensors)
  unit.bound = true
  for i, e in ipairs(unit.entries) do
    local v = view_of(e, tensors[i])
    for _, s in ipairs(e.sites) do rawget(s.module, "_parameters")[s.name] = v end
  end
end

local function unbind(unit)
  unit.bound = false
  for _, e in ipairs(unit.entries) do
    for _, s in ipairs(e.sites) do rawget(s.module, "_parameters")[s.name] = e.sharded end
  end
end

local function release(ts)
  for _, t in ipairs(ts) do C.lm_release_data(t) end
end

---------------------------------------------------------------------------
-- gradients

local finish

local function ensure_queued()
  if not G.queued then
    G.queued = true
    hooks.queue_callback(finish)
  end
end

-- one async reduce-scatter (avg over dp) of the gradients the unit's
-- leaves have; the gathered data is no longer needed by this backward
local function launch_reduce(unit)
  local live = unit.live
  live.launched = true
  local infos, grads, entries = {}, {}, {}
  for i, u in ipairs(live.u) do
    local g = u.requires_grad and u.grad or nil
    if g ~= nil then
      infos[#infos + 1], grads[#grads + 1], entries[#entries + 1] = unit.infos[i], g, unit.entries[i]
      u.grad = nil
    end
  end
  release(live.u)
  if #grads == 0 then return end
  local flat = loom.no_grad(L.pack_grads, infos, grads)
  local rec = { infos = infos, entries = entries, flat = flat,
                work = dist.reduce_scatter(flat, "avg", 1, unit.mesh, 1, { async_op = true }) }
  if not unit.overlap then rec.work:wait() end
  G.pending[#G.pending + 1] = rec
end

local function grad_ready(unit)
  ensure_queued()
  if not G.sync then return end
  local live = unit.live
  live.ready = live.ready + 1
  if live.ready == live.ngrad and not live.launched then launch_reduce(unit) end
end

-- the reduce-scattered gradients become the sharded parameters' .grad
local function assign(rec)
  local pieces = L.unpack_shards(rec.infos, rec.work:wait())
  for i, e in ipairs(rec.entries) do
    local p = e.sharded
    local old = p.grad
    if old ~= nil then
      local o = old:to_local()
      o:copy_(o + pieces[i])
    else
      p.grad = dist.from_local(pieces[i], e.mesh, e.placements, { shape = e.shape })
    end
  end
end

local function assign_all(pending) for _, rec in ipairs(pending) do assign(rec) end end

-- end of backward: the last reductions, then every unit back to sharded
function finish()
  G.queued = false
  if not G.sync then return end   -- more backwards of this step to come
  local touched = G.touched
  G.touched, G.pre = {}, {}
  for _, unit in ipairs(touched) do
    if unit.live and not unit.live.launched then launch_reduce(unit) end
  end
  local pending = G.pending
  G.pending = {}
  loom.no_grad(assign_all, pending)
  for _, unit in ipairs(touched) do
    if unit.inflight then unit.inflight.work:wait() unit.inflight = nil end  -- a prefetch nobody took
    local live = unit.live
    if live then
      for _, h in ipairs(live.handles) do h.remove() end
      release(live.u)
      unit.live = nil
    end
  end
end

---------------------------------------------------------------------------
-- forward and backward hooks

-- the unit's parameters gathered into fresh leaves (or those of this step
-- again: a unit may run twice before backward)
local function unshard(unit)
  local live = unit.live
  if live and not stale(unit) then
    if live.released then
      local full = take_gather(unit)
      for i, u in ipairs(live.u) do C.lm_restore_data(u, full[i]) end
      live.released = false
    end
    return
  end
  if live then for _, h in ipairs(live.handles) do h.remove() end end
  local full = take_gather(unit)
  live = { u = {}, handles = {}, ready = 0, ngrad = 0, versions = versions(unit), released = false }
  unit.live = live
  for i, e in ipairs(unit.entries) do
    local u = full[i]
    if e.requires_grad then
      u:requires_grad_(true)
      live.ngrad = live.ngrad + 1
      live.handles[#live.handles + 1] = u:register_grad_ready_hook(function() grad_ready(unit) end)
    end
    live.u[i] = u
  end
  touch(unit)
end

local function needs_gather(unit)
  return #unit.entries > 0 and not unit.inflight and (stale(unit) or unit.live.released)
end

local function prefetch(unit)
  if unit and unit.overlap and needs_gather(unit) then start_gather(unit) end
end

local function pre_backward(unit, live)
  ensure_queued()
  if unit.live ~= live then
    error(string.format("fully_shard: backward reached an output of a forward of the %s whose gathered parameters "
                        .. "an earlier backward already released (two forwards, then two backwards): a unit keeps "
                        .. "one forward's parameters until a backward ends; call backward after each forward, or "
                        .. "add the losses and call backward once", unit.module.__name or "module"), 0)
  end
  if not unit.live then return end
  if unit.live.released then unshard(unit) end
  -- backward meets the root first, then the units in reverse forward order
  local root = setup.root_of(unit)
  local order, pos = root.order, unit.pos
  if pos then
    local nxt = pos == 1 and order[#order] or order[pos - 1]
    if nxt and nxt ~= root then prefetch(nxt) end
  end
end

-- a pre-backward hook on each tensor of the unit's output (several units
-- may return the same tensor: one hook calls them all)
local function hook_outputs(unit, out)
  local function one(t)
    if not (T.is_tensor(t) and t.requires_grad and not t.is_leaf) then return end
    local key = T.address(t)
    local list = G.pre[key]
    if not list then
      list = {}
      G.pre[key] = list
      t:register_pre_backward_hook(function() for _, u in ipairs(list) do pre_backward(u[1], u[2]) end end)
    end
    list[#list + 1] = { unit, unit.live }
  end
  if type(out) == "table" and not T.is_tensor(out) then
    for _, t in pairs(out) do one(t) end
  else
    one(out)
  end
end

local function forward_pre(unit)
  if unit.bound then   -- the last forward raised before its forward hook ran
    unbind(unit)
    if unit.temp then release(unit.temp) unit.temp = nil end
  end
  if setup.check_sites(unit) and unit.live then   -- new tensors (to_empty): nothing gathered counts
    for _, h in ipairs(unit.live.handles) do h.remove() end
    unit.live = nil
  end
  if not loom.is_grad_enabled() then   -- evaluation: temporaries, freed after
    unit.temp = take_gather(unit)
    bind(unit, unit.temp)
    return
  end
  local root = setup.root_of(unit)
  if root == unit then   -- a new forward pass: the order of the last one guides prefetching
    root.pass = (root.pass or 0) + 1
    root.prev_order, root.order = root.order or {}, {}
    G.pre = {}
  end
  unshard(unit)
  bind(unit, unit.live.u)
  if unit.seen_pass ~= root.pass or unit.seen_root ~= root then   -- its first call in this pass
    unit.seen_pass, unit.seen_root = root.pass, root
    root.order[#root.order + 1] = unit
    unit.pos = #root.order
    local prev = root.prev_order
    if prev[unit.pos] == unit then prefetch(prev[unit.pos + 1]) end
  end
end

local function forward_post(unit, out)
  unbind(unit)
  if unit.temp then
    release(unit.temp)
    unit.temp = nil
    return
  end
  -- without sync (pipeline microbatches) the data stays: a backward's end
  -- forgets the pre-backward hooks of graphs still to come, which would re-gather it
  if unit.reshard and unit.parent and #unit.entries > 0 and G.sync then
    release(unit.live.u)
    unit.live.released = true
  end
  hook_outputs(unit, out)
end

---------------------------------------------------------------------------
-- fully_shard

-- fully_shard(module, {mesh = mesh["dp"], reshard_after_forward = true,
-- overlap = true}): module's parameters not already managed by a
-- fully_shard on a submodule become one unit. overlap = false waits for
-- every collective where it starts and prefetches nothing (for
-- measurements). Returns module.
function M.fully_shard(module, opts)
  local unit = setup.new_unit(module, opts)
  module:register_forward_pre_hook(function() forward_pre(unit) end)
  module:register_forward_hook(function(_, _, out) forward_post(unit, out) end)
  return module
end

-- set_requires_gradient_sync(false): the forwards and backwards that
-- follow (of every unit) keep the gathered parameters (no reshard after
-- forward) and their gradients in them, accumulating, and reduce-scatter
-- nothing; the first backward after set_requires_gradient_sync(true)
-- reduces what all of them accumulated. Pipeline schedules use it so that
-- several microbatches' forwards can precede their backwards (PyTorch has
-- it per module; here it holds for all units).
function M.set_requires_gradient_sync(flag) G.sync = flag and true or false end

-- the unit fully_shard made of module (nil if none), for inspection:
-- unit.entries[i] = {fqn, sharded, placements, mesh, ...}
function M.state(module) return setup.unit_of(module) end

-- bytes of this rank's parameters and optimizer state (local shards); the
-- full model's parameters when full_numel is given
function M.memory(model, opt)
  local params, state = 0, 0
  local function local_bytes(t)
    local l = t.dist ~= nil and t:to_local() or t
    return l:numel() * C.lm_dtype_size(l.dtype_)
  end
  for _, p in ipairs(model:parameters()) do params = params + local_bytes(p) end
  for _, s in pairs(opt and opt.state or {}) do
    for _, v in pairs(s) do if T.is_tensor(v) then state = state + local_bytes(v) end end
  end
  return { params = params, optimizer = state, total = params + state }
end

return M
