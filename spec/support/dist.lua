-- dist.lua: shared by the multi-rank specs (`local H = require
-- "support.dist"`). Two kinds of ground truth, never computed by the code
-- under test: rank-determined inputs with plain-Lua references (the
-- collectives), and full plain tensors drawn on every rank from the same
-- seed, with shards cut from them by plain-Lua torch.chunk math (DTensor).
local loom = require("loom")
local dist = require("loom.distributed")

local H = {}
H.ws, H.rank = dist.world_size(), dist.rank()

---------------------------------------------------------------------------
-- a scratch directory every rank shares

-- on0(fn): fn on rank 0 alone while the others wait: no rank still reads
-- what fn changes, and afterwards every rank sees what it did
function H.on0(fn)
  dist.barrier(dist.world_group())
  if H.rank == 0 then fn() end
  dist.barrier(dist.world_group())
end

-- scratch_dir(name): /tmp/loom-NAME-WS-PID, the same on every rank (PID is
-- rank 0's), made fresh and empty by rank 0 (collective; the spec removes
-- it in its teardown, with on0)
function H.scratch_dir(name)
  require("loom.posix")   -- loom_getpid
  local t = loom.tensor({ tonumber(require("ffi").C.loom_getpid()) }, { dtype = "i64" })
  local dir = string.format("/tmp/loom-%s-%d-%d", name, H.ws, dist.broadcast(t, 0, dist.world_group()):item())
  H.on0(function() os.execute("rm -rf '" .. dir .. "'; mkdir -p '" .. dir .. "'") end)
  return dir
end

---------------------------------------------------------------------------
-- torch.chunk, meshes and shards

-- torch.chunk: size and offset (0-based) of chunk q (0-based) of n in k
function H.chunk(n, k, q)
  local c = math.ceil(n / k)
  return math.max(0, math.min(c, n - q * c)), math.min(q * c, n)
end

-- chunk q of k (torch.chunk) along dim d of a plain tensor
function H.chunk_of(t, d, k, q)
  local len, off = H.chunk(t:size(d), k, q)
  return t:narrow(d, off + 1, len):contiguous()
end

local function mesh_2d(h)
  return dist.init_device_mesh("cpu", { 2, h }, { mesh_dim_names = { "dp", "tp" } })
end

-- meshes every DTensor spec runs on: the 1-D world mesh, and on 4 ranks a 2x2 mesh
function H.meshes()
  local out = { { name = "1-D mesh of " .. H.ws, mesh = dist.init_device_mesh("cpu", { H.ws }) } }
  if H.ws == 4 then out[2] = { name = "2x2 mesh", mesh = mesh_2d(2) } end
  return out
end

-- The groups of a world of k ranks: {name, mesh, dim, members (world ranks
-- in group order), index of this rank} for the 1-D world mesh and, when k
-- is even and > 2, each dim of a {2, k/2} mesh (row-major: rank = a*(k/2)+b).
function H.groups()
  local k, me = H.ws, H.rank
  local all = {}
  for q = 0, k - 1 do all[q + 1] = q end
  local out = { { name = "1-D mesh of " .. k, mesh = H.meshes()[1].mesh, dim = 1, members = all, index = me } }
  if k % 2 == 0 and k > 2 then
    local h = k / 2
    local m2 = mesh_2d(h)
    local a, b = math.floor(me / h), me % h
    local dp, tp = {}, {}
    for x = 0, 1 do dp[x + 1] = x * h + b end
    for y = 0, h - 1 do tp[y + 1] = a * h + y end
    out[2] = { name = "2x" .. h .. " mesh along dp", mesh = m2, dim = "dp", members = dp, index = a }
    out[3] = { name = "2x" .. h .. " mesh along tp", mesh = m2, dim = 2, members = tp, index = b }
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
    if p:is_shard() then x = H.chunk_of(x, norm_dim(p, full:dim()), mesh.shape[k], coord[k]) end
  end
  return x:contiguous()
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

---------------------------------------------------------------------------
-- rank-determined inputs (the collectives)

H.dtypes = { "f32", "f64", "bf16", "f16", "i32", "i64" }

-- element [i][j] (0-based) of world rank q's input: small integers, so every
-- dtype holds them and their sums over 4 ranks exactly (bf16: up to 256)
function H.val(q, i, j) return (q + 1) * 3 + i * 4 + j end

-- a (n0 x n1) table from f(i, j), 0-based
function H.table(n0, n1, f)
  local t = {}
  for i = 1, n0 do
    t[i] = {}
    for j = 1, n1 do t[i][j] = f(i - 1, j - 1) end
  end
  return t
end

-- world rank q's (n0 x n1) input of dtype, from f (H.val by default)
function H.input(q, n0, n1, dtype, f)
  f = f or H.val
  if n0 == 0 or n1 == 0 then return loom.zeros({ n0, n1 }, { dtype = dtype }) end
  return loom.tensor(H.table(n0, n1, function(i, j) return f(q, i, j) end), { dtype = dtype })
end

-- a nested table rounded once to dtype (through a tensor; no collective involved)
function H.round(t, dtype)
  if #t == 0 or #t[1] == 0 then return t end
  return loom.tensor(t, { dtype = "f64" }):to(dtype):totable()
end

-- Mismatches between got (a tensor) and want (nested table) as a list of
-- strings, so a spec asserts after all its collectives ran on every rank.
function H.diff(got, want, what, out)
  out = out or {}
  local g = got:totable()
  local gs, ws = got:size(), { #want, want[1] and #want[1] or 0 }
  if gs[1] ~= ws[1] or (ws[1] > 0 and (gs[2] or 0) ~= ws[2]) then
    out[#out + 1] = string.format("%s: shape {%s}, want {%d, %d}", what, table.concat(gs, ", "),
                                  ws[1], ws[2])
    return out
  end
  for i = 1, #want do
    for j = 1, #want[i] do
      if g[i][j] ~= want[i][j] then
        out[#out + 1] = string.format("%s: [%d][%d] = %s, want %s", what, i, j, tostring(g[i][j]),
                                      tostring(want[i][j]))
        if #out > 5 then return out end
      end
    end
  end
  return out
end

---------------------------------------------------------------------------
-- full references (DTensor): every check appends to a list `bad` of
-- mismatches, so a spec asserts only after every rank ran its collectives

-- fresh random full tensors, the same on every rank
function H.randn(seed, ...)
  loom.manual_seed(seed)
  return loom.randn(...)
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

-- fn's error message, or nil when it ran without one
function H.err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  return not ok and tostring(e) or nil
end

-- whether msg is a string holding every one of the plain strings ...
function H.has(msg, ...)
  if type(msg) ~= "string" then return false end
  for _, s in ipairs { ... } do if not msg:find(s, 1, true) then return false end end
  return true
end

function H.sizes(t) return "{" .. table.concat(t:size(), ", ") .. "}" end

-- plain tensor got against plain tensor want, within tol (absolute)
function H.check(bad, what, got, want, tol)
  tol = tol or 0
  if got == nil then bad[#bad + 1] = what .. ": got nil" return bad end
  if dist.is_dtensor(got) then bad[#bad + 1] = what .. ": got a DTensor, want a plain tensor" return bad end
  local d = H.maxdiff(got, want)
  if not (d <= tol) then
    bad[#bad + 1] = string.format("%s: size %s vs %s, max |diff| %g > %g", what, H.sizes(got), H.sizes(want), d, tol)
  end
  return bad
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
    bad[#bad + 1] = string.format("%s: global size {%s}, want %s", what, table.concat(gs, ", "), H.sizes(full))
  end
  local partial = false
  for _, p in ipairs(pl) do partial = partial or p:is_partial() end
  if not partial then H.check(bad, what .. " (local shard)", d:to_local(), H.slice(full, d.device_mesh, pl), tol) end
  H.check(bad, what .. " (full_tensor)", d:full_tensor(), full, tol)
  return bad
end

-- the collective counts of a comm_mode cm against want (kind -> count):
-- the kinds want names, or with every_kind each kind (0 where unnamed)
function H.check_counts(bad, what, cm, want, every_kind)
  local kinds = {}
  if every_kind then kinds = dist.collective_kinds else for kind in pairs(want) do kinds[#kinds + 1] = kind end end
  for _, kind in ipairs(kinds) do
    local n = want[kind] or 0
    if cm.counts[kind] ~= n then
      bad[#bad + 1] = string.format("%s: %s %s, want %d (%s)", what, tostring(cm.counts[kind]), kind, n, tostring(cm))
    end
  end
  return bad
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

-- the inputs of op_case: full references (leaves requiring grad where
-- asked) and the DTensors (or plain tensors) made from them
local function op_inputs(mesh, args, nograd)
  local fl, dl, leaves = {}, {}, {}
  for i, a in ipairs(args) do
    local g = a.grad ~= false and not nograd and a.full.dtype:match("^f")
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
  return fl, dl, leaves
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
  local fl, dl, leaves = op_inputs(mesh, args, opts.nograd)
  local want = f(unpack(fl))
  local cm, got = dist.comm_mode(f, unpack(dl))
  H.check_dt(bad, what, got, want:detach(), tol, opts.out_pl)
  if opts.comm then H.check_counts(bad, what, cm, opts.comm) end
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
