-- amp_kept_copy_spec.lua: AdamW writes each weight's bf16 (f16) copy in
-- its own pass over memory, and autocast's next cast of the weight takes it
-- instead of casting again (issue 36). The copy must be invisible: it holds
-- a cast's bits (checked bit for bit against fresh casts), and any change
-- to the weight since the step (an in-place op, copy_, a write through a
-- raw pointer) makes the next cast a fresh one. C.lm_low_copy_hits counts
-- the casts that took a copy, so each test also shows the copy was used
-- (or not).
local loom = require("loom")
local ffi = require("ffi")
local F = loom.F
local C = loom.C

local function hits() return tonumber(C.lm_low_copy_hits()) end
local function bits(t) return t:to("f32"):totable() end

-- one AdamW step of F.linear(x, w) under autocast in dtype
local function step(w, opt, x, dtype)
  opt:zero_grad()
  local y = loom.autocast(dtype, function() return F.linear(x, w) end)
  y:to("f32"):sum():backward()
  opt:step()
  return y
end

-- after one step on device, the next forward's cast takes the copy, and
-- its result has the bits of the same product on fresh casts
local function takes_copy(device, dtype)
  local w = loom.randn({ 8, 16 }):to(device):requires_grad_()
  local x = loom.randn({ 4, 16 }):to(device)
  local opt = loom.optim.AdamW({ w }, { lr = 1e-2 })
  step(w, opt, x, dtype)
  local before = hits()
  local y = loom.autocast(dtype, function() return F.linear(x, w) end)
  assert.are.equal(before + 1, hits())
  local want = x:to(dtype):matmul(w:detach():to(dtype):t())
  assert.are.same(bits(want:to("cpu")), bits(y:to("cpu")))
end

describe("the copy AdamW keeps of a weight", function()
  before_each(function() loom.manual_seed(11) end)

  for _, dtype in ipairs({ "bf16", "f16" }) do
    it("is what autocast's next " .. dtype .. " cast takes, with a fresh cast's bits", function()
      takes_copy("cpu", dtype)
    end)
  end

  it("leaves training bit for bit as with fresh casts", function()
    local tr = loom.models.transformer
    local function run(expose)
      loom.manual_seed(3)
      local m = tr.new { vocab_size = 32, dim = 32, n_layers = 2, n_heads = 4, max_seq_len = 16 }
      local opt = loom.optim.AdamW(m:parameters(), { lr = 3e-3 })
      local x = loom.randint(1, 33, { 4, 16 })
      local losses, before = {}, hits()
      for s = 1, 5 do
        -- a raw pointer handed out counts as a change: every cast is fresh
        if expose then for _, p in ipairs(m:parameters()) do p:data_ptr() end end
        opt:zero_grad()
        local loss = loom.autocast("bf16", function() return F.cross_entropy(m(x), x) end)
        loss:backward()
        opt:step()
        losses[s] = loss:item()
      end
      return losses, hits() - before
    end
    local kept, took = run(false)
    local fresh, none = run(true)
    assert.are.same(fresh, kept)
    assert.are.equal(0, none)
    assert.is_true(took >= 4 * 14, "casts that took a copy: " .. took)   -- 14 Linear weights, steps 2-5
  end)

  it("is not taken once the weight changed: in place, by copy_, through a raw pointer", function()
    local w = loom.randn({ 8, 16 }):requires_grad_()
    local x = loom.randn({ 4, 16 })
    local opt = loom.optim.AdamW({ w }, { lr = 1e-2 })
    local changes = {
      function() loom.no_grad(function() w:mul_(2) end) end,
      function() loom.no_grad(function() w:copy_(loom.randn({ 8, 16 })) end) end,
      function() ffi.cast("float *", w:data_ptr())[5] = 7.5 end,
    }
    for _, change in ipairs(changes) do
      step(w, opt, x, "bf16")
      change()
      local before = hits()
      local y = loom.autocast("bf16", function() return F.linear(x, w) end)
      assert.are.equal(before, hits())
      assert.are.same(bits(x:to("bf16"):matmul(w:detach():to("bf16"):t())), bits(y))
    end
  end)

  it("is not taken by a cast Lua asked for, which is its own tensor", function()
    local w = loom.randn({ 8, 16 }):requires_grad_()
    local x = loom.randn({ 4, 16 })
    local opt = loom.optim.AdamW({ w }, { lr = 1e-2 })
    step(w, opt, x, "bf16")
    local before = hits()
    local mine = w:to("bf16")
    local kept = bits(mine)
    step(w, opt, x, "bf16")
    assert.are.equal(before + 1, hits())   -- the step's forward took the copy; w:to did not
    assert.are.same(kept, bits(mine))      -- the step did not change what Lua holds
  end)

  it("makes a graph made before the step refuse its backward, as f32 does", function()
    for _, dtype in ipairs({ "f32", "bf16" }) do
      local w = loom.randn({ 8, 16 }):requires_grad_()
      local x = loom.randn({ 4, 16 })
      local opt = loom.optim.AdamW({ w }, { lr = 1e-2 })
      local function fwd()
        if dtype == "f32" then return F.linear(x, w) end
        return loom.autocast(dtype, function() return F.linear(x, w) end)
      end
      if dtype == "f32" then
        opt:zero_grad() fwd():sum():backward() opt:step()
      else
        step(w, opt, x, dtype)
      end
      local y = fwd()
      opt:step()
      local ok, err = pcall(function() y:to("f32"):sum():backward() end)
      assert.is_false(ok, dtype)
      assert.matches("modified in place", tostring(err), 1, true)
    end
  end)
end)

-- the same on a GPU: the CUDA AdamW kernel writes the copy (skips, saying
-- why, without one; the emulated device runs it in CI)
local G = require("support.cuda")
if G.skip(describe, it, "the copy AdamW keeps, on cuda") then return end
describe("the copy AdamW keeps, on cuda", function()
  before_each(function() loom.manual_seed(12) end)
  for _, dtype in ipairs({ "bf16", "f16" }) do
    it("is what autocast's next " .. dtype .. " cast takes, with a fresh cast's bits", function()
      takes_copy("cuda", dtype)
    end)
  end
end)
