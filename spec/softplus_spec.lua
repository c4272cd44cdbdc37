-- softplus_spec.lua: softplus (F.softplus, nn.Softplus), the op added to
-- show what an op with new math costs: one line of core/unary.h (its f and
-- f'), one of core/op_list.h, its Lua faces and this spec. The reference is
-- PyTorch's definition, log(1 + exp(beta x)) / beta and x where beta x >
-- threshold, computed here in Lua's f64. Its DTensor cases (a shard, a
-- Partial) run on real ranks in spec/dist/dtensor_ops_spec.lua.
local loom = require("loom")
local R = require("support.ref")
local A = require("support.activations")
local F, nn = loom.F, loom.nn

local function softplus(x, beta, threshold)
  beta, threshold = beta or 1, threshold or 20
  if beta * x > threshold then return x end
  return math.log(1 + math.exp(beta * x)) / beta
end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

local X = { -30, -3, -0.5, 0, 0.25, 2, 19.5, 20.5, 40 }

describe("softplus", function()
  for _, dt in ipairs { "f64", "f32" } do
    it("has PyTorch's values and gradient in " .. dt .. " (f64: 1e-15, f32: 1e-6)", function()
      local x = loom.tensor(X, { dtype = dt, requires_grad = true })
      local y = F.softplus(x)
      y:sum():backward()
      local want, dwant = {}, {}
      for i, v in ipairs(X) do want[i], dwant[i] = softplus(v), v > 20 and 1 or sigmoid(v) end
      local tol = dt == "f64" and 1e-15 or 1e-6
      R.assert_close(y:to("f64"):totable(), want, tol, tol)
      R.assert_close(x.grad:to("f64"):totable(), dwant, tol, tol)
    end)
  end

  it("takes beta and threshold, positionally or as options", function()
    local x = loom.tensor({ -1, 0.5, 3, 6 }, { dtype = "f64" })
    local want = {}
    for i, v in ipairs { -1, 0.5, 3, 6 } do want[i] = softplus(v, 2, 5) end
    R.assert_close(F.softplus(x, 2, 5):totable(), want, 1e-15, 1e-15)
    R.assert_close(F.softplus(x, { beta = 2, threshold = 5 }):totable(), want, 1e-15, 1e-15)
  end)

  it("has the finite-difference gradient (f64, < 1e-6)", function()
    local x = loom.tensor(R.rand_away({ 3, 4 }, -4, 4, 0.05), { dtype = "f64", requires_grad = true })
    assert.is_true(R.gradcheck(function(a) return F.softplus(a, 1.5, 4) * a end, { x }) < 1e-6)
  end)

  it("names a bad argument", function()
    local x = loom.tensor({ 1, 2 })
    assert.matches("softplus: beta expected a positive number, got 0", R.errmsg(F.softplus, x, 0))
    assert.matches("softplus: threshold expected a number", R.errmsg(F.softplus, x, 1, "a"))
    assert.matches("softplus: input expected a tensor", R.errmsg(F.softplus, 3))
  end)

  it("is one entry of the op table, differentiable and sharded, with the CPU's unary kernel", function()
    R.assert_full_op("softplus")
  end)
end)

describe("nn.Softplus", function()
  it("trains like the composed form: forward, gradient and an SGD step (f64, 1e-12)", function()
    local act = nn.Softplus(2, 3)
    A.assert_trains_like(act, function(z)
      z = z * 2 -- composed: log(1 + exp(2z)) / 2, z itself where 2z > 3
      local big = z:gt(3):to("f64")
      return ((z:exp() + 1):log() / 2) * (1 - big) + (z / 2) * big
    end, 3)
    assert.matches("Softplus%(beta=2, threshold=3%)", tostring(act))
  end)
end)
