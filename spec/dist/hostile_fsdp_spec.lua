-- hostile_fsdp_spec.lua: FSDP misuse on real ranks (issue 26): two forwards
-- then two backwards raises its reason on every rank (it gave wrong
-- gradients in silence); two forwards with the losses added and one
-- backward give the unsharded model's gradients (tolerance 1e-5); a unit
-- of mixed dtypes is refused; an optimizer built before fully_shard names
-- it at step().
local loom, dist = require("loom"), require("loom.distributed")
local fsdp = require("loom.distributed.fsdp")
local nn = loom.nn

local mesh = dist.init_device_mesh("cpu", { dist.world_size() })
local MLP = nn.Module:extend("HostileDistMLP")
function MLP:__init() self.net1 = nn.Linear(4, 6) self.net2 = nn.Linear(6, 4) end
function MLP:forward(x) return self.net2(self.net1(x)) end

local function pair()
  loom.manual_seed(5)
  local ref = MLP()
  loom.manual_seed(5)
  local m = MLP()
  fsdp.fully_shard(m.net1, { mesh = mesh })
  fsdp.fully_shard(m.net2, { mesh = mesh })
  fsdp.fully_shard(m, { mesh = mesh })
  return ref, m
end

describe("fully_shard misuse on " .. dist.world_size() .. " ranks", function()
  it("two forwards then two backwards raises its reason on every rank", function()
    local _, m = pair()
    loom.manual_seed(9)
    local x = loom.randn(2, 4)
    local a, b = m(x):sum(), (m(x) * 2):sum()
    a:backward()
    local ok, err = pcall(b.backward, b)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("two forwards, then two backwards", 1, true), tostring(err))
  end)

  it("two forwards, the losses added, one backward: the unsharded gradients (tolerance 1e-5)", function()
    local ref, m = pair()
    loom.manual_seed(9)
    local x = loom.randn(2, 4)   -- the same batch on every rank: dp's average equals one process
    local l = m(x):sum() + (m(x) * 2):sum()
    l:backward()
    local r = ref(x):sum() + (ref(x) * 2):sum()
    r:backward()
    for _, name in ipairs { "net1", "net2" } do
      local err = (m[name].weight.grad:full_tensor() - ref[name].weight.grad):abs():max():item()
      assert.is_true(err < 1e-5, name .. ": max gradient error " .. err)
    end
  end)

  it("a unit mixing bf16 and f32 parameters is refused, naming both", function()
    local m = MLP()
    m.net2:to("bf16")
    local ok, err = pcall(fsdp.fully_shard, m, { mesh = mesh })
    assert.is_false(ok)
    for _, s in ipairs { "share a dtype", "net1.weight is f32", "net2.weight is bf16" } do
      assert.truthy(tostring(err):find(s, 1, true), tostring(err))
    end
  end)

  it("an optimizer built before fully_shard names it at step()", function()
    local m = MLP()
    local opt = loom.optim.AdamW(m:parameters())
    fsdp.fully_shard(m, { mesh = mesh })
    m(loom.ones(2, 4)):sum():backward()
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("replaced by fully_shard", 1, true), tostring(err))
  end)
end)
