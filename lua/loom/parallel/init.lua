-- loom.parallel: tensor parallelism with the semantics of PyTorch's
-- torch.distributed.tensor.parallel: parallelize_module resolves a plan and
-- calls each style's apply; the styles do the rest.
local T = require("loom.tensor")
local S = require("loom.parallel.parallel_style")
local styles = require("loom.parallel.styles")
local prepare = require("loom.parallel.prepare")

local M = { ParallelStyle = S.ParallelStyle }
for k, v in pairs(styles) do M[k] = v end
for k, v in pairs(prepare) do M[k] = v end

local function warn(msg)
  local C = require("loom").C
  if C.lm_dist_rank() == 0 then io.stderr:write("loom warning: ", msg, "\n") end
end

-- fnmatch on one FQN atom, by libc's fnmatch(3) as Python's fnmatch does
-- it: * ? [seq] [!seq] with ranges; a backslash is an ordinary character
-- (FNM_NOESCAPE), and a dot is matched by * and ? (no FNM_PERIOD).
local ffi = require("ffi")
require("loom.posix")   -- loom_fnmatch
local FNM_NOESCAPE = 2   -- glibc's and POSIX's value
local function fnmatch(name, pattern)
  return ffi.C.loom_fnmatch(pattern, name, FNM_NOESCAPE) == 0
end
function M.fnmatch(name, pattern)
  if type(name) ~= "string" then T.argerror("fnmatch", "name", "a string", T.describe(name)) end
  if type(pattern) ~= "string" then T.argerror("fnmatch", "pattern", "a string", T.describe(pattern)) end
  return fnmatch(name, pattern)
end

local function is_style(v) return type(v) == "table" and getmetatable(v) and v.apply ~= nil and v.__name ~= nil end

local function apply(style, module, mesh, fqn, src)
  S.claim(module, style, fqn)
  style._src_data_rank = src
  style:apply(module, mesh, fqn)
end

-- Applies style to every submodule of `module` whose path matches the
-- atoms; returns the number matched.
local function walk(module, atoms, i, style, mesh, prefix, src)
  if i > #atoms then
    apply(style, module, mesh, prefix, src)
    return 1
  end
  local n = 0
  for _, kv in ipairs(module:named_children()) do
    if fnmatch(kv[1], atoms[i]) then
      n = n + walk(kv[2], atoms, i + 1, style, mesh, prefix == "" and kv[1] or prefix .. "." .. kv[1], src)
    end
  end
  return n
end

-- parallelize_module(module, device_mesh, plan, {src_data_rank=0}):
-- plan is a ParallelStyle (for module itself) or a table from FQN pattern
-- ("layers.*.attention.wq", "" for the root) to ParallelStyle. The mesh
-- must be 1-D (pass mesh["tp"]); nil uses the ambient mesh (mesh:use),
-- where parallelize_module(module, plan) may omit it altogether.
-- src_data_rank = false distributes with no communication.
function M.parallelize_module(module, mesh, plan, opts)
  local Module = require("loom.nn.module")
  if not Module.is_module(module) then T.argerror("parallelize_module", "module", "an nn.Module", T.describe(module)) end
  local dist = require("loom.distributed")
  -- parallelize_module(module, plan) inside mesh:use(...): the mesh omitted
  if plan == nil and mesh ~= nil and not dist.is_mesh(mesh) and type(mesh) == "table" then mesh, plan = nil, mesh end
  mesh = mesh or dist.current_mesh()
  if mesh == nil then error("parallelize_module: no device_mesh given and no ambient mesh (mesh:use)", 2) end
  if not dist.is_mesh(mesh) then T.argerror("parallelize_module", "device_mesh", "a DeviceMesh", T.describe(mesh)) end
  -- (a style that takes an N-D mesh, as ExpertTensorParallel a 2-D
  -- (ep, tp) one, says so in its class's mesh_ndims)
  if mesh.ndim ~= 1 and not (is_style(plan) and plan.mesh_ndims and plan.mesh_ndims[mesh.ndim]) then
    error(string.format("parallelize_module: expected a 1-D device mesh, got a %d-D one; pass the tensor-parallel "
                        .. "sub-mesh, e.g. mesh[\"tp\"]", mesh.ndim), 2)
  end
  opts = opts or {}
  -- handed to distribute_tensor as is: a rank, or false for no communication
  local src = opts.src_data_rank
  if src == nil then src = 0 end
  local nranks = #mesh:ranks()
  if src ~= false and (type(src) ~= "number" or src ~= math.floor(src) or src < 0 or src >= nranks) then
    T.argerror("parallelize_module", "src_data_rank", string.format("a rank of the mesh (0 to %d) or false", nranks - 1),
               T.describe(src))
  end
  if plan == nil then
    warn("parallelize_module: no parallelize_plan given; the module is unchanged")
    return module
  end
  if is_style(plan) then
    apply(plan, module, mesh, "", src)
    return module
  end
  if type(plan) ~= "table" then
    T.argerror("parallelize_module", "parallelize_plan", "a ParallelStyle or a table of FQN = ParallelStyle",
               T.describe(plan))
  end
  local keys = {}
  for k, v in pairs(plan) do
    if type(k) ~= "string" then
      T.argerror("parallelize_module", "parallelize_plan", "string keys (FQN patterns; nn.Sequential's children are "
                 .. "named \"1\", \"2\", ... (1-based): write [\"1\"] = style)", T.describe(k))
    end
    if not is_style(v) then T.argerror("parallelize_module", "parallelize_plan[" .. k .. "]", "a ParallelStyle", T.describe(v)) end
    keys[#keys + 1] = k
  end
  table.sort(keys) -- parents before children: "" < "layers" < "layers.1"
  for _, k in ipairs(keys) do
    local atoms = {}
    for atom in k:gmatch("[^.]+") do atoms[#atoms + 1] = atom end
    if walk(module, atoms, 1, plan[k], mesh, "", src) == 0 then
      local zero = ("." .. k .. "."):find("%.0%.") and "; child indices are 1-based (PyTorch's \"0\" is \"1\")" or ""
      warn(string.format("parallelize_module: the plan key %q matches no submodule%s", k, zero))
    end
  end
  return module
end

M.loss_parallel = require("loom.parallel.loss").loss_parallel
-- ExpertParallel(): a mixture of experts' experts over an "ep" mesh dim (loom.parallel.expert)
M.ExpertParallel = require("loom.parallel.expert").ExpertParallel
-- ExpertTensorParallel(): each expert's hidden dim cut over tp, over a "tp" or an (ep, tp) mesh
M.ExpertTensorParallel = require("loom.parallel.expert").ExpertTensorParallel
-- replicate: data parallelism, loom.distributed.replicate (its older name here)
M.replicate = function(...) return require("loom.distributed.replicate").replicate(...) end

return M
