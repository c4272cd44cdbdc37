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

function loom.num_threads() return lib.C.lm_num_threads() end
function loom.set_num_threads(n) lib.C.lm_set_num_threads(n) end

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
