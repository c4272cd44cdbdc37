-- grouped_mm_spec.lua: loom.grouped_mm (the GEMM of a mixture of experts, one
-- op over all groups) against a loop of matmuls, one per group: forward and
-- both gradients in f32 and f64 (f64 also against central differences), odd
-- sizes, empty groups, no rows at all, a transposed weight (trans_w),
-- bf16/f16 operands with f32 accumulation, autocast, and the errors.
local loom = require("loom")
local R = require("support.ref")

-- the reference: group e's rows of x times w[e], a matmul per group (f64)
local function loop_mm(x, w, sizes)
  local parts, row = {}, 1
  for e, n in ipairs(sizes) do
    if n > 0 then parts[#parts + 1] = x:narrow(1, row, n):matmul(w:select(1, e)) end
    row = row + n
  end
  if #parts == 0 then return loom.zeros({ 0, w:size(3) }, { dtype = x.dtype }) end
  return loom.cat(parts, 1)
end

local function maxdiff(a, b)
  if a:numel() == 0 then return 0 end
  return (a:to("f64") - b:to("f64")):abs():max():item()
end

local function sum(t) local s = 0 for _, v in ipairs(t) do s = s + v end return s end

-- x (N, K), w (E, K, M) and sizes as Lua lists, random from seed
local function problem(seed, sizes, K, M, dt)
  loom.manual_seed(seed)
  return loom.randn(sum(sizes), K):to(dt), loom.randn(#sizes, K, M):to(dt)
end

describe("grouped_mm", function()
  for _, dt in ipairs { "f32", "f64" } do
    it("equals a loop of matmuls in " .. dt .. ", forward and gradients, odd sizes and empty groups", function()
      local sizes = { 7, 0, 19, 0, 11, 1 }
      local x0, w0 = problem(1, sizes, 13, 11, dt)
      local x, w = x0:clone():requires_grad_(), w0:clone():requires_grad_()
      local xr, wr = x0:clone():requires_grad_(), w0:clone():requires_grad_()
      local y, yr = loom.grouped_mm(x, w, sizes), loop_mm(xr, wr, sizes)
      local tol = dt == "f64" and 1e-12 or 2e-5
      assert.same({ 38, 11 }, y:size():totable())
      assert.equal(dt, y.dtype)
      assert.is_true(maxdiff(y, yr) <= tol, "forward " .. maxdiff(y, yr))
      loom.manual_seed(2)
      local g = loom.randn(38, 11):to(dt)
      y:backward(g)
      yr:backward(g)
      assert.is_true(maxdiff(x.grad, xr.grad) <= tol, "dx " .. maxdiff(x.grad, xr.grad))
      -- empty groups' weights get a zero gradient (the loop gives them none)
      for _, e in ipairs { 2, 4 } do assert.equal(0, w.grad:select(1, e):abs():sum():item()) end
      local wg = w.grad:clone()
      for _, e in ipairs { 2, 4 } do wg:select(1, e):copy_(wr.grad:select(1, e)) end
      assert.is_true(maxdiff(wg, wr.grad) <= tol * 4, "dw " .. maxdiff(wg, wr.grad))
    end)
  end

  it("gives the same whether its groups run side by side (many small) or in turn (large)", function()
    local threads = loom.num_threads()
    loom.set_num_threads(2) -- the CPU runs small groups side by side with 2 threads or more
    for _, sizes in ipairs { { 3, 9, 0, 5, 1, 7, 2, 0, 4, 6 }, { 300, 0, 280, 310, 290 } } do
      local x, w = problem(9, sizes, 6, 5, "f64")
      x:requires_grad_()
      w:requires_grad_()
      local y = loom.grouped_mm(x, w, sizes)
      local xr, wr = x:detach():clone():requires_grad_(), w:detach():clone():requires_grad_()
      local yr = loop_mm(xr, wr, sizes)
      assert.is_true(maxdiff(y, yr) <= 1e-12, "forward, " .. #sizes .. " groups")
      y:sum():backward()
      yr:sum():backward()
      assert.is_true(maxdiff(x.grad, xr.grad) <= 1e-12, "dx, " .. #sizes .. " groups")
      for e, n in ipairs(sizes) do
        if n > 0 then assert.is_true(maxdiff(w.grad:select(1, e), wr.grad:select(1, e)) <= 1e-11, "dw " .. e) end
      end
    end
    loom.set_num_threads(threads)
  end)

  it("has gradients that match central differences (f64)", function()
    local x, w = problem(3, { 2, 0, 3 }, 4, 3, "f64")
    R.gradcheck(function(a, b) return loom.grouped_mm(a, b, { 2, 0, 3 }) end,
                { x:requires_grad_(), w:requires_grad_() }, { tol = 1e-7 })
    local v = loom.randn(3, 3, 4):to("f64") -- (E, M, K), read transposed
    R.gradcheck(function(a, b) return loom.grouped_mm(a, b, { 1, 3, 1 }, { trans_w = true }) end,
                { loom.randn(5, 4):to("f64"):requires_grad_(), v:requires_grad_() }, { tol = 1e-7 })
  end)

  it("reads a transposed weight as it is, and gives its gradient in its layout", function()
    local sizes = { 5, 3, 0, 9 }
    loom.manual_seed(4)
    local x, v = loom.randn(17, 6):requires_grad_(), loom.randn(4, 8, 6):requires_grad_() -- v: (E, M, K)
    local y = loom.grouped_mm(x, v, sizes, { trans_w = true })
    local yr = loom.grouped_mm(x, v:transpose(2, 3):contiguous(), sizes)
    assert.is_true(maxdiff(y, yr) <= 1e-6)
    y:sum():backward()
    assert.same({ 4, 8, 6 }, v.grad:size():totable())
    assert.is_true(v.grad:is_contiguous(), "the gradient of a (E, M, K) weight is dense (E, M, K)")
    local vr = v:detach():clone():requires_grad_()
    loop_mm(x:detach(), vr:transpose(2, 3), sizes):sum():backward()
    assert.is_true(maxdiff(v.grad, vr.grad) <= 1e-5, "dv " .. maxdiff(v.grad, vr.grad))
  end)

  it("takes group sizes as an i64 tensor, and handles no rows at all", function()
    local x, w = problem(5, { 4, 2 }, 3, 2, "f32")
    local y = loom.grouped_mm(x, w, loom.tensor({ 4, 2 }, { dtype = "i64" }))
    assert.is_true(maxdiff(y, loop_mm(x, w, { 4, 2 })) <= 1e-6)
    local wz = w:clone():requires_grad_()
    local z = loom.grouped_mm(loom.zeros(0, 3):requires_grad_(), wz, { 0, 0 })
    assert.same({ 0, 2 }, z:size():totable())
    z:sum():backward()
    assert.equal(0, wz.grad:abs():sum():item())
  end)

  for _, dt in ipairs { "bf16", "f16" } do
    it("takes " .. dt .. " operands and accumulates in f32, as matmul does", function()
      local sizes = { 9, 0, 40, 15 }
      local x, w = problem(6, sizes, 70, 12, dt)
      local y = loom.grouped_mm(x, w, sizes)
      assert.equal(dt, y.dtype)
      -- the same products in f32 from the same (exactly widened) operands,
      -- rounded once to dt: equal but for that rounding
      local want = loop_mm(x:to("f32"), w:to("f32"), sizes)
      local err = ((y:to("f32") - want):abs() / (want:abs() + 1e-3)):max():item()
      assert.is_true(err <= (dt == "bf16" and 2 ^ -8 or 2 ^ -11), "relative error " .. err)
      assert.is_true(maxdiff(y, loop_mm(x, w, sizes)) == 0, "equals a loop of " .. dt .. " matmuls")
    end)
  end

  it("runs in bf16 under autocast, with f32 gradients for f32 leaves", function()
    local x, w = problem(7, { 3, 5 }, 8, 4, "f32")
    x:requires_grad_()
    w:requires_grad_()
    local y = loom.autocast("bf16", loom.grouped_mm, x, w, { 3, 5 })
    assert.equal("bf16", y.dtype)
    y:to("f32"):sum():backward()
    assert.equal("f32", w.grad.dtype)
    assert.equal("f32", x.grad.dtype)
  end)

  it("refuses bad arguments, naming them", function()
    local x, w = problem(8, { 2, 3 }, 4, 5, "f32")
    local function err(...) return R.errmsg(loom.grouped_mm, ...) end
    assert.matches("group_sizes%) sums to 4 rows, but the input has 5", err(x, w, { 1, 3 }))
    assert.matches("group_sizes%) holds %-1 at 1, expected row counts >= 0", err(x, w, { -1, 6 }))
    assert.matches("group_sizes%) expected an i64 tensor of 2 row counts", err(x, w, { 5 }))
    assert.matches("group_sizes%) expected an i64 tensor", err(x, w, loom.tensor({ 2, 3 }, { dtype = "i32" })))
    assert.matches("group_sizes%[2%] expected an integer row count, got 2.5", err(x, w, { 2, 2.5 }))
    assert.matches("input%) has 4 columns but argument #2 %(weight%) is %(2, 5, 5%)", err(x, loom.zeros(2, 5, 5), { 2, 3 }))
    assert.matches("weight%) expected 3 dims", err(x, loom.zeros(4, 5), { 2, 3 }))
    assert.matches("argument #1 %(input%) is bf16 but argument #2 %(weight%) is f32", err(x:to("bf16"), w, { 2, 3 }))
    assert.matches("expected floating point", err(x:to("i64"), w, { 2, 3 }))
    assert.matches("options expected only the keys trans_w", err(x, w, { 2, 3 }, { transpose = true }))
  end)
end)
