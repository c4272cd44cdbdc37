-- context_parallel_ring.lua: ring attention for context_parallel (PyTorch's
-- rotate method "alltoall"): each rank's keys and values travel around the
-- cp ranks by p2p, one neighbour to the next, while the score blocks of
-- the block already there are computed. With the load-balanced layout
-- (rank i holds chunks i and 2cp-1-i) a query chunk needs only the key
-- chunks at or before it: blocks wholly in the future are skipped, so
-- every rank computes 2cp+1 of the 4cp chunk pairs (the all-gather method
-- computes and masks all of them), and keeps that many score blocks for
-- backward.
--
-- Gradients: keys and values enter the graph as a full-length tensor that
-- is zero but for this rank's rows (the received blocks are added to it as
-- constants), summed over cp in backward: each rank's rows of the sum are
-- its keys' and values' gradient (one all-reduce each, not overlapped).
local loom = require("loom")
local dist = require("loom.distributed")
local T = require("loom.tensor")
local C = loom.C

local M = {}
local TAG = 30100

-- zeros but x's rows at block `me` of cp along dim 3, its gradient summed over cp
local function padded(x, cp, me, comm)
  local parts = {}
  for r = 0, cp - 1 do parts[r + 1] = r == me and x or loom.zeros(x:size(), { dtype = x.dtype, device = x.device }) end
  return T.op(C.LM_OP_DIST_GRAD_REDUCE, { loom.cat(parts, 3) }, nil, nil, { comm })
end

local mask_cache = {}
local function diag_mask(c, device)   -- true above the diagonal: keys after the query
  local key = c .. ":" .. device
  if not mask_cache[key] then mask_cache[key] = loom.ones(c, c, { device = device }):triu(1):to("bool") end
  return mask_cache[key]
end

-- q, k, v: (B, H, 2c, D), this rank's two chunks; g = {group, comm, size, rank}
function M.attention(q, k, v, opts, g)
  local cp, me = g.size, g.rank
  local Tl, D = q:size(3), q:size(4)
  local c = Tl / 2
  local scale = opts.scale or 1 / math.sqrt(D)
  local causal = opts.is_causal
  local grad = loom.is_grad_enabled() and (k.requires_grad or v.requires_grad)
  local kp = grad and padded(k, cp, me, g.comm)
  local vp = grad and padded(v, cp, me, g.comm)
  local qi = { me, 2 * cp - 1 - me }   -- chunk numbers of the query chunks
  local qs = { q:narrow(3, 1, c), q:narrow(3, c + 1, c) }
  local scores, values = { {}, {} }, { {}, {} }
  local kb, vb = k:detach():contiguous(), v:detach():contiguous()
  local nxt, prv = (me + 1) % cp, (me - 1) % cp
  for s = 0, cp - 1 do
    local src = (me - s) % cp
    local rk, rv, sk, sv
    if s < cp - 1 then   -- the next block comes while this one computes
      local on = { dtype = kb.dtype, device = kb.device }   -- (a cuda mesh's blocks land on the device)
      rk = dist.irecv(loom.empty(kb:size(), on), prv, g.group, nil, { tag = TAG })
      rv = dist.irecv(loom.empty(vb:size(), on), prv, g.group, nil, { tag = TAG + 1 })
      sk = dist.isend(kb, nxt, g.group, nil, { tag = TAG })
      sv = dist.isend(vb, nxt, g.group, nil, { tag = TAG + 1 })
    end
    local ku, vu = kb, vb
    if grad then
      ku = src == me and kp:narrow(3, src * Tl + 1, Tl) or kp:narrow(3, src * Tl + 1, Tl) + kb
      vu = src == me and vp:narrow(3, src * Tl + 1, Tl) or vp:narrow(3, src * Tl + 1, Tl) + vb
    elseif src == me then
      ku, vu = k, v
    end
    local ki = { src, 2 * cp - 1 - src }
    for a = 1, 2 do
      for b = 1, 2 do
        if not causal or ki[b] <= qi[a] then
          local sblk = qs[a]:matmul(ku:narrow(3, (b - 1) * c + 1, c):transpose(3, 4)) * scale
          if causal and ki[b] == qi[a] then sblk = sblk:masked_fill(diag_mask(c, sblk.device), -math.huge) end
          local l = scores[a]
          l[#l + 1] = sblk
          values[a][#l] = vu:narrow(3, (b - 1) * c + 1, c)
        end
      end
    end
    if s < cp - 1 then
      kb, vb = rk:wait(), rv:wait()
      sk:wait()
      sv:wait()
    end
  end
  local out = {}
  for a = 1, 2 do
    local p = loom.cat(scores[a], 4):softmax(4)
    out[a] = p:matmul(loom.cat(values[a], 3))
  end
  return loom.cat(out, 3)
end

return M
