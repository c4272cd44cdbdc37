-- low_binary_spec.lua: binary arithmetic on bf16/f16 operands (alone or
-- mixed with f32) runs on the CPU without casting the operands to f32
-- copies and the result back (lm_backend.binary_low): the kernel widens
-- each block on the stack and rounds once. The ground truth is that cast
-- path written out in Lua: the operands cast to f32, the op in f32, the
-- result cast to the promoted dtype. Bits must match exactly, on dense,
-- broadcast (stride 0), transposed and 0-dim operands, NaN and infinities
-- included; and the gradients of a mixed add reach each side in its dtype.
local loom = require("loom")

local KINDS = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a:abs():pow(b) end,
  maximum = function(a, b) return loom.maximum(a, b) end,
  minimum = function(a, b) return loom.minimum(a, b) end,
}
local PAIRS = { { "bf16", "bf16" }, { "f32", "bf16" }, { "bf16", "f32" }, { "f16", "f16" }, { "f16", "f32" },
                { "bf16", "f16" } }

local function u16or32(t) -- the bits, as numbers (NaN compares by its bits)
  local w = t.dtype == "f32" and "i32" or "i16"
  local ffi = require("ffi")
  local c = t:contiguous()
  local p = ffi.cast(w == "i32" and "int32_t *" or "int16_t *", c:data_ptr())
  local out = {}
  for i = 0, c:numel() - 1 do out[#out + 1] = p[i] end
  return out
end

-- the same bits everywhere, else the first element that differs
local function same(want, got, what)
  local w, g = u16or32(want), u16or32(got)
  assert.are.equal(#w, #g, what)
  for i = 1, #w do
    if w[i] ~= g[i] then
      error(("%s: element %d has bits %d, the cast path %d"):format(what, i, g[i], w[i]), 2)
    end
  end
end

-- the cast path: f32 copies, the op, the result in the op's dtype
local function reference(f, a, b, dt)
  return f(a:to("f32"), b:to("f32")):to(dt)
end

local function operands(da, db)
  loom.manual_seed(21)
  local a = (loom.randn({ 5, 37 }) * 3):to(da)
  local b = (loom.randn({ 5, 37 }) * 3):to(db)
  -- specials: NaN, +-inf, a value that rounds to even, zero
  loom.no_grad(function()
    a:narrow(2, 1, 4):copy_(loom.tensor({ 0 / 0, math.huge, -math.huge, 1 + 2 ^ -8 }):to(da):expand({ 5, 4 }))
    b:narrow(2, 2, 2):zero_()
  end)
  return a, b
end

describe("binary arithmetic on bf16/f16 operands", function()
  for name, f in pairs(KINDS) do
    for _, pr in ipairs(PAIRS) do
      local da, db = pr[1], pr[2]
      it(("%s of %s and %s has the bits of the cast path, dense, broadcast, transposed, 0-dim"):format(name, da, db),
         function()
        local a, b = operands(da, db)
        local y = f(a, b)
        local dt = y.dtype
        same(reference(f, a, b, dt), y, "dense")
        local row = b:narrow(1, 2, 1)                       -- (1, 37): stride 0 along rows
        same(reference(f, a, row, dt), f(a, row), "broadcast")
        local at, bt = a:t():contiguous():t(), b:t():contiguous():t()   -- transposed layouts
        same(reference(f, at, bt, dt), f(at, bt), "transposed")
        local s = loom.tensor(1.7):to(db)                    -- 0-dim: a's dtype wins (PyTorch's rule)
        same(reference(f, a, s, f(a, s).dtype), f(a, s), "0-dim")
      end)
    end
  end

  it("gives a mixed add's gradients to each side in its own dtype", function()
    local a = loom.randn({ 3, 4 }):requires_grad_()
    local b = loom.randn({ 3, 4 }):to("bf16"):requires_grad_()
    local y = a + b
    y:sum():backward()
    assert.are.equal("f32", a.grad.dtype)
    assert.are.equal("bf16", b.grad.dtype)
    assert.are.same(loom.ones({ 3, 4 }):totable(), b.grad:to("f32"):totable())
  end)
end)
