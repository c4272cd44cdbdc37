-- cuda.lua: what the CUDA specs share (`local G = require("support.cuda")`):
-- whether a GPU is there, the spec that says why not, and the comparison of
-- a CPU result (the ground truth) with the same op's result on CUDA.
local loom = require("loom")
local luassert = require("luassert")
local R = require("support.ref")

local G = {}
G.ok, G.why = loom.device_available("cuda")
G.device = "cuda" -- what results must be on (a dry run of the specs' Lua may change it)

-- Whether this machine has a GPU, asked apart from loom's backend (which
-- may be what is broken): LOOM_EXPECT_GPU=1 or 0 says so; else the
-- driver's count (cudaGetDeviceCount, in a build with CUDA) or the NVIDIA
-- driver's list of GPUs in /proc. Returns the answer and what said it.
function G.gpu_here()
  local env = os.getenv("LOOM_EXPECT_GPU")
  if env == "1" or env == "0" then return env == "1", "LOOM_EXPECT_GPU=" .. env end
  local n = loom.C.lm_cuda_device_count()
  if n > 0 then return true, "cudaGetDeviceCount found " .. n end
  local p = io.popen("ls /proc/driver/nvidia/gpus 2>/dev/null")
  local list = p and p:read("*a") or ""
  if p then p:close() end
  if list:match("%S") then return true, "/proc/driver/nvidia/gpus lists a GPU" end
  return false, "no GPU found"
end

-- Without a usable GPU: on a machine without one, prints why and makes one
-- spec that checks the reason is the one expected (no device, or a build
-- without the CUDA backend); on a machine with one (G.gpu_here), makes a
-- spec that fails, so a broken load is never green. Returns true when the
-- caller should stop there.
function G.skip(describe, it, name)
  if G.ok then return false end
  local here, how = G.gpu_here()
  if here then
    describe(name, function()
      it("runs: a GPU is here (" .. how .. ")", function()
        error(("a GPU is here (%s) but loom cannot use it: %s"):format(how, tostring(G.why)), 0)
      end)
    end)
    return true
  end
  print(("no GPU: skipping %s (%s)"):format(name, tostring(G.why)))
  describe(name, function()
    it("is skipped because there is no GPU", function()
      local reason = tostring(G.why)
      luassert.is_truthy(reason:find("cudaGetDeviceCount found no device", 1, true)
                         or reason:find("no GPU here", 1, true) or reason:find("no kernels for it", 1, true), reason)
    end)
  end)
  return true
end

-- t's elements (any device, dtype, layout) as a flat list of numbers
function G.values(t) return R.flat(t:to("cpu"):to("f64"):contiguous():totable()) end

-- |got - want| / |want| over all elements (2-norms); NaN where want has
-- none makes it NaN, which fails every check
function G.rel_err(want, got)
  local num, den = 0, 0
  for i = 1, #want do
    local w, g = want[i], got[i]
    if w ~= w and g ~= g then w, g = 0, 0 end -- NaN in both: agreed
    num, den = num + (g - w) ^ 2, den + w * w
  end
  return math.sqrt(num / (den > 0 and den or 1))
end

-- Tolerances of |got - want| / |want| by dtype: f64 and f32 kernels differ
-- from the CPU's only in summation order; bf16/f16 results are rounded to
-- 8/11 bits, so CPU and GPU may round a value one unit apart.
G.tol = { f64 = 1e-10, f32 = 2e-5, bf16 = 1e-2, f16 = 2e-3 }

-- want (CPU) and got (CUDA) agree: shape, dtype, and values (tol 0: every
-- element equal, NaN equal to NaN; else rel_err <= tol, tol from the dtype
-- when not given)
function G.close(want, got, tol, what)
  what = what or "result"
  luassert.is_truthy(tostring(got.device):find("^" .. G.device), what .. ": expected a CUDA tensor, got " .. tostring(got.device))
  luassert.are.same(want:size(), got:size(), what .. ": shape")
  luassert.are.equal(want.dtype, got.dtype, what .. ": dtype")
  local a, b = G.values(want), G.values(got)
  tol = tol or G.tol[want.dtype] or 0
  if tol == 0 then
    for i = 1, #a do
      local same = a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i])
      if not same then error(("%s: element %d: cpu %.17g, cuda %.17g"):format(what, i, a[i], b[i]), 2) end
    end
    return
  end
  local err = G.rel_err(a, b)
  if not (err <= tol) then error(("%s: relative error %.3g above %.0e"):format(what, err, tol), 2) end
end

-- f(...) on CPU tensors and on their CUDA copies, results compared
function G.check(tol, f, ...)
  local cpu, gpu = { ... }, {}
  for i, t in ipairs(cpu) do gpu[i] = t:to("cuda") end
  G.close(f(unpack(cpu)), f(unpack(gpu)), tol)
end

-- The gradients of sum(f(inputs) * w) for the inputs listed in `which`, on
-- device dev: inputs are copied there as fresh leaves; w is a fixed CPU
-- tensor of the output's shape (f32). Returns the output and the grads.
function G.grads(dev, f, inputs, which, w)
  local leaves = {}
  for i, t in ipairs(inputs) do
    leaves[i] = t:to(dev):detach()
    if which[i] then leaves[i].requires_grad = true end
  end
  local out = f(unpack(leaves))
  local loss = out:to("f32") * w(out):to(dev)
  loss:sum():backward()
  local g = {}
  for i in pairs(which) do g[i] = leaves[i].grad end
  return out, g
end

return G
