-- expert.lua: expert parallelism, as torchtitan's ExpertParallel: a
-- mixture of experts' expert weights (loom.nn.MoEExperts: w1, w2, w3 of
-- (experts, ...)) sharded on the experts over an "ep" mesh dim, each rank
-- holding experts / ep of them, and the tokens carried to their experts'
-- ranks and back by all-to-all (dist.functional.all_to_all_single,
-- differentiable: the reverse exchange in backward). The ep ranks are
-- data-parallel: each routes its own tokens. ExpertTensorParallel cuts
-- each expert's hidden dimension over the tp ranks as well (torchtitan's
-- ExpertTensorParallel and, without ep, its TensorParallel for experts):
-- w1 and w3 column-wise, w2 row-wise, so each tp rank's output is a
-- partial sum that the mixture of experts hands on as Partial (nn.MoE).
--
-- Per forward of the experts, rows x sorted by (global) expert with the
-- rows per expert `sizes`:
--   1. the counts: each rank sends each other rank the counts of that
--      rank's experts (an all-to-all of E counts), so every rank knows how
--      many rows each source sends each of its experts;
--   2. the rows: to their experts' ranks (an all-to-all with uneven splits),
--      arriving source by source, each source's rows by local expert;
--   3. regrouped expert by expert (a gather), through the local experts'
--      grouped GEMMs, put back source by source, and returned (the reverse
--      all-to-all) in the order they came.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local S = require("loom.parallel.parallel_style")
local dt = require("loom.distributed.dtensor")
local swiglu_experts = require("loom.nn.moe").swiglu_experts

local M = {}

-- an i64 tensor of ints (a Lua list) on device
local function ids(list, device)
  local t = loom.tensor(#list > 0 and list or { 0 }, { dtype = "i64" })
  if #list == 0 then t = t:narrow(1, 1, 0) end
  return device ~= "cpu" and t:to(device) or t
end

-- the Lua list of an i64 tensor's values (on the host)
local function host_list(t)
  local h = t:to("cpu"):contiguous()
  local p, out = ffi.cast("const int64_t *", h:data_ptr()), {}
  for i = 0, h:numel() - 1 do out[i + 1] = tonumber(p[i]) end
  return out
end

-- rows of x (rows, d) at the 0-based ids (a gather; its gradient adds back)
local function gather(x, idx) return T.op(loom.C.LM_OP_EMBEDDING, { x, idx }) end

-- the expert-parallel forward of MoEExperts: x (rows, dim) sorted by the
-- global expert, sizes (E) i64 rows per expert
local function ep_forward(self, x, sizes)
  local ep = self._ep
  local mesh, n, dim = ep.mesh, ep.size, ep.dim
  local E = self.num_experts
  local El = E / n
  local dist = require("loom.distributed")
  -- 1. counts: from each source, its rows for each of my El experts
  local counts = dist.functional.all_to_all_single(sizes:to("i64"), nil, nil, mesh, dim)
  local c = host_list(counts)   -- c[s * El + j + 1]: source s, my local expert j
  local mine = host_list(sizes)
  local send, recv = {}, {}
  for r = 0, n - 1 do
    local a, b = 0, 0
    for j = 1, El do a, b = a + mine[r * El + j], b + c[r * El + j] end
    send[r + 1], recv[r + 1] = a, b
  end
  -- 2. rows to their experts' ranks
  local got = dist.functional.all_to_all_single(x, recv, send, mesh, dim)
  -- 3. source-major -> expert-major, the local experts, and back
  local start, at = {}, 0
  for s = 0, n - 1 do
    for j = 0, El - 1 do start[s * El + j] = at at = at + c[s * El + j + 1] end
  end
  local order, local_sizes = {}, {}
  for j = 0, El - 1 do
    local k = 0
    for s = 0, n - 1 do
      local st = start[s * El + j]
      for r = 0, c[s * El + j + 1] - 1 do order[#order + 1] = st + r end
      k = k + c[s * El + j + 1]
    end
    local_sizes[j + 1] = k
  end
  local inverse = {}
  for pos, src in ipairs(order) do inverse[src + 1] = pos - 1 end
  local dev = x.device
  local grouped = #order > 0 and gather(got, ids(order, dev)) or got
  local y = swiglu_experts(grouped, ids(local_sizes, dev), self.w1:to_local(), self.w2:to_local(), self.w3:to_local())
  if #inverse > 0 then y = gather(y, ids(inverse, dev)) end
  return dist.functional.all_to_all_single(y, send, recv, mesh, dim)
end

-- the forward of MoEExperts whose hidden dimension is cut over tp (no
-- ep): the grouped GEMMs on this rank's columns of w1, w3 and rows of w2
local function tp_forward(self, x, sizes)
  return swiglu_experts(x, sizes, self.w1:to_local(), self.w2:to_local(), self.w3:to_local())
end

-- a mixture's output on a tp rank whose experts are cut: its share of the
-- sum, as a Partial DTensor on the tp mesh (nn.MoE calls it: the nn layer
-- makes no DTensors)
local function partial_output(out, mesh) return dt.from_local(out, mesh, { dt.Partial() }) end

local function need_experts(style, module, fqn)
  if module.__name ~= "MoEExperts" then
    error(string.format("%s: %s is a %s; it shards loom.nn.MoEExperts (a MoE's experts)", style,
                        (fqn or "") ~= "" and fqn or "the module", tostring(module.__name)), 5)
  end
end

-- ExpertParallel(): on a loom.nn.MoEExperts module, over a 1-D mesh (the
-- "ep" dim): its weights sharded on the experts (Shard(1); the number of
-- experts must divide by the mesh's size), its forward carrying the rows
-- to their experts' ranks and back. The module's gradients are its
-- experts' on this rank, summed over every rank's tokens (scale them as
-- the data-parallel loss needs: loom.train's layout divides them by ep).
M.ExpertParallel = S.ParallelStyle:extend("ExpertParallel")
function M.ExpertParallel:__init() end
function M.ExpertParallel:apply(module, mesh, fqn)
  need_experts(self.__name, module, fqn)
  local n = mesh:size(1)
  if module.num_experts % n ~= 0 then
    error(string.format("ExpertParallel: %d experts do not divide over %d ranks", module.num_experts, n), 4)
  end
  S.shard_parameters(module, function(_, p)
    return dt.distribute_tensor(p, mesh, { dt.Shard(1) }, { src_data_rank = self._src_data_rank })
  end, self.__name)
  rawset(module, "_ep", { mesh = mesh, dim = 1, size = n, rank = mesh:get_local_rank(1) })
  module.forward = ep_forward
  return module
end

-- ExpertTensorParallel(): on a loom.nn.MoEExperts module, each expert's
-- hidden dimension cut over the tp ranks (w1 and w3 Shard(2), w2
-- Shard(3): column- then row-wise, as a dense feed-forward's TP), over a
-- 1-D mesh (the "tp" dim), or a 2-D mesh (ep, tp) for the experts sharded
-- over ep too (ExpertParallel's dispatch, among the ranks of this rank's
-- tp coordinate). Every tp rank routes the same tokens (the mixture's
-- input replicated over tp); the experts' output on each is its partial
-- sum, which nn.MoE returns as a Partial DTensor on the tp mesh (a plan
-- reduces it: the recipe's PrepareModuleInputOutput all-reduces it, or
-- reduce-scatters it to sequence shards with SP). hidden must divide by tp.
M.ExpertTensorParallel = S.ParallelStyle:extend("ExpertTensorParallel")
M.ExpertTensorParallel.mesh_ndims = { [1] = true, [2] = true }
function M.ExpertTensorParallel:__init() end
function M.ExpertTensorParallel:apply(module, mesh, fqn)
  need_experts(self.__name, module, fqn)
  local two = mesh.ndim == 2
  local tp_mesh = mesh
  if two then
    if not mesh.mesh_dim_names then
      error("ExpertTensorParallel: a 2-D mesh needs mesh_dim_names (ep, tp), to slice its tp dim", 4)
    end
    tp_mesh = mesh[mesh.mesh_dim_names[2]]
  end
  local ep, tp = two and mesh:size(1) or 1, tp_mesh:size(1)
  if module.num_experts % ep ~= 0 then
    error(string.format("ExpertTensorParallel: %d experts do not divide over %d ranks", module.num_experts, ep), 4)
  end
  if module.hidden % tp ~= 0 then
    error(string.format("ExpertTensorParallel: the experts' hidden size %d does not divide over %d ranks", module.hidden, tp), 4)
  end
  S.shard_parameters(module, function(name, p)
    local cut = dt.Shard(module.hidden_dims[name])
    return dt.distribute_tensor(p, mesh, two and { dt.Shard(1), cut } or { cut }, { src_data_rank = self._src_data_rank })
  end, self.__name)
  rawset(module, "_etp", { mesh = tp_mesh, comm = tp_mesh:get_group(1).comm, output = partial_output })
  if two then
    rawset(module, "_ep", { mesh = mesh, dim = 1, size = ep, rank = mesh:get_local_rank(1) })
    module.forward = ep_forward
  else
    module.forward = tp_forward
  end
  return module
end

return M
