-- cuda_dryrun.lua: runs the CUDA specs (or scripts/bench_gpu.lua) on a machine
-- without a GPU, with "cuda" mapped to the CPU, so their Lua runs end to end:
-- a typo, a wrong API call or a shape error shows; the CPU-vs-"CUDA"
-- comparisons agree trivially and prove nothing about the GPU (specs that
-- read the CUDA allocator's counters fail). Usage, from the project root:
--   luajit scripts/cuda_dryrun.lua -o plainTerminal spec/cuda_spec.lua ...
--   luajit scripts/cuda_dryrun.lua --bench --sizes 64 --seqs 128 --models small --quick
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/cuda_dryrun%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
local loom = require("loom")

local function on_cpu(o)
  if type(o) ~= "table" or o.device ~= "cuda" then return o end
  local c = {}
  for k, v in pairs(o) do c[k] = v end
  c.device = "cpu"
  return c
end
local to = loom.Tensor.to
loom.Tensor.to = function(x, what) return to(x, what == "cuda" and "cpu" or on_cpu(what)) end
for _, f in ipairs { "full", "randn", "rand", "empty", "zeros", "ones", "tensor", "arange" } do
  local g = loom[f]
  loom[f] = function(...)
    local a, n = { ... }, select("#", ...)
    for i = 1, n do a[i] = on_cpu(a[i]) end
    return g(unpack(a, 1, n))
  end
end
local randint = loom.randint
loom.randint = function(lo, hi, size, o) return randint(lo, hi, size, on_cpu(o)) end
loom.device_available = function() return true end

if arg[1] == "--bench" then
  table.remove(arg, 1)
  dofile(root .. "scripts/bench_gpu.lua")
  return
end
local G = require("support.cuda")
G.ok, G.device = true, "cpu"
table.insert(arg, 1, "--ignore-lua")
table.insert(arg, 2, "--helper=" .. root .. "spec/support/helper.lua")
require("busted.runner") ({ standalone = false })
