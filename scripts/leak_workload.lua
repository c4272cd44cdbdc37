-- leak_workload.lua: a small tour of the tensor core for scripts/leakcheck.sh
-- to run under valgrind: creation, views, pointwise ops with broadcasting and
-- numbers, reductions, matmul, nn ops, dtype casts, autograd (retain_grad,
-- accumulation, no_grad), autocast with AdamW's kept copy, errors (each failing call must free what it made),
-- early free() and GC. Checks that the live storage count returns to where
-- it started; valgrind checks the rest. Usage: luajit scripts/leak_workload.lua [rounds]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/leak_workload%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
local loom = require("loom")
local settled_storages = require("support.retention").settled_storages
local F = loom.F
local C = loom.C

local rounds = tonumber(arg and arg[1]) or 2
local start = tonumber(C.lm_storage_count())

local function round(r)
  loom.manual_seed(r)
  -- creation and views
  local x = loom.randn(4, 6, { requires_grad = true })
  local w = loom.randn(5, 6, { requires_grad = true })
  local b = loom.zeros(5, { requires_grad = true })
  local big = loom.rand(64, 64)          -- past the inline-buffer size
  local v = big:t():narrow(1, 3, 10):contiguous():view(-1)
  local _, _, _ = v:sum():item(), loom.arange(0, 10, 0.5):totable(), tostring(loom.ones(2, 3))
  local ids = loom.tensor({ { 1, 3 }, { 4, 2 } }, { dtype = "i64" })
  for _, dt in ipairs { "f64", "bf16", "f16", "i32", "i64", "bool" } do big:to(dt):to("f32"):free() end

  -- forward: pointwise (tensors, numbers, broadcasting), matmul, nn ops
  local h = F.linear(x, w:t():t(), b)
  h = (h * 2 + 1):relu() - h:sigmoid() / 3 + h:pow(2):mean(2, true)
  h = loom.where(h:gt(0), h, h * 0.1):gelu({ approximate = "tanh" })
  local ln = F.layer_norm(h, { 5 }, loom.ones(5, { requires_grad = true }), loom.zeros(5))
  local logits = ln:softmax(-1):log() + ln:log_softmax(2)
  local target = loom.tensor({ 1, 3, 5, 2 }, { dtype = "i64" })
  local loss = F.cross_entropy(logits, target, { label_smoothing = 0.1 })
  local emb = F.embedding(ids, loom.randn(5, 3, { requires_grad = true }))
  loss = loss + emb:sum() * 0 + loom.cat({ x, x }, 1):max()
  local mx, idx = h:max(2)
  local _ = idx:sum():item() + mx:sum():item()
  local q = loom.randn(1, 2, 3, 4, { requires_grad = true })
  loss = loss + F.scaled_dot_product_attention(q, q, q, { is_causal = true }):sum()

  -- backward twice into the same leaves (accumulation), with retain_grad
  h:retain_grad()
  loss:backward()
  local g1 = x.grad:clone()
  F.linear(x, w, b):sum():backward()
  assert(h.grad ~= nil and (x.grad - g1):abs():sum():item() > 0)
  x:zero_grad()
  loom.no_grad(function() return (x * w:sum()):sum() end)

  -- mixed precision: autocast's casts, f32 weight gradients, and the bf16
  -- copy AdamW keeps on w's storage (freed with it)
  local wm = loom.randn(5, 6, { requires_grad = true })
  local opt = loom.optim.AdamW({ wm }, { lr = 1e-3 })
  for _ = 1, 2 do
    opt:zero_grad()
    loom.autocast("bf16", function() return F.linear(x:detach(), wm) end):to("f32"):sum():backward()
    opt:step()
  end

  -- errors: each must leave nothing behind
  for _, bad in ipairs {
    function() return x:matmul(x) end,
    function() return x + loom.ones(3) end,
    function() return loom.cat({ x, loom.ones(2, 2) }, 1) end,
    function() return F.embedding(loom.tensor({ 9 }, { dtype = "i64" }), loom.ones(5, 3)) end,
    function() return x:view(5, 5) end,
    function() return big:t():view(-1) end,
    function() return loom.ones(2):sum(3) end,
    function() return (x * 1):requires_grad_(true) end,
  } do
    assert(not pcall(bad))
  end

  -- early frees and the GC
  for _ = 1, 50 do (x + 1):free() end
  big:free()
end

for r = 1, rounds do round(r) end
-- a compiled trace keeps the closures it specialised on, and what they
-- capture: this workload's own (the failing calls above capture x) would
-- stay alive by chance of what got compiled. Traces go first; that the
-- library's closures keep no tensor is spec/jit_retention_spec.lua's job.
jit.flush()
local now = settled_storages()   -- (a true leak stays)
io.write(string.format("leak_workload: %d rounds, live storages %d -> %d\n", rounds, start, now))
if now ~= start then
  io.stderr:write("leak_workload: storages left alive after a full GC\n")
  os.exit(1)
end
