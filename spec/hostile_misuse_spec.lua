-- hostile_misuse_spec.lua: misuse that was silent (issue 26) now raises,
-- naming the fix: parameters replaced after the optimizer was built
-- (Module:to, to_empty), GradScaler options PyTorch refuses, Module:to with
-- a non-float dtype, a NaN path key in a checkpoint manifest (in a child:
-- a checkpoint starts MPI, which must not run in this process before
-- other specs' loomrun children), loom.zeros(nil). The FSDP cases run on
-- real ranks: spec/dist/hostile_fsdp_spec.lua.
local loom = require("loom")
local nn = loom.nn
local sys = require("support.sys")
local X = require("support.misuse")

local errmsg, has = X.error_of, X.has

local MLP = nn.Module:extend("HostileMLP")
function MLP:__init() self.net1 = nn.Linear(4, 6) self.net2 = nn.Linear(6, 4) end
function MLP:forward(x) return self.net2(self.net1(x)) end

local function one_step(m, opt, x)
  m(x):sum():backward()
  opt:step()
end

describe("an optimizer whose parameters were replaced", function()
  it("Module:to after the optimizer: step() names Module:to and the fix", function()
    local m = MLP()
    local opt = loom.optim.AdamW(m:parameters())
    m:to("f64")
    m(loom.ones(2, 4, { dtype = "f64" })):sum():backward()
    has(errmsg(opt.step, opt), "AdamW.step", "params[1] was replaced by Module:to", "build the optimizer after Module:to")
  end)

  it("to_empty after the optimizer (a model built on meta): step() names to_empty", function()
    local m = loom.device("meta"):use(MLP)
    local opt = loom.optim.SGD(m:parameters(), { lr = 0.1 })
    m:to_empty("cpu")
    m:init_weights()
    m(loom.ones(2, 4)):sum():backward()
    has(errmsg(opt.step, opt), "SGD.step", "replaced by to_empty")
  end)

  it("an optimizer built after the move steps as before", function()
    local m = MLP():to("f64")
    local opt = loom.optim.SGD(m:parameters(), { lr = 0.1 })
    one_step(m, opt, loom.ones(2, 4, { dtype = "f64" }))
  end)
end)

describe("GradScaler options as PyTorch checks them", function()
  local cases = {
    { { growth_factor = 0.5 }, "growth_factor", "> 1" },
    { { growth_factor = 1 }, "growth_factor", "> 1" },
    { { init_scale = math.huge }, "init_scale", "finite" },
    { { init_scale = 0 / 0 }, "init_scale", "finite" },
    { { growth_interval = 1.5 }, "growth_interval", "an integer >= 1" },
    { { backoff_factor = 1 }, "backoff_factor", "(0, 1)" },
    { { grow = 2 }, "unknown option grow" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. sys.shq(tostring(next(c[1]))) .. " = " .. tostring(select(2, next(c[1]))), function()
      has(errmsg(loom.amp.GradScaler, c[1]), "GradScaler", unpack(c, 2))
    end)
  end
  it("load_state_dict refuses {} and a bad scale, and takes its own state_dict", function()
    local s = loom.amp.GradScaler()
    has(errmsg(s.load_state_dict, s, {}), "load_state_dict", "state dict is empty")
    has(errmsg(s.load_state_dict, s, { scale = -1, good = 0 }), "state_dict.scale")
    local t = loom.amp.GradScaler { init_scale = 8 }
    s:load_state_dict(t:state_dict())
    assert.equal(8, s:get_scale())
  end)
end)

describe("misleading messages made plain", function()
  it("Module:to('i64') says it is a non-float dtype, not a bad device", function()
    has(errmsg(MLP().to, MLP(), "i64"), "Module:to", "floating point dtype", "i64, a non-float dtype")
  end)

  it("loom.zeros(nil) raises, as torch.zeros(None) does", function()
    has(errmsg(loom.zeros, nil), "zeros", "size", "got nil")
    has(errmsg(loom.ones, nil, 2), "ones", "size[1]", "got nil")
    assert.same({ 2 }, loom.ones(2, nil):size())   -- (a trailing nil is absent options)
    assert.equal(0, loom.zeros():dim())   -- (no argument at all is still a scalar)
  end)

  it("a NaN path key in a checkpoint manifest is refused by name (in a child: checkpoints start MPI)", function()
    local d = sys.tmpdir() .. "/ck"
    X.check_child(string.format([[
      local ckpt = require('loom.distributed.checkpoint')
      ckpt.save({ w = loom.ones(2) }, %q)
      local m = loom.load(%q)
      m.tensors[1].path = { 0 / 0 }
      loom.save(m, %q)
      ckpt.load({ w = loom.zeros(2) }, %q)]], d, d .. "/manifest.loom", d .. "/manifest.loom", d),
      { "manifest.loom is corrupt", "tensors[1].path", "NaN" }, 1)
  end)
end)
