-- async_tp.lua: asynchronous tensor parallelism (PyTorch's "micro-pipeline
-- TP"): the all-gather of sequence shards before a column-wise matmul and
-- the reduce-scatter after a row-wise one are cut into one chunk per rank
-- and moved by p2p while the matmuls of the chunks already there run.
--
--   all_gather_matmul(x, w, g):    (B, T/tp, in) shard -> (B, T, out/tp):
--     this rank's chunk first, then each other rank's as it arrives;
--     all_gather_matmuls(x, {w...}, g) multiplies each chunk by every w
--     (one gather for wq, wk, wv: AsyncTPInput's hook, below).
--   matmul_reduce_scatter(x, w, g): (B, T, in/tp) -> (B, T/tp, out): the
--     partial product of each other rank's chunk is computed and sent at
--     once; this rank's own is computed while they travel.
-- Forward values are those of the plain plan (chunks of one GEMM; partial
-- sums added in rank order). Gradients go through differentiable
-- collectives in backward (not overlapped): the gathered input's through a
-- reduce-scatter (_dist_pad), the scattered output's through an all-gather.
local loom = require("loom")
local dist = require("loom.distributed")
local T = require("loom.tensor")
local C = loom.C

local M = {}
local TAG_AG, TAG_RS = 30000, 30001

local function chunks(fname, n, tp)
  if n % tp ~= 0 then
    error(string.format("%s: the sequence length (%d) must divide by the tensor-parallel degree (%d) for async TP",
                        fname, n, tp), 4)
  end
  return n / tp
end

-- g: {group = Group of the tp dim, size, rank}
-- all_gather_matmuls(x, {w1, w2, ...}, g) -> {y1, y2, ...}: gather once,
-- multiply many: each arriving chunk of x is multiplied by every weight
-- (wq, wk, wv share one gather; w1, w3 another), so the bytes moved are
-- those of one all-gather whatever the number of weights.
function M.all_gather_matmuls(x, ws, g)
  local tp, me = g.size, g.rank
  local c = x:size(2)
  -- receive every other rank's chunk, send ours to every other rank
  local recvs = {}
  for s = 1, tp - 1 do   -- (buffers on x's device: a cuda mesh's chunks land there)
    local buf = loom.empty(x:size(), { dtype = x.dtype, device = x.device })
    recvs[s] = dist.irecv(buf, (me - s) % tp, g.group, nil, { tag = TAG_AG })
  end
  local xd = x:detach():contiguous()
  local sends = {}
  for s = 1, tp - 1 do sends[s] = dist.isend(xd, (me + s) % tp, g.group, nil, { tag = TAG_AG }) end
  -- pad(x) carries the gradient: zeros but x's rows (_dist_pad); its
  -- backward reduce-scatters, once whatever the number of weights
  -- (autograd adds the weights' terms first): each rank gets its rows'
  -- sum over ranks, its shard's gradient. Without gradients the chunks are
  -- used as they are.
  local grad = loom.is_grad_enabled() and x.requires_grad
  local pad = grad and T.op(C.LM_OP_DIST_PAD, { x }, { 1 }, nil, { g.group.comm })
  local wts, outs = {}, {}
  for i, w in ipairs(ws) do wts[i], outs[i] = w:t(), {} end
  local function multiply(r, xc)
    for i, wt in ipairs(wts) do outs[i][r + 1] = xc:matmul(wt) end
  end
  multiply(me, grad and pad:narrow(2, me * c + 1, c) or x)
  for s = 1, tp - 1 do
    local r = (me - s) % tp
    local got = recvs[s]:wait()
    multiply(r, grad and pad:narrow(2, r * c + 1, c) + got or got)
  end
  for _, s in ipairs(sends) do s:wait() end
  for i = 1, #ws do outs[i] = loom.cat(outs[i], 2) end
  return outs
end

function M.all_gather_matmul(x, w, g) return M.all_gather_matmuls(x, { w }, g)[1] end

function M.matmul_reduce_scatter(x, w, g)
  local tp, me = g.size, g.rank
  local c = chunks("matmul_reduce_scatter", x:size(2), tp)
  local recvs = {}
  local shape = { x:size(1), c, w:size(1) }   -- a chunk of the product x w^T
  for r = 0, tp - 1 do
    if r ~= me then
      local buf = loom.empty(shape, { dtype = x.dtype, device = x.device })
      recvs[r] = dist.irecv(buf, r, g.group, nil, { tag = TAG_RS })
    end
  end
  local wt = w:t()
  local z, sends = {}, {}
  for s = 1, tp - 1 do   -- the other ranks' chunks first: they travel while ours computes
    local r = (me + s) % tp
    z[r + 1] = x:narrow(2, r * c + 1, c):matmul(wt)
    sends[#sends + 1] = dist.isend(z[r + 1]:detach(), r, g.group, nil, { tag = TAG_RS })
  end
  z[me + 1] = x:narrow(2, me * c + 1, c):matmul(wt)
  -- this rank's chunk of the partial product, whose backward all-gathers
  -- the output's gradient (as reduce-scatter's does)
  local y = z[me + 1]
  if loom.is_grad_enabled() and y.requires_grad then
    y = T.op(C.LM_OP_DIST_SLICE, { loom.cat(z, 2) }, { 1 }, nil, { g.group.comm })
  end
  local acc
  for r = 0, tp - 1 do   -- partial sums in rank order
    local term = r == me and y or recvs[r]:wait()
    acc = acc and acc + term or term
  end
  for _, s in ipairs(sends) do s:wait() end
  return acc
end

local function group_of(mesh)
  return { group = mesh:get_group(1), size = mesh:size(), rank = mesh:get_local_rank(1) }
end

local function local_of(t) return dist.is_dtensor(t) and t:to_local() or t end

-- forwards for Linear modules parallelized Colwise (input Shard(2)) and
-- Rowwise (output Shard(2)); installed by the styles' async_tp option
-- placeholders handed to a module whose input was gathered for its children
-- (shared_gather_hook): the gathered shape, no data (an expanded zero)
local placeholders = setmetatable({}, { __mode = "k" })

function M.colwise_forward(mesh)
  local g = group_of(mesh)
  return function(self, x)
    local y = rawget(self, "_async_tp_out")   -- computed by the parent's shared gather
    if y then
      rawset(self, "_async_tp_out", nil)
    elseif placeholders[x] then
      error("ColwiseParallel(async_tp): this Linear's product was already used; a module whose input "
            .. "AsyncTPInput gathers may call each of its consumers once per forward", 2)
    else
      y = M.all_gather_matmul(local_of(x), local_of(self.weight), g)
    end
    if self.bias ~= nil then y = y + local_of(self.bias) end
    return y
  end
end

function M.rowwise_forward(mesh)
  local g = group_of(mesh)
  return function(self, x)
    local y = M.matmul_reduce_scatter(local_of(x), local_of(self.weight), g)
    -- the replicated bias through DTensor, so its gradient is summed over
    -- the sequence shards of every rank
    if self.bias ~= nil then y = (dist.from_local(y, mesh, { dist.Shard(2) }) + self.bias):to_local() end
    return y
  end
end

-- forward pre-hook of AsyncTPInput: the module's first input (sequence
-- shards) gathered once in chunks, each chunk multiplied by every consumer's
-- weight; the products wait on the consumers (Colwise async_tp Linears),
-- and the module gets a placeholder of the gathered shape in place of x.
function M.shared_gather_hook(mesh, consumers, fqn)
  local g = group_of(mesh)
  return function(module, args)
    local mods, ws = {}, {}
    for i, name in ipairs(consumers) do
      local m = module[name]
      if not (m and rawget(m, "_tp_style") == "ColwiseParallel" and rawget(m, "_async_tp")) then
        error(string.format("AsyncTPInput: %s.%s must be a Linear parallelized by ColwiseParallel{input_layouts=Shard(2), "
                            .. "async_tp=true}", fqn ~= "" and fqn or "the module", name), 3)
      end
      mods[i], ws[i] = m, local_of(m.weight)
    end
    local x = local_of(args[1])
    local ys = M.all_gather_matmuls(x, ws, g)
    for i, m in ipairs(mods) do rawset(m, "_async_tp_out", ys[i]) end
    local ph = loom.zeros(1, 1, 1, { dtype = x.dtype }):expand(x:size(1), x:size(2) * g.size, x:size(3))
    placeholders[ph] = true
    args[1] = ph
    return args
  end
end

return M
