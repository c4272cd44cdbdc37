-- data.lua: data parallelism composed with tensor parallelism. replicate()
-- broadcasts the parameters over the data-parallel mesh once, then averages
-- gradients over it with bucketed all-reduces launched from the grad-ready
-- hooks while backward goes on; the last waits run when backward ends.
local loom = require("loom")
local T = require("loom.tensor")
local dist = require("loom.distributed")
local hooks = require("loom.autograd_hooks")

local M = {}

local function shard(t) return t.dist ~= nil and t:to_local() or t end

-- (copy_back and broadcast_all are functions of the module, not closures
-- over the model's tensors, which a compiled trace would keep:
-- docs/architecture.md.)
-- each in-flight bucket's averaged gradients back into the parameters
local function copy_back(inflight)
  for _, b in ipairs(inflight) do
    local flat, at = b.work:wait(), 1
    for _, p in ipairs(b.params) do
      local g = shard(p.grad)
      local n = g:numel()
      g:copy_(flat:narrow(1, at, n):view(g:size()))
      at = at + n
    end
  end
end

-- every parameter (its local shard) as dp rank 0 holds it
local function broadcast_all(params, mesh)
  for _, p in ipairs(params) do
    local s = shard(p)
    s:copy_(dist.broadcast(s, 0, mesh, 1))
  end
end

-- replicate(model, dp_mesh, {bucket_cap_mb=25}): call it before or after
-- parallelize_module on the tp mesh; dp_mesh is 1-D (mesh["dp"]).
function M.replicate(model, mesh, opts)
  local Module = require("loom.nn.module")
  if not Module.is_module(model) then T.argerror("replicate", "module", "an nn.Module", T.describe(model)) end
  if not dist.is_mesh(mesh) or mesh.ndim ~= 1 then
    T.argerror("replicate", "device_mesh", "a 1-D DeviceMesh (e.g. mesh[\"dp\"])", T.describe(mesh))
  end
  opts = opts or {}
  local cap = (opts.bucket_cap_mb or 25) * 2^20
  local state = { bucket = {}, bytes = 0, inflight = {}, queued = false }

  local function launch()
    if #state.bucket == 0 then return end
    local grads = {}
    for i, p in ipairs(state.bucket) do grads[i] = shard(p.grad):reshape(-1) end
    local flat = #grads == 1 and grads[1] or loom.cat(grads, 1)
    table.insert(state.inflight, { params = state.bucket,
                                   work = dist.all_reduce(flat, "avg", mesh, 1, { async_op = true }) })
    state.bucket, state.bytes = {}, 0
  end

  local function finish()
    launch()
    loom.no_grad(copy_back, state.inflight)
    state.inflight, state.queued = {}, false
  end

  local function ready(leaf)
    if not state.queued then hooks.queue_callback(finish) state.queued = true end
    table.insert(state.bucket, leaf)
    local g = shard(leaf.grad)
    state.bytes = state.bytes + g:numel() * 4
    if state.bytes >= cap then launch() end
  end

  -- Parameters seen so far. parallelize_module replaces parameters with
  -- DTensors, before or after this call: a forward pre-hook takes on the
  -- new ones (broadcast from dp rank 0, then hooked), so the two calls
  -- compose in either order.
  local handles, seen = {}, setmetatable({}, { __mode = "k" })
  local function adopt()
    local fresh = {}
    for _, p in ipairs(model:parameters()) do
      if not seen[p] then fresh[#fresh + 1] = p seen[p] = true end
    end
    if #fresh == 0 then return end
    -- the same starting point on every data-parallel rank
    loom.no_grad(broadcast_all, fresh, mesh)
    for _, p in ipairs(fresh) do
      if p.requires_grad then handles[#handles + 1] = p:register_grad_ready_hook(ready) end
    end
  end
  adopt()
  handles[#handles + 1] = model:register_forward_pre_hook(function() adopt() end)
  rawset(model, "_dp", { mesh = mesh, handles = handles })
  return model
end

return M
