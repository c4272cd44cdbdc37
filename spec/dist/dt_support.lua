-- dt_support.lua: shared by the DTensor specs. The ground truth is always
-- the same computation on full (unsharded) plain tensors, drawn on every
-- rank from the same seed; shards are cut from it with plain-Lua
-- torch.chunk math (never with the DTensor code under test).
local loom = require "loom"
local dist = require "loom.distributed"

local H = {}
H.ws, H.rank = dist.world_size(), dist.rank()

-- torch.chunk: size and offset (0-based) of chunk q (0-based) of n in k
function H.chunk(n, k, q)
  local c = math.ceil(n / k)
  return math.max(0, math.min(c, n - q * c)), math.min(q * c, n)
end

-- meshes every spec runs on: the 1-D world mesh, and on 4 ranks a 2x2 mesh
function H.meshes()
  local out = { { name = "1-D mesh of " .. H.ws, mesh = dist.init_device_mesh("cpu", { H.ws }) } }
  if H.ws == 4 then
    out[2] = { name = "2x2 mesh", mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "dp", "tp" } }) }
  end
  return out
end

-- a placement with a Shard dim normalised against nd dims (1-based)
local function norm_dim(p, nd) return p.dim < 0 and nd + p.dim + 1 or p.dim end

-- this rank's shard of a full plain tensor under placements (Shard only
-- cuts; Replicate and Partial keep the whole), nested shards in mesh order
function H.slice(full, mesh, placements)
  local coord, x = mesh:get_coordinate(), full
  for k, p in ipairs(placements) do
    if p:is_shard() then
      local d = norm_dim(p, full:dim())
      local n, o = H.chunk(x:size(d), mesh.shape[k], coord[k])
      x = x:narrow(d, o + 1, n)
    end
  end
  return x:contiguous()
end

-- largest |a - b| (math.huge when the sizes differ)
function H.maxdiff(a, b)
  local sa, sb = a:size(), b:size()
  if #sa ~= #sb then return math.huge end
  for i = 1, #sa do if sa[i] ~= sb[i] then return math.huge end end
  if a:numel() == 0 then return 0 end
  if a:dim() == 0 then return math.abs(a:to("f64"):item() - b:to("f64"):item()) end
  return (a:to("f64") - b:to("f64")):abs():max():item()
end

local function sizes(t) return "{" .. table.concat(t:size(), ", ") .. "}" end

-- plain tensor got against plain tensor want, within tol (absolute)
function H.check(bad, what, got, want, tol)
  tol = tol or 0
  if got == nil then bad[#bad + 1] = what .. ": got nil" return bad end
  if dist.is_dtensor(got) then bad[#bad + 1] = what .. ": got a DTensor, want a plain tensor" return bad end
  local d = H.maxdiff(got, want)
  if not (d <= tol) then
    bad[#bad + 1] = string.format("%s: size %s vs %s, max |diff| %g > %g", what, sizes(got), sizes(want), d, tol)
  end
  return bad
end

function H.pl_string(pl)
  local t = {}
  for i, p in ipairs(pl) do t[i] = tostring(p) end
  return "(" .. table.concat(t, ", ") .. ")"
end

function H.same_pl(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if not (a[i] == b[i]) then return false end end
  return true
end

-- DTensor d against the full reference: placements (when want_pl is given),
-- global size, the local shard (cut from the reference when no Partial),
-- and full_tensor(). Collective: every rank must call it alike.
function H.check_dt(bad, what, d, full, tol, want_pl)
  tol = tol or 0
  if not dist.is_dtensor(d) then bad[#bad + 1] = what .. ": not a DTensor" return bad end
  local pl = d.placements
  if want_pl and not H.same_pl(pl, want_pl) then
    bad[#bad + 1] = string.format("%s: placements %s, want %s", what, H.pl_string(pl), H.pl_string(want_pl))
  end
  local gs, fs = d:size(), full:size()
  if table.concat(gs, ",") ~= table.concat(fs, ",") then
    bad[#bad + 1] = string.format("%s: global size {%s}, want %s", what, table.concat(gs, ", "), sizes(full))
  end
  local partial = false
  for _, p in ipairs(pl) do partial = partial or p:is_partial() end
  if not partial then H.check(bad, what .. " (local shard)", d:to_local(), H.slice(full, d.device_mesh, pl), tol) end
  H.check(bad, what .. " (full_tensor)", d:full_tensor(), full, tol)
  return bad
end

-- a list of placements from a compact string per mesh dim: "R", "P", "S1", "S-1"
function H.pl(spec)
  local out = {}
  for w in spec:gmatch("%S+") do
    if w == "R" then out[#out + 1] = dist.Replicate()
    elseif w == "P" then out[#out + 1] = dist.Partial()
    else out[#out + 1] = dist.Shard(tonumber(w:sub(2))) end
  end
  return out
end

-- fresh random full tensors, the same on every rank
function H.randn(seed, ...)
  loom.manual_seed(seed)
  return loom.randn(...)
end

-- A DTensor with placements pl (Partials among them) whose terms are
-- random but sum to zero: each Partial mesh dim k adds N_k * (c_k - mean).
function H.zero_terms(mesh, pl, size)
  local coord, z = mesh:get_coordinate(), loom.zeros(size)
  for k, p in ipairs(pl) do
    if p:is_partial() then z = z + H.randn(900 + k, size) * (coord[k] - (mesh.shape[k] - 1) / 2) end
  end
  return dist.DTensor.from_local(H.slice(z, mesh, pl), mesh, pl, { shape = size })
end

-- Runs f on full plain tensors and on DTensors made from them, and checks
-- the output and the gradient of every input against the full ones.
-- args[i] = {full = tensor, pl = placements (nil: passed as is),
--            grad = false to skip its gradient}
-- opts: tol, out_pl (expected output placements), comm (a table of
-- expected collective counts of f's forward on DTensors), nograd
function H.op_case(bad, what, mesh, f, args, opts)
  opts = opts or {}
  local tol = opts.tol or 1e-4
  -- full reference
  local fl, dl, leaves = {}, {}, {}
  for i, a in ipairs(args) do
    local g = a.grad ~= false and not opts.nograd and a.full.dtype:match("^f")
    fl[i] = a.full:clone()
    if g then fl[i]:requires_grad_(true) end
    if a.pl then
      local rpl, partial = {}, false
      for k, p in ipairs(a.pl) do
        rpl[k] = p:is_partial() and dist.Replicate() or p
        partial = partial or p:is_partial()
      end
      -- a Partial argument: a leaf with Replicate there, moved to Partial
      -- and made non-degenerate by adding terms that sum to zero
      leaves[i] = dist.distribute_tensor(a.full:clone(), mesh, rpl)
      if g then leaves[i]:requires_grad_(true) end
      dl[i] = partial and leaves[i]:redistribute(mesh, a.pl) + H.zero_terms(mesh, a.pl, a.full:size()) or leaves[i]
    else
      dl[i] = a.full:clone()
    end
  end
  local want = f(unpack(fl))
  local cm, got = dist.comm_mode(f, unpack(dl))
  H.check_dt(bad, what, got, want:detach(), tol, opts.out_pl)
  if opts.comm then
    for kind, n in pairs(opts.comm) do
      if cm.counts[kind] ~= n then
        bad[#bad + 1] = string.format("%s: %d %s, want %d (%s)", what, cm.counts[kind], kind, n, tostring(cm))
      end
    end
  end
  if opts.nograd or not want.dtype:match("^f") then return bad end
  local w = H.randn(4242, want:size())
  if want:dim() == 0 then w = loom.tensor(0.75) end
  ;(want * w):sum():backward()
  ;(got:full_tensor() * w):sum():backward()
  for i, a in ipairs(args) do
    if fl[i].requires_grad then
      local g, ref = (leaves[i] or dl[i]).grad, fl[i].grad
      if ref == nil then ref = loom.zeros(a.full:size()) end
      if g == nil then
        bad[#bad + 1] = string.format("%s: argument #%d has no gradient", what, i)
      elseif a.pl then
        H.check_dt(bad, string.format("%s: grad of #%d", what, i), g, ref, opts.gtol or tol, leaves[i].placements)
      else
        H.check(bad, string.format("%s: grad of #%d", what, i), g, ref, opts.gtol or tol)
      end
    end
  end
  return bad
end

return H
