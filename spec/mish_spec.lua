-- mish_spec.lua: mish (F.mish, nn.Mish), x tanh(softplus(x)), the op added
-- to count what an op with new math costs: one line of core/unary.h (its f
-- and f'), one of core/op_list.h, F.mish, nn.Mish and this spec. The CUDA
-- parity and the DTensor cases come from support/activations.lua (it is an
-- activation of loom.F). The references: values PyTorch 2.15 printed for
-- F.mish and its gradient, and the definition in Lua's f64.
local loom = require("loom")
local R = require("support.ref")
local A = require("support.activations")
local F, nn = loom.F, loom.nn

local X = { -30, -3, -0.5, 0, 0.25, 2, 19.5, 20.5, 40 }
-- torch.nn.functional.mish(x) and its gradient in f64, PyTorch 2.15
local TORCH_Y = { -2.8072868906519209e-12, -0.14564746127562461, -0.22074377465173001, 0, 0.16957240966381759,
                  1.9439589595339946, 19.5, 20.5, 40 }
local TORCH_DY = { -2.7137106609633922e-12, -0.093393114532320839, 0.28951067791351226, 0.59999999999999998,
                   0.75417266772059277, 1.0693179342794896, 1, 1, 1 }

-- log(1 + e) without losing e when it is small (Goldberg's trick)
local function log1p(e) local u = 1 + e if u == 1 then return e end return math.log(u) * e / (u - 1) end
local function mish(x) return x * math.tanh(log1p(math.exp(x))) end
local function mish_d(x)
  local t = math.tanh(log1p(math.exp(x)))
  return t + x * (1 - t * t) / (1 + math.exp(-x))
end

describe("mish", function()
  it("has PyTorch's values and gradient in f64 (1e-14)", function()
    local x = loom.tensor(X, { dtype = "f64", requires_grad = true })
    local y = F.mish(x)
    y:sum():backward()
    R.assert_close(y:totable(), TORCH_Y, 1e-14, 1e-300)
    R.assert_close(x.grad:totable(), TORCH_DY, 1e-14, 1e-300)
  end)

  it("has the definition's values and gradient in f32 (1e-6), overflowing exp included", function()
    local xs = { -90, -30, -3, -0.5, 0, 0.25, 2, 20.5, 90 }
    local x = loom.tensor(xs, { requires_grad = true })
    local y = F.mish(x)
    y:sum():backward()
    local want, dwant = {}, {}
    for i, v in ipairs(xs) do want[i], dwant[i] = mish(v), mish_d(v) end
    R.assert_close(y:to("f64"):totable(), want, 1e-6, 1e-30)
    R.assert_close(x.grad:to("f64"):totable(), dwant, 1e-6, 1e-30)
  end)

  it("has the finite-difference gradient (f64, < 1e-6)", function()
    local x = loom.tensor(R.rand_away({ 3, 4 }, -4, 4, 0.05), { dtype = "f64", requires_grad = true })
    assert.is_true(R.gradcheck(function(a) return F.mish(a) * a end, { x }) < 1e-6)
  end)

  it("names a bad argument", function()
    assert.matches("mish: input expected a tensor, got", R.errmsg(F.mish, 3))
  end)

  it("is one entry of the op table, differentiable and sharded, with the CPU's unary kernel", function()
    R.assert_full_op("mish")
    assert.truthy(A.ops().mish, "mish is an activation the parity and DTensor specs check")
  end)
end)

describe("nn.Mish", function()
  it("trains like the composed form: forward, gradient and an SGD step (f64, 1e-12)", function()
    A.assert_trains_like(nn.Mish(), function(z) return z * F.softplus(z):tanh() end, 3)
    assert.equals("Mish()", tostring(nn.Mish()))
  end)
end)
