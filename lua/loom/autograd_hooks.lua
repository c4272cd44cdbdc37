-- autograd_hooks.lua: p:register_grad_ready_hook(fn), called once per
-- backward when the gradient of the leaf p is complete (data parallelism
-- starts p's all-reduce from it while backward goes on).
--
-- One C callback (lm_set_grad_ready_callback) serves every hook: it looks
-- the leaf's address up in a Lua table. The callback is installed only while
-- some hook is registered, so backward without hooks never calls into Lua.
-- A hook lives as long as its tensor, as in PyTorch: the table holds the
-- tensor weakly (a model dropped with its data-parallel hooks is freed).
-- The collector clears that weak reference before the tensor's finalizer
-- frees it, so an entry whose tensor is gone is never taken for another
-- tensor at the same address: such entries are dropped when met and after
-- each backward. An error raised by a hook is kept and re-raised by
-- backward() once the C pass is over (errors must not unwind through C
-- frames).
local ffi = require("ffi")
local jit = require("jit")
local T = require("loom.tensor")
local C = require("loom.lib").C

local Tensor = T.Tensor

-- The state lives in the Lua registry, so that a second load of this file
-- (busted reloads modules between spec files, while the tensor metatype,
-- and so the methods tensors see, stays the first load's) shares it.
local REG = debug.getregistry()
local S = REG["loom.autograd_hooks"]
if not S then
  S = { hooks = {},         -- address -> { ref = weak {p}, fns = { {fn = f}, ... } }
        count = 0,          -- registered hooks, all tensors together
        callback = nil,     -- the one ffi callback, created on first use
        pending_error = nil,
        queued = {} }       -- callbacks to run once the current backward ends
  REG["loom.autograd_hooks"] = S
end
local hooks = S.hooks

local address = T.address

local function install(on)
  if on then
    S.callback = S.callback or ffi.cast("lm_grad_ready_fn", S.dispatch)
    C.lm_set_grad_ready_callback(S.callback)
  else
    C.lm_set_grad_ready_callback(nil)
  end
end

local WEAK = { __mode = "v" }

-- forgets key's entry (its tensor is gone, or its last hook was removed)
local function drop(key, entry)
  if hooks[key] ~= entry then return end
  hooks[key] = nil
  S.count = S.count - #entry.fns
  if S.count == 0 then install(false) end
end

local function dispatch(leaf)
  local key = address(leaf)
  local entry = hooks[key]
  if not entry then return end
  local p = entry.ref[1]
  if p == nil then drop(key, entry) return end
  local fns = { unpack(entry.fns) }   -- a hook may remove hooks
  for _, h in ipairs(fns) do
    if not h.removed then
      local ok, err = pcall(h.fn, p)
      if not ok and S.pending_error == nil then S.pending_error = err end
    end
  end
end
S.dispatch = S.dispatch or dispatch   -- (the ffi callback of a first load calls the first load's)

-- p:register_grad_ready_hook(fn) -> handle with :remove(); fn(p) runs
-- after p.grad holds this backward's complete gradient.
function Tensor.register_grad_ready_hook(p, fn)
  T.check_tensor(p, "register_grad_ready_hook", "self")
  if type(fn) ~= "function" then
    T.argerror("register_grad_ready_hook", "fn", "a function", T.describe(fn))
  end
  if not p.requires_grad or not p.is_leaf then
    T.argerror("register_grad_ready_hook", "self", "a leaf tensor that requires grad",
               p.requires_grad and "a non-leaf tensor" or "a tensor that does not require grad")
  end
  local key = address(p)
  local entry = hooks[key]
  if entry and entry.ref[1] == nil then drop(key, entry) entry = nil end   -- a dead tensor's, at this address
  if not entry then
    entry = { ref = setmetatable({ p }, WEAK), fns = {} }
    hooks[key] = entry
  end
  local h = { fn = fn }
  entry.fns[#entry.fns + 1] = h
  S.count = S.count + 1
  if S.count == 1 then install(true) end
  return { remove = function()
    if h.removed then return end
    h.removed = true
    if hooks[key] ~= entry then return end   -- dropped with its tensor
    for i, x in ipairs(entry.fns) do if x == h then table.remove(entry.fns, i) break end end
    S.count = S.count - 1
    if #entry.fns == 0 then hooks[key] = nil end
    if S.count == 0 then install(false) end
  end }
end

-- the entries whose tensors are gone
local function sweep()
  for key, entry in pairs(hooks) do
    if entry.ref[1] == nil then drop(key, entry) end
  end
end

-- Pre-backward hooks: t:register_pre_backward_hook(fn) on an op's output;
-- fn(t) runs when backward reaches the op that made t, just before that
-- op's backward (FSDP re-gathers a layer's parameters there). Keyed by the
-- node and the output's number, as the C callback reports them.
S.pre = S.pre or {}          -- "node address:k" -> { tensor = t, fn = fn }
S.npre = S.npre or 0
local function pre_key(node, k) return address(node) .. ":" .. tonumber(k) end
local function pre_dispatch(node, k)
  local e = S.pre[pre_key(node, k)]
  if not e then return end
  e.fired = true
  local ok, err = pcall(e.fn, e.tensor)
  if not ok and S.pending_error == nil then S.pending_error = err end
end

function Tensor.register_pre_backward_hook(t, fn)
  T.check_tensor(t, "register_pre_backward_hook", "self")
  if type(fn) ~= "function" then T.argerror("register_pre_backward_hook", "fn", "a function", T.describe(fn)) end
  if C.lm_set_pre_backward(t, 1) < 0 then T.c_error(2) end
  local key = pre_key(t.grad_fn_, t.output_nr)
  if not S.pre[key] then S.npre = S.npre + 1 end
  S.pre[key] = { tensor = t, fn = fn }
  S.pre_callback = S.pre_callback or ffi.cast("lm_pre_backward_fn", pre_dispatch)
  C.lm_set_pre_backward_callback(S.pre_callback)
  return { remove = function()
    if S.pre[key] then S.pre[key] = nil S.npre = S.npre - 1 end
    if S.npre == 0 then C.lm_set_pre_backward_callback(nil) end
  end }
end

-- backward runs the C pass from the interpreter (a C->Lua callback from a
-- JIT-compiled FFI call is not allowed), then re-raises a hook's error.
local backward = Tensor.backward
jit.off(backward)
function Tensor.backward(x, grad)
  S.pending_error = nil
  backward(x, grad)
  local queued = S.queued
  S.queued = {}
  -- pre-backward hooks of this graph are done: forget them (their nodes go
  -- with the graph). Those that did not fire may belong to another graph
  -- (two forwards, then two backwards): kept through one more backward.
  if S.npre > 0 then
    for key, e in pairs(S.pre) do
      if e.fired or e.aged then S.pre[key] = nil S.npre = S.npre - 1 else e.aged = true end
    end
    if S.npre == 0 then C.lm_set_pre_backward_callback(nil) end
  end
  for _, q in ipairs(queued) do   -- e.g. data parallelism waits for its reductions
    local ok, err = pcall(q[1], q[2])
    if not ok and S.pending_error == nil then S.pending_error = err end
  end
  if S.count > 0 then sweep() end
  if S.pending_error ~= nil then
    local err = S.pending_error
    S.pending_error = nil
    error(err, 0)
  end
end
jit.off(Tensor.backward)

-- queue_callback(fn, arg): fn(arg) runs once when the backward in progress
-- ends (PyTorch's engine queue_callback); hooks use it to finish their work.
local function queue_callback(fn, arg)
  S.queued = S.queued or {}
  S.queued[#S.queued + 1] = { fn, arg }
end

return { count = function() return S.count end, queue_callback = queue_callback }
