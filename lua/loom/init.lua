-- loom: tensors, autograd and tensor parallelism for LuaJIT.
-- `local loom = require("loom")` gives tensors and the functional API;
-- loom.nn, loom.optim and loom.distributed load on first use.
local lib = require("loom.lib")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local ops = require("loom.tensor_ops")

T.install()
require("loom.autograd_hooks")   -- p:register_grad_ready_hook(fn)

local loom = {
  C = lib.C,
  Tensor = T.Tensor,
  is_tensor = T.is_tensor,
  wrap = T.wrap,
  op = T.op,
  dtypes = T.dtypes,
  Size = require("loom.size").Size,   -- what x:size() returns: loom.Size{8, 6}
}

for _, name in ipairs { "tensor", "empty", "zeros", "ones", "full", "arange", "rand", "randn",
                        "randint", "manual_seed", "get_rng_state", "set_rng_state", "device" } do
  loom[name] = TC[name]
end
loom.no_grad, loom.is_grad_enabled = T.no_grad, T.is_grad_enabled
for name, fn in pairs(ops) do loom[name] = fn end
local ser = require("loom.serialize")
loom.save, loom.load = ser.save, ser.load
-- Hugging Face's weight files (loom.safetensors loads on first use)
function loom.load_safetensors(path, opts) return require("loom.safetensors").load(path, opts) end
function loom.save_safetensors(tensors, path, opts) return require("loom.safetensors").save(tensors, path, opts) end

-- device_available("cuda") -> true, or false and the reason
function loom.device_available(name)
  if lib.C.lm_device_available(T.device_id(name, "device_available")) == 1 then return true end
  return false, require("ffi").string(lib.C.lm_last_error())
end

-- loom.ops(): every op of the table, in id order: {id, name, nin (-1: any),
-- nout, differentiable, sharded (has a DTensor rule), inplace, kernels =
-- {cpu = bool, cuda = bool}} (kernels: whether this build has the op's kernel
-- for that kind of device, whether or not one is present)
function loom.ops()
  local ffi, C, list = require("ffi"), lib.C, {}
  local info = ffi.new("lm_op_info")
  for id = 0, C.lm_op_count() - 1 do
    C.lm_op_info_of(id, info)
    list[id + 1] = { id = id, name = ffi.string(info.name), nin = info.nin, nout = info.nout,
                     differentiable = info.differentiable == 1, sharded = info.sharded == 1,
                     inplace = info.inplace == 1,
                     kernels = { cpu = C.lm_op_has_kernel(id, C.LM_CPU) == 1,
                                 cuda = C.lm_op_has_kernel(id, C.LM_CUDA0) == 1 } }
  end
  return list
end

-- f32 matmuls: "highest" (f32 products) or "high" (TF32 on GPUs), as
-- torch.set_float32_matmul_precision
local PRECISION = { highest = 0, high = 1 }
function loom.set_float32_matmul_precision(p)
  if not PRECISION[p] then T.argerror("set_float32_matmul_precision", "precision", "\"highest\" or \"high\"", T.describe(p)) end
  lib.C.lm_set_float32_matmul_precision(PRECISION[p])
end
function loom.get_float32_matmul_precision()
  return lib.C.lm_float32_matmul_precision() == 1 and "high" or "highest"
end

-- show_config(): what this build is and sees (build options, the BLAS and
-- its kernel core, threads, CUDA and NCCL, GPUs), printed and returned
function loom.show_config()
  local ffi = require("ffi")
  local s = ffi.string(lib.C.lm_build_info()) ..
            string.format("threads: %d (LOOM_NUM_THREADS)\n", lib.C.lm_num_threads()) ..
            string.format("BLAS workers spin 2^%s cycles before they sleep (OPENBLAS_THREAD_TIMEOUT)\n",
                          os.getenv("OPENBLAS_THREAD_TIMEOUT") or "28")
  io.write(s)
  return s
end

-- loom.cuda: the CUDA devices this process sees
loom.cuda = {}
function loom.cuda.is_available() return (loom.device_available("cuda:0")) end
-- device_count asks cudaGetDeviceCount only: no GPU gets a context from it
function loom.cuda.device_count() return (lib.C.lm_cuda_device_count()) end
-- the device "cuda" names (0-based index), as torch.cuda.set_device
function loom.cuda.set_device(k)
  if lib.C.lm_set_cuda_device(k) < 0 then T.c_error() end
end
-- memory_stats(k): loom.memory_stats("cuda:k")
function loom.cuda.memory_stats(k) return loom.memory_stats("cuda:" .. (k or 0)) end

-- emu_counters({reset = bool}): on the emulated CUDA device (a build with
-- LOOM_CUDA=EMULATE) what its runtime counted since the last reset, by name
-- (docs/devices.md, "The emulated device"); nil and why on any other build
function loom.cuda.emu_counters(opts)
  local C = lib.C
  local ok, f = pcall(function() return C.lm_cuda_emu_counters end)
  if not ok then return nil, "not an emulated CUDA build (cmake -DLOOM_CUDA=EMULATE)" end
  local ffi = require("ffi")
  local n = f(nil, 0, 0)
  local buf = ffi.new("int64_t[?]", n)
  f(buf, n, opts and opts.reset and 1 or 0)
  local out = {}
  for i = 0, n - 1 do out[ffi.string(C.lm_cuda_emu_counter_name(i))] = tonumber(buf[i]) end
  return out
end

-- memory_stats(device): a device allocator's counters, "cpu" by default:
-- allocated (bytes held by live blocks), peak, reserved (the bytes taken
-- from the OS or driver, cached blocks included), driver_allocs (the mmap or
-- cudaMalloc calls) and driver_bytes (the bytes they took, in all)
function loom.memory_stats(device)
  local d = device == nil and "cpu" or device
  if type(d) ~= "string" then T.argerror("memory_stats", "device", "\"cpu\" or \"cuda[:N]\"", T.describe(d)) end
  local ffi, C = require("ffi"), lib.C
  local st = ffi.new("int64_t[?]", C.LM_NMEM_STATS)
  if C.lm_device_memory_stats(T.device_id(d, "memory_stats"), st) < 0 then T.c_error() end
  return { allocated = tonumber(st[C.LM_MEM_ALLOCATED]), peak = tonumber(st[C.LM_MEM_PEAK]),
           reserved = tonumber(st[C.LM_MEM_RESERVED]), driver_allocs = tonumber(st[C.LM_MEM_DRIVER_ALLOCS]),
           driver_bytes = tonumber(st[C.LM_MEM_DRIVER_BYTES]) }
end
-- empty_cache(device): hands the allocator's cached blocks back to the OS
-- (or the GPU's driver), after a collection so dead tensors return theirs
function loom.empty_cache(device)
  local d = device == nil and "cpu" or device
  if type(d) ~= "string" then T.argerror("empty_cache", "device", "\"cpu\" or \"cuda[:N]\"", T.describe(d)) end
  local id = T.device_id(d, "empty_cache")
  collectgarbage()
  if lib.C.lm_device_empty_cache(id) < 0 then T.c_error() end
end

function loom.num_threads() return lib.C.lm_num_threads() end
function loom.set_num_threads(n)
  if not T.is_int(n) or n < 1 or n > 4096 then
    T.argerror("set_num_threads", "n", "an integer in [1, 4096]", T.describe(n))
  end
  lib.C.lm_set_num_threads(n)
end

-- generate(model, tokenizer, prompt, opts) -> the text the model continues
-- the prompt with (loom.models.generate)
function loom.generate(model, tok, prompt, opts) return require("loom.models.generate").text(model, tok, prompt, opts) end

-- Submodules load lazily so `require("loom")` stays cheap.
function loom.autocast(dtype, fn, ...) return require("loom.amp").autocast(dtype, fn, ...) end

-- LOOM_PROFILE=trace:FILE: a trace of the whole run (loom.profiler)
require("loom.profiler").from_env()

local lazy = { F = "loom.functional", nn = "loom.nn", optim = "loom.optim", amp = "loom.amp",
               distributed = "loom.distributed", data = "loom.data", models = "loom.models" }
return setmetatable(loom, { __index = function(t, k)
  local m = lazy[k]
  if not m then return nil end
  local v = require(m)
  rawset(t, k, v)
  return v
end })
