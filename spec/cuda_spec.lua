-- cuda_spec.lua: every CUDA kernel against the same op on the CPU; skips,
-- saying why, when there is no GPU.
local loom = require "loom"
local F = loom.F

local ok, why = loom.device_available("cuda")

if not ok then
  print("no GPU: skipping CUDA specs (" .. tostring(why) .. ")")
  describe("cuda", function()
    it("is skipped because cudaGetDeviceCount found no device", function()
      -- a CPU-only build says instead that it has no kernels for the device
      local reason = tostring(why)
      assert.is_truthy(reason:find("cudaGetDeviceCount found no device", 1, true)
                       or reason:find("no kernels for it", 1, true), reason)
    end)
  end)
  return
end

local function flat(t, out)
  out = out or {}
  if type(t) ~= "table" then out[#out + 1] = t return out end
  for _, v in ipairs(t) do flat(v, out) end
  return out
end

-- a (CPU) and b (CUDA) agree elementwise within tol (relative)
local function same(a, b, tol)
  assert.is_truthy(tostring(b.device):find("^cuda"), "expected a CUDA result")
  local x, y = flat(a:totable()), flat(b:to("cpu"):totable())
  assert.are.equal(#x, #y)
  for i = 1, #x do
    local u, v = tonumber(x[i]) or (x[i] and 1 or 0), tonumber(y[i]) or (y[i] and 1 or 0)
    if u == u or v == v then -- both NaN is a match
      assert(math.abs(u - v) <= (tol or 0) * (1 + math.abs(u)),
             ("element %d: cpu %.9g, cuda %.9g"):format(i, u, v))
    end
  end
end

-- runs fn on CPU inputs and on their CUDA copies, and compares
local function check(tol, fn, ...)
  local cpu, gpu = {...}, {}
  for i, t in ipairs(cpu) do gpu[i] = t:to("cuda") end
  same(fn(unpack(cpu)), fn(unpack(gpu)), tol)
end

describe("cuda", function()
  local x, y
  before_each(function()
    loom.manual_seed(7)
    x, y = loom.randn({5, 7}), loom.randn({5, 7})
  end)

  it("copies across devices, dtypes and strides", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "bool"}) do
      check(0, function(t) return t:to(dt) end, x * 10)
    end
    check(0, function(t) return t:t():contiguous() end, x)
    check(0, function(t) return t:narrow(2, 2, 3):expand(2, 5, 3):contiguous() end, x)
    same(loom.full({3, 4}, 2.5), loom.full({3, 4}, 2.5, {device = "cuda"}))
  end)

  it("draws the same random numbers as the CPU", function()
    for _, f in ipairs({"rand", "randn"}) do
      loom.manual_seed(3); local a = loom[f]({6, 9})
      loom.manual_seed(3); local b = loom[f]({6, 9}, {device = "cuda"})
      same(a, b, f == "randn" and 1e-6 or 0)
    end
    loom.manual_seed(3); local a = loom.randint(-4, 9, {6, 9})
    loom.manual_seed(3); local b = loom.randint(-4, 9, {6, 9}, {device = "cuda"})
    same(a, b)
  end)

  it("computes pointwise ops with broadcasting", function()
    for _, f in ipairs({"exp", "tanh", "sqrt", "log"}) do
      check(1e-5, function(t) local u = t:abs() + 0.1 return u[f](u) end, x)
    end
    check(1e-5, function(t) return F.relu(t) + F.gelu(t) + F.silu(t) end, x)
    check(1e-5, function(t) return F.gelu(t, {approximate = "tanh"}) end, x)
    check(1e-5, function(a, b) return a + b * 2 - a / (b:abs() + 1) end, x, y)
    check(1e-5, function(a, b) return a * b:narrow(1, 1, 1) end, x, y)
    check(1e-5, function(a) return a:pow(2) end, x)
  end)

  it("reduces", function()
    for _, d in ipairs({1, 2}) do
      check(1e-5, function(t) return t:sum(d) end, x)
      check(0, function(t) return (t:max(d)) end, x)
      check(0, function(t) return t:argmax(d) end, x)
    end
  end)

  it("multiplies matrices, transposed or not", function()
    check(1e-4, function(a, b) return a:matmul(b:t()) end, x, y)
    check(1e-4, function(a, b) return a:t():matmul(b) end, x, y)
    check(1e-4, function(a) return loom.randn({3, 4, 5}):to(a.device):matmul(a:narrow(1, 1, 5)) end, x)
  end)

  it("runs softmax, norms and embedding", function()
    check(1e-5, function(t) return t:softmax(-1) end, x)
    check(1e-5, function(t) return t:log_softmax(-1) end, x)
    local w, b = loom.randn({7}), loom.randn({7})
    check(1e-5, function(t, w_, b_) return F.layer_norm(t, {7}, w_, b_, 1e-5) end, x, w, b)
    check(1e-5, function(t, w_) return F.rms_norm(t, {7}, w_, 1e-6) end, x, w)
    local idx = loom.tensor({3, 0, 4, 3}, {dtype = "i64"})
    check(0, function(i, t) return F.embedding(i, t) end, idx, x)
  end)

  it("runs backward on the GPU", function()
    local function grad(dev)
      local w = x:to(dev):detach(); w.requires_grad = true
      F.layer_norm(w:matmul(y:to(dev):t()), {5}):sum():backward()
      return w.grad
    end
    same(grad("cpu"), grad("cuda"), 1e-4)
  end)
end)
