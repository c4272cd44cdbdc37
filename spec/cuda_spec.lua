-- cuda_spec.lua: the CUDA backend against the same ops on the CPU (the
-- ground truth): copies, random numbers, pointwise, reductions, GEMM (f32,
-- TF32, bf16, strided and broadcast batches), row kernels, backward, and
-- the caching allocator. Skips, saying why, when there is no GPU.
-- Tolerances are |cuda - cpu| / |cpu| over a result (support/cuda.lua).
local loom = require("loom")
local ffi = require("ffi")
local G = require("support.cuda")
local F = loom.F

if G.skip(describe, it, "cuda") then return end

local C = loom.C

-- the allocator's counters of cuda:0
local function mem()
  local s = ffi.new("int64_t[?]", C.LM_NMEM_STATS)
  assert(C.lm_device_memory_stats(C.LM_CUDA0, s) == 0, ffi.string(C.lm_last_error()))
  return { allocated = tonumber(s[C.LM_MEM_ALLOCATED]), peak = tonumber(s[C.LM_MEM_PEAK]),
           reserved = tonumber(s[C.LM_MEM_RESERVED]), driver = tonumber(s[C.LM_MEM_DRIVER_ALLOCS]) }
end

describe("cuda", function()
  local x, y
  before_each(function()
    loom.manual_seed(7)
    x, y = loom.randn({5, 7}), loom.randn({5, 7})
  end)

  it("copies across devices, dtypes and strides", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "bool"}) do
      G.check(0, function(t) return t:to(dt) end, x * 10)
    end
    G.check(0, function(t) return t:t():contiguous() end, x)
    G.check(0, function(t) return t:narrow(2, 2, 3):expand(2, 5, 3):contiguous() end, x)
    G.close(loom.full({3, 4}, 2.5), loom.full({3, 4}, 2.5, {device = "cuda"}), 0)
  end)

  it("multiplies with an empty inner dim (K = 0) to zeros", function()
    for _, dt in ipairs({ "f32", "f64", "bf16" }) do
      G.check(0, function(a, b) return a:matmul(b) end, loom.randn({ 2, 3, 0 }):to(dt), loom.randn({ 2, 0, 4 }):to(dt))
    end
  end)

  it("Module:to(\"cuda\") moves a parameter on another cuda:k to the current device", function()
    if loom.cuda.device_count() < 2 then
      print("one GPU: Module:to across GPUs needs two") -- the single-device move is checked below
    end
    local k = loom.cuda.device_count() >= 2 and 1 or 0
    local m = loom.nn.Linear(3, 2):to("cuda:" .. k)
    loom.cuda.set_device(0)
    m:to("cuda")
    assert.are.equal("cuda:0", m.weight.device)
    assert.are.equal("cuda:0", m.bias.device)
  end)

  it("draws the same random numbers as the CPU", function()
    for _, f in ipairs({"rand", "randn"}) do
      loom.manual_seed(3); local a = loom[f]({6, 9})
      loom.manual_seed(3); local b = loom[f]({6, 9}, {device = "cuda"})
      G.close(a, b, f == "randn" and 1e-6 or 0)
    end
    loom.manual_seed(3); local a = loom.randint(-4, 9, {6, 9})
    loom.manual_seed(3); local b = loom.randint(-4, 9, {6, 9}, {device = "cuda"})
    G.close(a, b, 0)
  end)

  it("computes pointwise ops with broadcasting", function()
    for _, f in ipairs({"exp", "tanh", "sqrt", "log"}) do
      G.check(1e-6, function(t) local u = t:abs() + 0.1 return u[f](u) end, x)
    end
    G.check(1e-6, function(t) return F.relu(t) + F.gelu(t) + F.silu(t) end, x)
    G.check(1e-6, function(t) return F.gelu(t, {approximate = "tanh"}) end, x)
    G.check(1e-6, function(a, b) return a + b * 2 - a / (b:abs() + 1) end, x, y)
    G.check(1e-6, function(a, b) return a * b:narrow(1, 1, 1) end, x, y)
    G.check(1e-6, function(a) return a:pow(2) end, x)
  end)

  it("reduces", function()
    for _, d in ipairs({1, 2}) do
      G.check(1e-6, function(t) return t:sum(d) end, x)
      G.check(0, function(t) return (t:max(d)) end, x)
      G.check(0, function(t) return t:argmax(d) end, x)
    end
  end)

  it("multiplies matrices, transposed or not, in batches", function()
    local z = loom.randn({3, 4, 5})
    G.check(1e-5, function(a, b) return a:matmul(b:t()) end, x, y)
    G.check(1e-5, function(a, b) return a:t():matmul(b) end, x, y)
    G.check(1e-5, function(a, b) return b:matmul(a:narrow(1, 1, 5)) end, x, z)   -- rows folded
    G.check(1e-5, function(a, b) return b:transpose(2, 3):matmul(b) end, x, z)   -- strided batches
    G.check(1e-5, function(a, b) return a:narrow(2, 1, 4):matmul(b) end, x, z)   -- a broadcast over the batch
    G.check(1e-12, function(a, b) return a:to("f64"):matmul(b:to("f64"):t()) end, x, y)
  end)

  it("multiplies bf16 and f16 operands with f32 accumulation, and f32 in TF32 on request", function()
    loom.manual_seed(11)
    local a, b = loom.randn({64, 96}), loom.randn({96, 80})
    for _, dt in ipairs({"bf16", "f16"}) do
      G.check(G.tol[dt], function(p, q) return p:to(dt):matmul(q:to(dt)) end, a, b)
    end
    local want = a:to("f64"):matmul(b:to("f64")):to("f32")
    assert.are.equal(0, C.lm_set_float32_matmul_precision(C.LM_PRECISION_HIGH))
    local ok, got = pcall(function() return a:to("cuda"):matmul(b:to("cuda")) end)
    C.lm_set_float32_matmul_precision(C.LM_PRECISION_HIGHEST)
    assert(ok, got)
    -- TF32 keeps 10 bits of mantissa: ~3e-4 relative, far above f32's 1e-7
    local err = G.rel_err(G.values(want), G.values(got))
    assert.is_true(err < 2e-3, "tf32 error " .. err)
    G.close(want, a:to("cuda"):matmul(b:to("cuda")), 1e-5) -- back to full f32
  end)

  it("runs softmax, norms and embedding", function()
    G.check(1e-6, function(t) return t:softmax(-1) end, x)
    G.check(1e-6, function(t) return t:log_softmax(-1) end, x)
    local w, b = loom.randn({7}), loom.randn({7})
    G.check(1e-6, function(t, w_, b_) return F.layer_norm(t, {7}, w_, b_, 1e-5) end, x, w, b)
    G.check(1e-6, function(t, w_) return F.rms_norm(t, {7}, w_, 1e-6) end, x, w)
    local idx = loom.tensor({4, 1, 5, 4}, {dtype = "i64"}) -- ids are 1-based in Lua
    G.check(0, function(i, t) return F.embedding(i, t) end, idx, x)
  end)

  it("runs backward on the GPU", function()
    -- weighted: the gradient of a plain sum of a layer norm is zero, and two
    -- roundings of zero differ by 100% (the emulated device showed it)
    local wt = loom.randn({5, 5})
    local function grad(dev)
      local w = x:to(dev):detach(); w.requires_grad = true
      (F.layer_norm(w:matmul(y:to(dev):t()), {5}) * wt:to(dev)):sum():backward()
      return w.grad
    end
    G.close(grad("cpu"), grad("cuda"), 1e-5)
  end)

  -- on a GPU the norm is summed on the device (lua/loom/nn/utils.lua);
  -- the CPU's path is the reference: f32 and bf16 gradients, clipped and not
  it("clips gradient norms as the CPU does", function()
    for _, max_norm in ipairs({ 0.5, 100 }) do
      local grads = { loom.randn({ 7, 5 }), loom.randn({ 300 }):to("bf16"), loom.randn({ 2, 3, 4 }) }
      local norms, out = {}, {}
      for _, dev in ipairs({ "cpu", "cuda" }) do
        local ps = {}
        for i, g in ipairs(grads) do
          ps[i] = loom.zeros(g:size(), { dtype = g.dtype }):to(dev):requires_grad_(true)
          ps[i].grad = g:clone():to(dev) -- to("cpu") would be g itself, clipped in place
        end
        norms[dev] = loom.nn.utils.clip_grad_norm_(ps, max_norm)
        out[dev] = ps
      end
      assert.is_number(norms.cuda)
      assert(math.abs(norms.cuda - norms.cpu) <= 1e-12 * norms.cpu, ("norm %.17g, cpu %.17g"):format(norms.cuda, norms.cpu))
      for i = 1, #grads do G.close(out.cpu[i].grad, out.cuda[i].grad, 0, "gradient " .. i) end
    end
    local p = loom.zeros({ 3 }):to("cuda"):requires_grad_(true)
    p.grad = loom.tensor({ 3, 4, 12 }):to("cuda")
    local n = loom.nn.utils.clip_grad_norm_({ p }, 1, { tensor = true })
    assert.equal("cuda", n.device:sub(1, 4))
    assert.equal(13, n:item())
  end)

  it("asks the driver for nothing after the first training steps", function()
    loom.manual_seed(5)
    local w1, w2 = loom.randn({32, 64}):to("cuda"), loom.randn({64, 10}):to("cuda")
    w1.requires_grad, w2.requires_grad = true, true
    local data, target = loom.randn({16, 32}), loom.randint(1, 11, {16}, {dtype = "i64"})
    local function step()
      w1.grad, w2.grad = nil, nil
      local h = F.relu(data:to("cuda"):matmul(w1))
      F.cross_entropy(h:matmul(w2), target:to("cuda")):backward()
      collectgarbage() -- tensors the step dropped go back to the cache now
      collectgarbage()
    end
    step(); step()
    local before = mem()
    for _ = 1, 3 do step() end
    local after = mem()
    assert.are.equal(before.driver, after.driver)
    assert.is_true(after.peak >= after.allocated and after.reserved >= after.allocated)
    assert.is_true(after.allocated > 0) -- the weights and their grads
  end)

  it("reports running out of memory and stays usable", function()
    local ok, err = pcall(loom.empty, {2 ^ 39}, {dtype = "f64", device = "cuda"}) -- 4 TiB
    assert.is_false(ok)
    err = tostring(err)
    assert.is_truthy(err:find("out of memory", 1, true), err)
    assert.is_truthy(err:find("4398046511104", 1, true), err) -- the bytes asked for
    -- (the allocator's message also names the free bytes: test_cuda_emu checks
    -- it; lm_empty words its own today)
    G.check(1e-6, function(t) return t * 2 end, x) -- the device still works
  end)
end)
