-- nn_ops_norm_spec.lua: softmax, log_softmax, layer_norm and rms_norm, the
-- registry ops of core/ops_nn.c called by name with C conventions (0-based
-- dims), against plain-Lua references in f64 (support/nn_ops.lua) and their
-- gradients against central differences.
local loom, S = require("loom"), require("support.nn_ops")
local T, flat, rand_flat, close, same_shape = S.T, S.flat, S.rand_flat, S.close, S.same_shape
local gradcheck, errors_with = S.gradcheck, S.errors_with
local ref_softmax, ref_norm = S.softmax, S.norm

describe("softmax and log_softmax", function()
  for _, log in ipairs { false, true } do
    local name = log and "log_softmax" or "softmax"
    it(name .. " matches the reference along every dim (negative dims too)", function()
      local shape = { 2, 3, 4 }
      local xf = rand_flat(shape, 3)
      local x = T(xf, shape)
      for d = 1, 3 do
        for _, cd in ipairs { d - 1, d - 4 } do
          local y = loom.op(name, { x }, { cd })
          same_shape(y, shape)
          close(flat(y), ref_softmax(xf, shape, d, log), 1e-12, name .. " dim " .. d)
        end
      end
    end)

    it(name .. " is stable for large logits and works in f32 and bf16", function()
      local xf = { 1000, 1001, 1002, -1000 }
      close(flat(loom.op(name, { T(xf, { 4 }) }, { 0 })), ref_softmax(xf, { 4 }, 1, log), 1e-12, "f64")
      local shape = { 3, 5 }
      local yf = rand_flat(shape, 4)
      close(flat(loom.op(name, { T(yf, shape, "f32") }, { 1 })), ref_softmax(yf, shape, 2, log), 1e-5, "f32")
      local y = loom.op(name, { T(yf, shape, "bf16") }, { -1 })
      assert.are.equal("bf16", y.dtype)
      close(flat(y), ref_softmax(flat(T(yf, shape, "bf16")), shape, 2, log), 2e-2, "bf16")
    end)

    it(name .. " has the right gradient", function()
      local shape = { 2, 3, 4 }
      for _, d in ipairs { 0, 1, -1 } do
        gradcheck(function(t) return loom.op(name, { t[1] }, { d }) end, { T(rand_flat(shape), shape) }, { 1 })
      end
    end)
  end

  it("rejects integer tensors and bad dims", function()
    errors_with("expected a floating point tensor", function()
      loom.op("softmax", { loom.tensor({ 1, 2 }, { dtype = "i64" }) }, { 0 })
    end)
    errors_with("dim", function() loom.op("softmax", { T({ 1, 2 }, { 2 }) }, { 3 }) end)
  end)
end)

describe("layer_norm and rms_norm", function()
  local shape, eps = { 2, 3, 4 }, 1e-5

  it("layer_norm over the last dim and the last two dims, with and without weight and bias", function()
    local xf = rand_flat(shape, 2)
    local x = T(xf, shape)
    local w1, b1 = rand_flat({ 4 }), rand_flat({ 4 })
    local y = loom.op("layer_norm", { x, T(w1, { 4 }), T(b1, { 4 }) }, { 1, 1, 1 }, { eps })
    same_shape(y, shape)
    close(flat(y), ref_norm(xf, 6, 4, w1, b1, eps), 1e-12, "w, b")
    close(flat(loom.op("layer_norm", { x }, { 1, 0, 0 }, { eps })), ref_norm(xf, 6, 4, nil, nil, eps), 1e-12, "none")
    close(flat(loom.op("layer_norm", { x, T(b1, { 4 }) }, { 1, 0, 1 }, { eps })),
          ref_norm(xf, 6, 4, nil, b1, eps), 1e-12, "bias only")
    local w2 = rand_flat({ 3, 4 })
    close(flat(loom.op("layer_norm", { x, T(w2, { 3, 4 }) }, { 2, 1, 0 }, { 0.1 })),
          ref_norm(xf, 2, 12, w2, nil, 0.1), 1e-12, "two dims")
  end)

  it("rms_norm with and without weight; f32 and bf16 keep their dtype", function()
    local xf = rand_flat(shape, 2)
    local w = rand_flat({ 4 })
    close(flat(loom.op("rms_norm", { T(xf, shape), T(w, { 4 }) }, { 1, 1 }, { eps })),
          ref_norm(xf, 6, 4, w, nil, eps, true), 1e-12, "rms w")
    close(flat(loom.op("rms_norm", { T(xf, shape) }, { 1, 0 }, { eps })),
          ref_norm(xf, 6, 4, nil, nil, eps, true), 1e-12, "rms")
    local y = loom.op("rms_norm", { T(xf, shape, "f32"), T(w, { 4 }, "f32") }, { 1, 1 }, { eps })
    assert.are.equal("f32", y.dtype)
    close(flat(y), ref_norm(xf, 6, 4, w, nil, eps, true), 1e-5, "rms f32")
    local xb = T(xf, shape, "bf16")
    local yb = loom.op("layer_norm", { xb }, { 1 }, { eps })
    assert.are.equal("bf16", yb.dtype)
    close(flat(yb), ref_norm(flat(xb), 6, 4, nil, nil, eps), 2e-2, "layer bf16")
  end)

  it("has the right gradients for x, weight and bias", function()
    local mk = function() return T(rand_flat(shape, 2), shape) end
    gradcheck(function(t) return loom.op("layer_norm", t, { 1, 1, 1 }, { eps }) end,
              { mk(), T(rand_flat({ 4 }), { 4 }), T(rand_flat({ 4 }), { 4 }) }, { 1, 2, 3 })
    gradcheck(function(t) return loom.op("layer_norm", t, { 2, 1, 0 }, { eps }) end,
              { mk(), T(rand_flat({ 3, 4 }), { 3, 4 }) }, { 1, 2 })
    gradcheck(function(t) return loom.op("layer_norm", t, { 1, 0, 0 }, { eps }) end, { mk() }, { 1 })
    gradcheck(function(t) return loom.op("rms_norm", t, { 1, 1 }, { eps }) end,
              { mk(), T(rand_flat({ 4 }), { 4 }) }, { 1, 2 })
    gradcheck(function(t) return loom.op("rms_norm", t, { 2, 0 }, { eps }) end, { mk() }, { 1 })
  end)

  it("checks its arguments", function()
    local x = T(rand_flat(shape), shape)
    errors_with("argument #2 (weight) expected the shape of the input's last 1 dim",
                function() loom.op("layer_norm", { x, T({ 1, 2, 3 }, { 3 }) }, { 1, 1, 0 }, { eps }) end)
    errors_with("normalized shape expected 1 to 3 dims", function() loom.op("rms_norm", { x }, { 4, 0 }, { eps }) end)
    errors_with("attrs announce 2 tensor arguments", function() loom.op("layer_norm", { x }, { 1, 1, 0 }, { eps }) end)
  end)
end)
