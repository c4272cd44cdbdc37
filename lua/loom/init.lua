-- loom: tensors, autograd and tensor parallelism for LuaJIT.
-- `local loom = require "loom"` gives tensors and the functional API;
-- loom.nn, loom.optim and loom.distributed load on first use.
local lib = require "loom.lib"
local T = require "loom.tensor"
local ops = require "loom.tensor_ops"

T.install()
require "loom.autograd_hooks"   -- p:register_grad_ready_hook(fn)

local loom = {
  C = lib.C,
  Tensor = T.Tensor,
  is_tensor = T.is_tensor,
  wrap = T.wrap,
  op = T.op,
  dtypes = T.dtypes,
}

for _, name in ipairs { "tensor", "empty", "zeros", "ones", "full", "arange", "rand", "randn",
                        "randint", "manual_seed", "get_rng_state", "set_rng_state", "no_grad",
                        "is_grad_enabled" } do
  loom[name] = T[name]
end
for name, fn in pairs(ops) do loom[name] = fn end
local ser = require "loom.serialize"
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
  local ffi, C, list = require "ffi", lib.C, {}
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

function loom.num_threads() return lib.C.lm_num_threads() end
function loom.set_num_threads(n)
  if not T.is_int(n) or n < 1 or n > 4096 then
    T.argerror("set_num_threads", "n", "an integer in [1, 4096]", T.describe(n))
  end
  lib.C.lm_set_num_threads(n)
end

-- Submodules load lazily so `require "loom"` stays cheap.
local lazy = { F = "loom.functional", nn = "loom.nn", optim = "loom.optim",
               distributed = "loom.distributed", data = "loom.data", models = "loom.models" }
return setmetatable(loom, { __index = function(t, k)
  local m = lazy[k]
  if not m then return nil end
  local v = require(m)
  rawset(t, k, v)
  return v
end })
