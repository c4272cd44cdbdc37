-- replicate.lua: data parallelism (DDP) composed with tensor parallelism,
-- beside FSDP's fully_shard (loom.distributed.fsdp), as PyTorch's
-- composable replicate: dist.replicate(model, mesh["dp"]); loom.parallel.replicate
-- is the same function under its older name. replicate()
-- broadcasts the parameters over the data-parallel mesh once, then averages
-- gradients over it with bucketed all-reduces launched from the grad-ready
-- hooks while backward goes on; the last waits run when backward ends.
local loom = require("loom")
local T = require("loom.tensor")
local dist = require("loom.distributed")
local hooks = require("loom.autograd_hooks")

local M = {}

local function shard(t) return t.dist ~= nil and t:to_local() or t end

-- Everything below is a function of the module, not a closure over the
-- model: a compiled trace would keep that closure, and the model with it
-- (docs/architecture.md). The replicate state (the model's _dp) is found
-- from the model or, for a parameter, in dp_of, which holds parameters
-- weakly.

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

local dp_of = setmetatable({}, { __mode = "k" })   -- parameter -> its model's replicate state

-- the bucket's gradients, flattened, averaged over dp (async)
local function launch(st)
  if #st.bucket == 0 then return end
  local grads = {}
  for i, p in ipairs(st.bucket) do grads[i] = shard(p.grad):reshape(-1) end
  local flat = #grads == 1 and grads[1] or loom.cat(grads, 1)
  table.insert(st.inflight, { params = st.bucket, work = dist.all_reduce(flat, "avg", st.mesh, 1, { async_op = true }) })
  st.bucket, st.bytes = {}, 0
end

-- when backward ends: the last bucket, then every average into its .grad
local function finish(st)
  launch(st)
  loom.no_grad(copy_back, st.inflight)
  st.inflight, st.queued = {}, false
end

-- a parameter's gradient is complete: into the bucket, launched when full
local function ready(leaf)
  local st = dp_of[leaf]
  if not st.queued then hooks.queue_callback(finish, st) st.queued = true end
  table.insert(st.bucket, leaf)
  st.bytes = st.bytes + shard(leaf.grad):numel() * 4
  if st.bytes >= st.cap then launch(st) end
end

-- Parameters seen so far. parallelize_module replaces parameters with
-- DTensors, before or after replicate: a forward pre-hook takes on the new
-- ones (broadcast from dp rank 0, then hooked), so the two calls compose in
-- either order.
local function adopt(model)
  local st = rawget(model, "_dp")
  local fresh = {}
  for _, p in ipairs(model:parameters()) do
    if not st.seen[p] and not st.ignored[p] then fresh[#fresh + 1] = p st.seen[p] = true end
  end
  if #fresh == 0 then return end
  -- the same starting point on every data-parallel rank
  loom.no_grad(broadcast_all, fresh, st.mesh)
  for _, p in ipairs(fresh) do
    if p.requires_grad then
      dp_of[p] = st
      st.handles[#st.handles + 1] = p:register_grad_ready_hook(ready)
    end
  end
end

-- replicate(model, dp_mesh, {bucket_cap_mb=25, ignored_params}): call it
-- before or after parallelize_module on the tp mesh; dp_mesh is 1-D
-- (mesh["dp"]). ignored_params (a list) are left alone: no broadcast, no
-- averaging (an expert-parallel expert's, which its own rank holds).
function M.replicate(model, mesh, opts)
  local Module = require("loom.nn.module")
  if not Module.is_module(model) then T.argerror("replicate", "module", "an nn.Module", T.describe(model)) end
  if not dist.is_mesh(mesh) or mesh.ndim ~= 1 then
    T.argerror("replicate", "device_mesh", "a 1-D DeviceMesh (e.g. mesh[\"dp\"])", T.describe(mesh))
  end
  opts = opts or {}
  local ignored = setmetatable({}, { __mode = "k" })   -- (PyTorch's ignored params: left alone, as an expert-parallel one)
  for _, p in ipairs(opts.ignored_params or {}) do ignored[p] = true end
  local st = { mesh = mesh, cap = (opts.bucket_cap_mb or 25) * 2^20, bucket = {}, bytes = 0, inflight = {},
               queued = false, handles = {}, seen = setmetatable({}, { __mode = "k" }), ignored = ignored }
  rawset(model, "_dp", st)
  adopt(model)
  st.handles[#st.handles + 1] = model:register_forward_pre_hook(adopt)
  return model
end

return M
