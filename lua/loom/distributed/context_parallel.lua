-- context_parallel.lua: context parallelism, as PyTorch's
-- torch.distributed.tensor.experimental.context_parallel: the sequence is
-- sharded over a "cp" mesh dim and attention sees every rank's keys and
-- values. Causal attention is load-balanced: with cp ranks the sequence
-- is cut into 2cp chunks and rank i holds chunks i and 2cp-1-i, so every
-- rank has as many early (cheap) as late (dear) queries.
--
-- Keys and values travel by all-gather over cp (PyTorch's rotate method
-- "allgather"), not around a ring of p2p steps: each rank's scores are its
-- T/cp queries by T keys, so attention memory per rank falls as 1/cp. In
-- backward the keys' and values' gradients are summed over cp and each
-- rank keeps its own chunks'.
--
--   local cp = require("loom.distributed.context_parallel")
--   cp.context_parallel(mesh["cp"], {buffers = {x, y, {model, "rope_cos"}, {model, "rope_sin"}},
--                                    buffer_seq_dims = {2, 2, 1, 1}},
--     function(lx, ly) F.cross_entropy(model(lx), ly):backward() end)
-- Tensors in buffers are passed to fn sharded; {module, name} pairs are
-- swapped for their shard while fn runs (the rotary tables, cut first to the
-- sequence length of the first tensor buffer). Gradients of parameters
-- are this rank's share: average them over cp as data parallelism does
-- (loom.parallel.replicate(model, mesh["cp"])).
local loom = require("loom")
local T = require("loom.tensor")
local C = loom.C

local describe = T.describe
local M = {}

-- 1-based chunk numbers of cp rank r (0-based): r+1 and 2cp-r
local function chunks_of(cp, r) return r + 1, 2 * cp - r end

local function check_len(fname, n, cp)
  if n % (2 * cp) ~= 0 then
    error(string.format("%s: the sequence length (%d) must divide by 2 x cp (%d) for load-balanced sharding",
                        fname, n, 2 * cp), 4)
  end
end

-- this rank's load-balanced shard of t along dim (1-based)
function M.shard_seq(t, dim, cp, rank)
  local n = t:size(dim)
  check_len("context_parallel", n, cp)
  local c = n / (2 * cp)
  local a, b = chunks_of(cp, rank)
  return loom.cat({ t:narrow(dim, (a - 1) * c + 1, c), t:narrow(dim, (b - 1) * c + 1, c) }, dim)
end

-- the 0-based global positions of rank r's tokens in a sequence of n
function M.positions(n, cp, r)
  local c, p = n / (2 * cp), {}
  local a, b = chunks_of(cp, r)
  for _, k in ipairs { a, b } do
    for i = 0, c - 1 do p[#p + 1] = (k - 1) * c + i end
  end
  return p
end

-- the whole sequence back from the ranks' shards gathered in rank order
-- (as all_gather concatenates them) along dim
function M.unshard_seq(g, dim, cp)
  local n = g:size(dim)
  local c = n / (2 * cp)
  local parts = {}
  for r = 0, cp - 1 do
    local a, b = chunks_of(cp, r)
    parts[a] = g:narrow(dim, 2 * r * c + 1, c)
    parts[b] = g:narrow(dim, (2 * r + 1) * c + 1, c)
  end
  return loom.cat(parts, dim)
end

-- the causal mask of this rank's queries against all keys (gathered in
-- rank order): (Tl, T) bool, true where the key's position <= the query's
-- (and, with a sliding window, more than window - 1 before it).
-- Cached weakly: the layers of a step share one mask while the step's graph
-- holds it, and a dropped job keeps none.
local mask_cache = setmetatable({}, { __mode = "v" })
local function causal_mask(n, cp, rank, window, device)
  local key = n .. ":" .. cp .. ":" .. rank .. ":" .. tostring(window) .. ":" .. device
  if mask_cache[key] then return mask_cache[key] end
  local q = M.positions(n, cp, rank)
  local k = {}
  for r = 0, cp - 1 do for _, p in ipairs(M.positions(n, cp, r)) do k[#k + 1] = p end end
  local qt = loom.tensor(q, { dtype = "f32" }):view(#q, 1)
  local kt = loom.tensor(k, { dtype = "f32" }):view(1, #k)
  local m = (kt - qt):le(0)
  if window then m = m:logical_and((kt - qt):gt(-window)) end
  if device ~= "cpu" then m = m:to(device) end
  mask_cache[key] = m
  return m
end

-- keys or values (B, H, Tl, D) gathered over cp on the sequence; in
-- backward their gradients are summed over cp, and each rank keeps its own
local function gather_seq(x, comm, dim0)
  local full = T.op(C.LM_OP_DIST_ALL_GATHER, { x }, { dim0, -1 }, nil, { comm })
  return T.op(C.LM_OP_DIST_GRAD_REDUCE, { full }, nil, nil, { comm })
end

-- attention of this rank's queries (B, H, Tl, D) over every rank's keys and
-- values; causal with the load-balanced layout when is_causal. group:
-- {comm, size, rank} of the cp dim (context_parallel makes it).
function M.attention(q, k, v, opts, group)
  opts = opts or {}
  if opts.attn_mask ~= nil then
    error("context_parallel: scaled_dot_product_attention with an attn_mask is not supported under context "
          .. "parallelism (is_causal or no mask)", 3)
  end
  if opts.window and M.rotate_method == "alltoall" then
    error("context_parallel: a sliding window (Mistral's) runs with the \"allgather\" rotate method, not "
          .. "\"alltoall\" (--cp-rotate allgather)", 3)
  end
  if M.rotate_method == "alltoall" then
    return require("loom.distributed.context_parallel_ring").attention(q, k, v, opts, group)
  end
  local comm, cp, rank = group.comm, group.size, group.rank
  local kf, vf = gather_seq(k, comm, k:dim() - 2), gather_seq(v, comm, v:dim() - 2)
  local sdpa = M._sdpa or loom.F.scaled_dot_product_attention
  if not opts.is_causal then return sdpa(q, kf, vf, { scale = opts.scale }) end
  local n = kf:size(kf:dim() - 1)
  check_len("context_parallel", n, cp)
  return sdpa(q, kf, vf, { attn_mask = causal_mask(n, cp, rank, opts.window, q.device), scale = opts.scale })
end

-- set_rotate_method("allgather" | "alltoall"): how keys and values reach
-- every rank, PyTorch's names: "allgather" (the default) gathers them all;
-- "alltoall" passes them around a ring by p2p, skipping the score blocks
-- causality leaves empty (context_parallel_ring.lua)
M.rotate_method = "allgather"
function M.set_rotate_method(m)
  if m ~= "allgather" and m ~= "alltoall" then
    error("set_rotate_method: expected \"allgather\" or \"alltoall\", got " .. describe(m), 2)
  end
  M.rotate_method = m
end

local function group_of(fname, mesh)
  local dist = require("loom.distributed")
  if not dist.is_mesh(mesh) or mesh.ndim ~= 1 then
    error(fname .. ": mesh expected a 1-D DeviceMesh (the cp dim, e.g. mesh[\"cp\"]), got " .. describe(mesh), 3)
  end
  local g = mesh:get_group(1)
  return { group = g, comm = g.comm, size = mesh:size(), rank = mesh:get_local_rank(1) }
end

-- context_parallel(mesh, {buffers, buffer_seq_dims}, fn): runs fn with the
-- buffers sharded on the sequence and scaled_dot_product_attention
-- context-parallel over mesh; returns fn's results. Buffers are restored.
-- (the rotate method each group agreed on, by group: checked once)
local agreed = setmetatable({}, { __mode = "k" })

function M.context_parallel(mesh, opts, fn)
  local fname = "context_parallel"
  local g = group_of(fname, mesh)
  if agreed[mesh] ~= M.rotate_method then   -- one method on every rank (else their exchanges pair wrongly)
    require("loom.distributed").agree("context_parallel's rotate methods", M.rotate_method, mesh)
    agreed[mesh] = M.rotate_method
  end
  if type(opts) ~= "table" or type(opts.buffers) ~= "table" or type(opts.buffer_seq_dims) ~= "table"
     or #opts.buffers ~= #opts.buffer_seq_dims then
    error(fname .. ": expected {buffers = {...}, buffer_seq_dims = {...}} of the same length, got " .. describe(opts), 2)
  end
  if type(fn) ~= "function" then error(fname .. ": fn expected a function, got " .. describe(fn), 2) end
  local n
  for i, b in ipairs(opts.buffers) do
    if T.is_tensor(b) then n = n or b:size(opts.buffer_seq_dims[i]) end
  end
  if not n then error(fname .. ": buffers must hold at least one tensor (the input) to give the sequence length", 2) end
  local args, swapped = {}, {}
  for i, b in ipairs(opts.buffers) do
    local d = opts.buffer_seq_dims[i]
    if T.is_tensor(b) then
      args[#args + 1] = M.shard_seq(b, d, g.size, g.rank)
    elseif type(b) == "table" and type(b[2]) == "string" and T.is_tensor(b[1][b[2]]) then
      local old = b[1][b[2]]
      swapped[#swapped + 1] = { b[1], b[2], old }
      b[1][b[2]] = M.shard_seq(old:narrow(d, 1, n), d, g.size, g.rank)
    else
      error(string.format("%s: buffers[%d] expected a tensor or {module, \"name\"}, got %s", fname, i, describe(b)), 2)
    end
  end
  local F = loom.F
  local sdpa = F.scaled_dot_product_attention
  M._sdpa = sdpa
  F.scaled_dot_product_attention = function(q, k, v, o) return M.attention(q, k, v, o, g) end
  local res = { pcall(fn, unpack(args)) }
  F.scaled_dot_product_attention, M._sdpa = sdpa, nil
  for i = #swapped, 1, -1 do local s = swapped[i] s[1][s[2]] = s[3] end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

return M
