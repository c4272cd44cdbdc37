-- loss.lua: loss_parallel: cross_entropy on logits sharded on the class dim
-- without gathering them (Megatron's vocab-parallel cross entropy). Forward
-- all-reduces the row max, the sum of exponentials and the target logit
-- (and, with label smoothing, the logit sum); backward needs none. The
-- target logit and weight are gathered (the embedding op on the elements),
-- not picked with a one-hot product: a pass over N values, not four over
-- the (N, C/k) shard. (The fused cross_entropy kernels do not fit here:
-- their gradient takes the row's own lse, class count and target, where
-- this one needs the global ones and rows whose target is on another rank.)
local loom = require("loom")
local T = require("loom.tensor")
local dt = require("loom.distributed.dtensor")
local F = require("loom.functional")
local C = loom.C

local M = {}
local SUM, MAX = 0, 2

-- Every rank holds all the ids: each checks them against the whole
-- vocabulary (as F.cross_entropy does at TP=1), so all raise alike and no
-- rank waits in a collective. The C check F.cross_entropy uses: on a GPU it
-- runs there, raising at the next wait for the device, not a wait per step.
local function check_ids(fname, ids, ignore, ncls)
  if C.lm_check_ids_in(fname, "target", ids, ncls, 1, ignore) < 0 then T.c_error(3) end
end

-- t[n, col[n]] where the target is here (heref 1), else 0; t (N, C_local)
-- or (1, C_local). (A function of the module, not a closure over the
-- logits, which a compiled trace would keep: docs/architecture.md.)
local function pick(t, col, heref, nloc)
  if nloc == 0 then return heref * 0 end
  local n = col:numel()
  local at = t:size(1) == 1 and col + 1 or loom.arange(0, n, 1, { dtype = "i64", device = col.device }) * nloc + col + 1
  return F.embedding(at, t:reshape(-1, 1)):reshape(-1) * heref
end

local function vocab_parallel_cross_entropy(logits, target, opts)
  local fname = "cross_entropy (loss_parallel)"
  local mesh = logits.device_mesh
  local nd = logits:dim()
  if mesh.ndim ~= 1 or not logits.placements[1]:is_shard(nd) then
    error(fname .. ": expected logits sharded on the class dim (Shard(-1)) of a 1-D mesh, got "
          .. tostring(logits.placements[1]), 3)
  end
  if dt.is_dtensor(target) then target = target:full_tensor() end
  if target.dtype ~= "i64" and target.dtype ~= "i32" then
    error(fname .. ": loss_parallel expects class ids as targets (i64), got " .. target.dtype, 3)
  end
  opts = T.check_opts(fname, opts, { weight = true, ignore_index = true, reduction = true, label_smoothing = true }, 3)
  local reduction = opts.reduction or "mean"
  if reduction ~= "mean" and reduction ~= "sum" and reduction ~= "none" then
    T.argerror(fname, "reduction", "\"none\", \"mean\" or \"sum\"", T.describe(reduction), 3)
  end
  local eps, ignore = opts.label_smoothing or 0, opts.ignore_index or -100
  if type(eps) ~= "number" or not (eps >= 0 and eps <= 1) then
    T.argerror(fname, "label_smoothing", "a number in [0, 1]", T.describe(eps), 3)
  end
  if not T.is_int(ignore) or math.abs(ignore) >= 2 ^ 53 then
    T.argerror(fname, "ignore_index", "an integer", T.describe(ignore), 3)
  end
  local ncls = logits:size(nd)
  local comm = mesh:get_group(1).comm
  local function all_reduce(x, op) return T.op(C.LM_OP_DIST_ALL_REDUCE, { x }, { op }, nil, { comm }) end
  local k, r = mesh:size(1), mesh:get_local_rank(1)
  local offset, nloc = tonumber(C.lm_chunk_offset(ncls, k, r)), tonumber(C.lm_chunk_size(ncls, k, r))

  local lead = logits:size()
  table.remove(lead)
  local l = logits:to_local():reshape(-1, nloc)              -- (N, C_local)
  -- losses run in f32 under autocast, as F.cross_entropy does: a bf16
  -- log-sum-exp and loss would be off by up to 2^-9 of the loss
  if (l.dtype == "bf16" or l.dtype == "f16") and C.lm_autocast_dtype() >= 0 then l = l:to("f32") end
  local ids = target:reshape(-1):to("i64")
  if ids:numel() ~= l:size(1) then
    error(string.format("%s: %d targets for %d rows of logits", fname, ids:numel(), l:size(1)), 3)
  end
  local valid = ids:ne(ignore)
  check_ids(fname, ids, ignore, ncls)
  -- rows whose target class is on this shard, and its column here (0 elsewhere)
  local here = ids:gt(offset):logical_and(ids:le(offset + nloc))
  local col = (ids - (offset + 1)):masked_fill(here:logical_not(), 0)
  local heref = here:to(l.dtype)
  local z
  do -- shift by the global row max (detached: the loss does not depend on it)
    local lm = nloc > 0 and l:detach():max(2, true) or loom.full({ l:size(1), 1 }, -math.huge, { dtype = l.dtype })
    z = l - all_reduce(lm, MAX)
  end
  local lse = all_reduce(z:exp():sum(2, true), SUM):log():reshape(-1)          -- (N)
  local picked = all_reduce(pick(z, col, heref, nloc), SUM)                    -- (N)
  local w_local, w_target = nil, nil
  if opts.weight ~= nil then
    local w = dt.is_dtensor(opts.weight) and opts.weight:full_tensor() or opts.weight
    w_local = w:narrow(1, offset + 1, nloc):to(z.dtype):view(1, nloc)
    w_target = all_reduce(pick(w_local:detach(), col, heref, nloc), SUM)
  end
  local vf = valid:to(z.dtype)
  local nll = (lse - picked) * (w_target or 1) * vf
  local loss = nll
  if eps > 0 then -- sum_c w_c (lse - z_c) = lse * sum(w) - sum_c w_c z_c
    local wz = all_reduce((w_local and z * w_local or z):sum(2), SUM)
    local wsum = w_local and all_reduce(w_local:detach():sum(), SUM) or ncls
    local smooth = (lse * wsum - wz) * vf
    loss = nll * (1 - eps) + smooth * (eps / ncls)
  end
  if reduction == "none" then return loss:reshape(lead) end
  local total = loss:sum()
  if reduction == "sum" then return total end
  local denom = w_target and (w_target * vf):sum() or vf:sum()
  return total / denom
end

-- loss_parallel(fn, ...): runs fn with F.cross_entropy taking logits that
-- are DTensors sharded on the class dim. Plain logits behave as usual.
function M.loss_parallel(fn, ...)
  if type(fn) ~= "function" then T.argerror("loss_parallel", "fn", "a function", T.describe(fn)) end
  local old = F.parallel_cross_entropy
  F.parallel_cross_entropy = vocab_parallel_cross_entropy
  local res = T.pack(pcall(fn, ...))
  F.parallel_cross_entropy = old
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

return M
