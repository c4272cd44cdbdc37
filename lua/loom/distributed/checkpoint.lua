-- checkpoint.lua: distributed checkpoints (dist.checkpoint): every rank
-- writes the shards it owns, rank 0 writes a manifest, and load reshards
-- onto whatever mesh and placements the given state_dict has.
--
-- A checkpoint is a directory:
--   manifest.loom       loom.save format: {format = "loom-dcp", version = 1,
--                       world_size, files = {[r+1] = {name, size, checksum}},
--                       tensors = {{path = {keys...}, name, shape, dtype,
--                       placements = {"Shard(dim=1)", ...}, mesh_shape,
--                       shards = {{file (1-based index into files),
--                       byte_offset, nbytes, checksum, offset (0-based
--                       global offset per dim), size}}}},
--                       values = the state_dict with its tensors left out}
--   rankNNNNN.shards    one per rank: the raw bytes of the shards it wrote,
--                       contiguous, in the order of `tensors` (no header)
-- Checksums are FNV-1a (lm_fnv1a), one per shard and one per file.
--
-- Who writes what: every rank offers the block of each tensor it holds
-- (a DTensor's local shard, the whole of a plain tensor); of the ranks
-- offering the same block, the lowest world rank writes it, so replicated
-- data (Replicate dims, meshes that are a slice of the world, plain
-- tensors) is written once. Partial DTensors are reduced first (a
-- redistribute to Replicate on their Partial dims, a collective).
--
-- save and load are collective over the world: every rank calls them with
-- state_dicts holding the same paths (SPMD), and an error on any rank is
-- raised on every rank (the failing rank's message), so none is left
-- waiting in a collective. The directory must be visible to every rank
-- (a shared filesystem on several machines).
--
-- Atomicity: everything is written into DIR.tmp-ckpt; only when every rank
-- has finished does rank 0 move a previous DIR to DIR.old, DIR.tmp-ckpt to
-- DIR, and remove DIR.old. A crash before that leaves the previous DIR
-- intact; a crash between the two renames leaves it in DIR.old.
local ffi = require "ffi"
local loom = require "loom"
local T = require "loom.tensor"
local serialize = require "loom.serialize"
local fs = require "loom.fs"
local C = loom.C
local libc = ffi.C   -- fopen/fwrite/fsync as declared by loom.serialize

local M = {}

M.MANIFEST = "manifest.loom"
local FORMAT, VERSION = "loom-dcp", 1
local MAXD = 8           -- dims of a tensor (lm's limit)
local W = 3 + 3 * MAXD   -- i64 words per tensor in the exchanged metadata
local MSGLEN = 1000      -- bytes of an error message passed between ranks

-- A hook for tests: called on every rank with a stage name ("write", after
-- the directory is made and before any shard is written; "rename", after
-- every file is complete and before the rename). An error it raises
-- aborts the save on every rank at that point, as a crash would.
M._hook = nil

local function dist() return require "loom.distributed" end
local function is_dtensor(x) return T.is_tensor(x) and x.dist ~= nil end

local exists, file_exists = fs.exists, fs.is_file
local function rm_rf(p)
  local ok, err = pcall(fs.rm_rf, p)
  if not ok then error("checkpoint.save: " .. tostring(err), 0) end
end
local function shard_file(r) return string.format("rank%05d.shards", r) end

---------------------------------------------------------------------------
-- paths in a nested table

local function key_less(a, b)
  if type(a) == type(b) then return a < b end
  return type(a) == "number"
end

-- "model.layers.1.wq.weight", "optim.state[3].exp_avg"
local function path_name(keys)
  local s = ""
  for i, k in ipairs(keys) do
    if type(k) == "number" then s = s .. "[" .. string.format("%.17g", k) .. "]"
    else s = s .. (i > 1 and "." or "") .. k end
  end
  return s
end
-- a string that tells ["1"] from [1]
local function path_key(keys)
  local parts = {}
  for i, k in ipairs(keys) do
    parts[i] = type(k) == "number" and "#" .. string.format("%.17g", k) or "$" .. k
  end
  return table.concat(parts, "\0")
end

local function is_value(v)
  local t = type(v)
  return t == "number" or t == "string" or t == "boolean"
      or (t == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)))
end

-- tensors (in a deterministic order, keys sorted) and a copy of the table
-- without them
local function flatten(sd, fname)
  local tensors, seen = {}, {}
  local function walk(t, keys)
    if seen[t] then error(fname .. ": " .. (#keys > 0 and path_name(keys) or "state_dict") .. " is a cycle", 0) end
    seen[t] = true
    local ks = {}
    for k in pairs(t) do
      if type(k) ~= "string" and type(k) ~= "number" then
        error(string.format("%s: %s: keys must be strings or numbers, got a %s", fname,
                            #keys > 0 and path_name(keys) or "state_dict", type(k)), 0)
      end
      ks[#ks + 1] = k
    end
    table.sort(ks, key_less)
    local vals = {}
    for _, k in ipairs(ks) do
      local v, p = t[k], {}
      for i, kk in ipairs(keys) do p[i] = kk end
      p[#p + 1] = k
      if T.is_tensor(v) then tensors[#tensors + 1] = { keys = p, name = path_name(p), key = path_key(p), t = v }
      elseif type(v) == "table" then vals[k] = walk(v, p)
      elseif is_value(v) then vals[k] = v
      else error(string.format("%s: %s: cannot checkpoint a %s", fname, path_name(p), type(v)), 0) end
    end
    seen[t] = nil
    return vals
  end
  local values = walk(sd, {})
  return tensors, values
end

---------------------------------------------------------------------------
-- agreement between ranks (collectives over the world)

local function i64s(n) local t = T.zeros({ n }, { dtype = "i64" }) return t, ffi.cast("int64_t*", C.lm_data(t)) end

local function gather_i64(t)
  local g = dist().all_gather(t, 1, dist().world_group())
  return ffi.cast("int64_t*", C.lm_data(g)), g
end

-- every rank passes its error message (or nil); returns the message of the
-- lowest failing rank and that rank, or nil
local function agree(msg)
  local d = dist()
  if d.world_size() == 1 then return msg, msg and 0 or nil end
  local t = T.zeros({ MSGLEN + 1 }, { dtype = "i32" })
  local p = ffi.cast("int32_t*", C.lm_data(t))
  if msg then
    msg = tostring(msg)
    p[0] = 1
    for i = 1, math.min(#msg, MSGLEN) do p[i] = msg:byte(i) end
  end
  local g = d.all_gather(t, 1, d.world_group())
  local q = ffi.cast("int32_t*", C.lm_data(g))
  for r = 0, d.world_size() - 1 do
    local base = r * (MSGLEN + 1)
    if q[base] ~= 0 then
      local b = {}
      for i = 1, MSGLEN do
        local c = q[base + i]
        if c == 0 then break end
        b[i] = string.char(c)
      end
      return table.concat(b), r
    end
  end
  return nil
end

-- runs fn under pcall, then raises on every rank if it failed on any
local function together(fn, ...)
  local ok, err = pcall(fn, ...)
  local msg, r = agree(not ok and tostring(err) or nil)
  if msg then
    if r ~= dist().rank() then msg = msg .. " [on rank " .. r .. "]" end
    error(msg, 0)
  end
  return err
end

---------------------------------------------------------------------------
-- layout of one tensor on this rank

local spec_pl, spec_shape, spec_mesh = ffi.new("lm_placement[4]"), ffi.new("int64_t[8]"), ffi.new("lm_mesh*[1]")

-- global size, this rank's block (0-based offset, size) and local tensor;
-- a DTensor's block is its local shard, a plain tensor's is all of it
local function block_of(x)
  local size = x:size()
  if not is_dtensor(x) then
    local off = {}
    for d = 1, #size do off[d] = 0 end
    return size, off, size, x
  end
  C.lm_dtensor_spec(x, spec_pl, spec_shape, spec_mesh)
  local lshape, off = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
  C.lm_shard_layout(spec_mesh[0], #size, spec_shape, spec_pl, nil, lshape, off)
  local o, s = {}, {}
  for d = 1, #size do o[d], s[d] = tonumber(off[d - 1]), tonumber(lshape[d - 1]) end
  return size, o, s, x:to_local()
end

local function numel(size)
  local n = 1
  for _, s in ipairs(size) do n = n * s end
  return n
end
local function sizes(s) return #s == 0 and "a scalar" or table.concat(s, "x") end

---------------------------------------------------------------------------
-- save

-- writes the local blocks of the tensors this rank owns to path; returns
-- the file's size, its checksum and each tensor's shard checksum
local function write_shards(path, entries, mine)
  local f = libc.fopen(path, "wb")
  if f == nil then error("checkpoint.save: cannot open " .. path .. " for writing", 0) end
  local fsum, size, sums, ok = C.lm_fnv1a("", 0, 0), 0, {}, true
  for i, e in ipairs(entries) do
    if mine[i] then
      local c = e.local_t
      if c.device ~= "cpu" then c = c:to("cpu") end
      c = c:contiguous()
      local n = numel(e.bsize) * C.lm_dtype_size(c.dtype_)
      local p = C.lm_data(c)
      sums[i] = C.lm_fnv1a(p, n, 0)
      fsum = C.lm_fnv1a(p, n, fsum)
      if n > 0 and libc.fwrite(p, 1, n, f) ~= n then ok = false break end
      size = size + n
    end
  end
  ok = ok and libc.fflush(f) == 0 and libc.fsync(libc.fileno(f)) == 0
  if libc.fclose(f) ~= 0 then ok = false end
  if not ok then error("checkpoint.save: writing " .. path .. " failed (disk full?)", 0) end
  return size, fsum, sums
end

local function check_target(dir)
  if exists(dir) and not file_exists(dir .. "/" .. M.MANIFEST) then
    -- an empty directory (mkdir -p DIR before saving) may be replaced
    if os.remove(dir) then return end
    error("checkpoint.save: " .. dir .. " exists and is not a loom checkpoint (no " .. M.MANIFEST
          .. "); refusing to replace it", 0)
  end
end

-- save(state_dict, dir): collective; see the top of the file.
function M.save(state_dict, dir)
  if type(state_dict) ~= "table" then T.argerror("checkpoint.save", "state_dict", "a table", T.describe(state_dict)) end
  if type(dir) ~= "string" or dir == "" then T.argerror("checkpoint.save", "dir", "a directory name", T.describe(dir)) end
  dir = dir:gsub("(.)/+$", "%1")
  local D = dist()
  D.init()
  local rank, world = D.rank(), D.world_size()
  local tmp = dir .. ".tmp-ckpt"

  local entries, values = together(function()
    local ts, vs = flatten(state_dict, "checkpoint.save")
    for _, e in ipairs(ts) do
      if e.t:dim() > MAXD then error("checkpoint.save: " .. e.name .. " has more than 8 dims", 0) end
    end
    return { ts, vs }
  end)
  entries, values = entries[1], entries[2]

  -- metadata of every tensor on every rank
  local cnt, cp = i64s(1)
  cp[0] = #entries
  local counts = gather_i64(cnt)
  for r = 0, world - 1 do
    if counts[r] ~= #entries then
      error(string.format("checkpoint.save: rank %d has %d tensors in its state_dict, rank %d has %d "
                          .. "(every rank must save the same paths)", rank, #entries, r, tonumber(counts[r])), 2)
    end
  end
  local n = #entries
  local rec, rp = i64s(math.max(1, n * W))
  loom.no_grad(function()
    for i, e in ipairs(entries) do
      local x = e.t:detach()
      if is_dtensor(x) then
        local pl, partial = x.placements, false
        for k, p in ipairs(pl) do
          if p:is_partial() then pl[k], partial = D.Replicate(), true end
        end
        if partial then x = x:redistribute(pl) end
        e.placements, e.mesh_shape = {}, {}
        for k, p in ipairs(x.placements) do e.placements[k] = tostring(p) end
        for k, s in ipairs(x.device_mesh.shape) do e.mesh_shape[k] = s end
      else
        e.placements, e.mesh_shape = {}, {}
      end
      e.shape, e.boff, e.bsize, e.local_t = block_of(x)
      e.dtype = x.dtype
      local b = (i - 1) * W
      rp[b] = ffi.cast("int64_t", C.lm_fnv1a(e.key, #e.key, 0))
      rp[b + 1], rp[b + 2] = x.dtype_, #e.shape
      for d = 1, #e.shape do
        rp[b + 2 + d], rp[b + 2 + MAXD + d], rp[b + 2 + 2 * MAXD + d] = e.shape[d], e.boff[d], e.bsize[d]
      end
    end
  end)
  local all = gather_i64(rec)
  local stride = math.max(1, n * W)
  local function at(r, i, w) return all[r * stride + (i - 1) * W + w] end

  -- writers: the lowest rank offering each non-empty block
  local writers, mine = {}, {}
  for i, e in ipairs(entries) do
    writers[i] = {}
    local covered = 0
    for r = 0, world - 1 do
      if at(r, i, 0) ~= at(0, i, 0) or at(r, i, 1) ~= at(0, i, 1) or at(r, i, 2) ~= at(0, i, 2) then
        error(string.format("checkpoint.save: %s differs between ranks (its name, dtype or dims on rank %d "
                            .. "are not those on rank 0)", e.name, r), 2)
      end
      for d = 1, #e.shape do
        if at(r, i, 2 + d) ~= at(0, i, 2 + d) then
          error(string.format("checkpoint.save: %s has another global size on rank %d than on rank 0",
                              e.name, r), 2)
        end
      end
      local nz, dup = true, false
      for d = 1, #e.shape do if at(r, i, 2 + 2 * MAXD + d) == 0 then nz = false end end
      if nz then
        for q = 0, r - 1 do
          local same = true
          for d = 1, #e.shape do
            if at(q, i, 2 + MAXD + d) ~= at(r, i, 2 + MAXD + d) or at(q, i, 2 + 2 * MAXD + d) ~= at(r, i, 2 + 2 * MAXD + d) then
              same = false
              break
            end
          end
          if same then dup = true break end
        end
        if not dup then
          local off, size = {}, {}
          for d = 1, #e.shape do
            off[d], size[d] = tonumber(at(r, i, 2 + MAXD + d)), tonumber(at(r, i, 2 + 2 * MAXD + d))
          end
          writers[i][#writers[i] + 1] = { rank = r, offset = off, size = size }
          covered = covered + numel(size)
          if r == rank then mine[i] = true end
        end
      end
    end
    if covered ~= numel(e.shape) then
      error(string.format("checkpoint.save: the ranks' blocks of %s hold %d elements, not the %d of its "
                          .. "global size %s (overlapping shards?)", e.name, covered, numel(e.shape),
                          sizes(e.shape)), 2)
    end
  end

  -- the temporary directory, made by rank 0
  together(function()
    if rank ~= 0 then return end
    check_target(dir)
    rm_rf(tmp)
    local ok, err = pcall(fs.mkdir_p, tmp)
    if not ok then error("checkpoint.save: " .. tostring(err), 0) end
  end)
  together(function() if M._hook then M._hook("write") end end)

  -- this rank's file
  local res = together(function()
    local s, f, sums = write_shards(tmp .. "/" .. shard_file(rank), entries, mine)
    return { s, f, sums }
  end)
  local out, op = i64s(2 + math.max(1, n))
  op[0], op[1] = res[1], ffi.cast("int64_t", res[2])
  for i = 1, n do op[1 + i] = res[3][i] and ffi.cast("int64_t", res[3][i]) or 0 end
  local done = gather_i64(out)
  local dstride = 2 + math.max(1, n)

  -- the manifest, by rank 0
  together(function()
    if rank ~= 0 then return end
    local files = {}
    for r = 0, world - 1 do
      files[r + 1] = { name = shard_file(r), size = tonumber(done[r * dstride]),
                       checksum = ffi.cast("uint64_t", done[r * dstride + 1]) }
    end
    local cursor, tensors = {}, {}
    for i, e in ipairs(entries) do
      local shards = {}
      for _, w in ipairs(writers[i]) do
        local nbytes = numel(w.size) * C.lm_dtype_size(T.dtype_id(e.dtype, "save"))
        local at0 = cursor[w.rank] or 0
        shards[#shards + 1] = { file = w.rank + 1, byte_offset = at0, nbytes = nbytes, offset = w.offset,
                                size = w.size, checksum = ffi.cast("uint64_t", done[w.rank * dstride + 1 + i]) }
        cursor[w.rank] = at0 + nbytes
      end
      tensors[i] = { path = e.keys, name = e.name, shape = e.shape, dtype = e.dtype, placements = e.placements,
                     mesh_shape = e.mesh_shape, shards = shards }
    end
    for r = 0, world - 1 do
      if (cursor[r] or 0) ~= files[r + 1].size then
        error(string.format("checkpoint.save: %s holds %d bytes, expected %d", shard_file(r), files[r + 1].size,
                            cursor[r] or 0), 0)
      end
    end
    serialize.save({ format = FORMAT, version = VERSION, world_size = world, files = files, tensors = tensors,
                     values = values }, tmp .. "/" .. M.MANIFEST)
  end)
  together(function() if M._hook then M._hook("rename") end end)

  -- into place
  together(function()
    if rank ~= 0 then return end
    check_target(dir)
    local old = dir .. ".old"
    local had = exists(dir)
    if had then
      if exists(old) then
        if not file_exists(old .. "/" .. M.MANIFEST) then
          error("checkpoint.save: " .. old .. " exists and is not a loom checkpoint; refusing to replace it", 0)
        end
        rm_rf(old)
      end
      local ok, err = os.rename(dir, old)
      if not ok then error("checkpoint.save: cannot rename " .. dir .. " to " .. old .. ": " .. tostring(err), 0) end
    end
    local ok, err = os.rename(tmp, dir)
    if not ok then
      if had then os.rename(old, dir) end
      error("checkpoint.save: cannot rename " .. tmp .. " to " .. dir .. ": " .. tostring(err), 0)
    end
    if had then rm_rf(old) end
  end)
end

---------------------------------------------------------------------------
-- load

local function read_manifest(dir, fname)
  local path = dir .. "/" .. M.MANIFEST
  if not file_exists(path) then
    local hint = file_exists(dir .. ".old/" .. M.MANIFEST)
        and " (a save was interrupted while replacing it: the previous checkpoint is in " .. dir .. ".old)" or ""
    error(string.format("%s: %s is not a checkpoint: %s is missing%s", fname, dir, path, hint), 0)
  end
  local ok, m = pcall(serialize.load, path)
  if not ok then error(fname .. ": " .. tostring(m), 0) end
  if type(m) ~= "table" or m.format ~= FORMAT or type(m.tensors) ~= "table" or type(m.files) ~= "table" then
    error(fname .. ": " .. path .. " is not a loom distributed checkpoint manifest", 0)
  end
  if m.version ~= VERSION then
    error(string.format("%s: %s has format version %s (this loom reads version %d)", fname, path,
                        tostring(m.version), VERSION), 0)
  end
  return m, path
end

-- copies the saved values (non-tensor leaves) into sd, making tables as needed
local function merge_values(vals, sd)
  for k, v in pairs(vals) do
    if type(v) == "table" then
      if sd[k] == nil then sd[k] = {} end
      if type(sd[k]) == "table" then merge_values(v, sd[k]) end
    elseif not T.is_tensor(sd[k]) then
      sd[k] = v
    end
  end
end

-- load(state_dict, dir, {strict = true}): collective; fills the tensors of
-- state_dict in place (each rank reads the parts of the saved shards that
-- overlap its own block), and assigns the saved non-tensor values into
-- state_dict's tables. strict: a tensor of state_dict missing from the
-- checkpoint is an error (otherwise it is left as it is). Tensors in the
-- checkpoint that state_dict lacks are ignored. Returns state_dict.
function M.load(state_dict, dir, opts)
  if type(state_dict) ~= "table" then T.argerror("checkpoint.load", "state_dict", "a table", T.describe(state_dict)) end
  if type(dir) ~= "string" or dir == "" then T.argerror("checkpoint.load", "dir", "a directory name", T.describe(dir)) end
  dir = dir:gsub("(.)/+$", "%1")
  local strict = not (opts and opts.strict == false)
  local D = dist()
  D.init()
  local fname = "checkpoint.load"
  together(function()
    local m, mpath = read_manifest(dir, fname)
    local by_key = {}
    for _, te in ipairs(m.tensors) do by_key[path_key(te.path)] = te end
    local entries = flatten(state_dict, fname)
    local handles, sizes_ok = {}, {}
    local function open(fi, name)
      local fe = m.files[fi]
      if fe == nil then error(string.format("%s: %s names file #%d, which it does not list", fname, mpath, fi), 0) end
      local path = dir .. "/" .. fe.name
      if handles[fi] then return handles[fi], path, fe end
      local f, err = io.open(path, "rb")
      if not f then
        error(string.format("%s: tensor %s: cannot open %s: %s", fname, name, path, tostring(err)), 0)
      end
      local len = f:seek("end")
      if len < fe.size then
        f:close()
        error(string.format("%s: tensor %s: %s is truncated (%d of %d bytes)", fname, name, path, len, fe.size), 0)
      elseif len > fe.size then
        f:close()
        error(string.format("%s: tensor %s: %s has %d bytes, the manifest says %d (corrupt)", fname, name, path,
                            len, fe.size), 0)
      end
      handles[fi] = f
      return f, path, fe
    end
    local ok, err = pcall(loom.no_grad, function()
      for _, e in ipairs(entries) do
        local te = by_key[e.key]
        if te == nil then
          if strict then
            error(string.format("%s: tensor %s is not in the checkpoint %s", fname, e.name, mpath), 0)
          end
        else
          local x = e.t
          if x.dtype ~= te.dtype then
            error(string.format("%s: tensor %s: the state_dict's is %s, the checkpoint's (%s) is %s", fname, e.name,
                                x.dtype, mpath, te.dtype), 0)
          end
          local shape, boff, bsize, L = block_of(x)
          if sizes(shape) ~= sizes(te.shape) then
            error(string.format("%s: tensor %s: the state_dict's has size %s, the checkpoint's (%s) has %s", fname,
                                e.name, sizes(shape), mpath, sizes(te.shape)), 0)
          end
          if is_dtensor(x) then
            for _, p in ipairs(x.placements) do
              if p:is_partial() then
                error(string.format("%s: tensor %s: cannot load into a Partial DTensor (use Replicate or Shard)",
                                    fname, e.name), 0)
              end
            end
          end
          local nd = #shape
          local dst = L
          if L.device ~= "cpu" then dst = T.empty(bsize, { dtype = x.dtype }) end
          for _, sh in ipairs(te.shards) do
            -- overlap of the saved shard and this rank's block
            local lo, len, empty = {}, {}, false
            for d = 1, nd do
              local a = math.max(sh.offset[d], boff[d])
              local b = math.min(sh.offset[d] + sh.size[d], boff[d] + bsize[d])
              lo[d], len[d] = a, b - a
              if b <= a then empty = true end
            end
            if not empty and numel(bsize) > 0 then
              local f, path = open(sh.file, e.name)
              f:seek("set", sh.byte_offset)
              local s = f:read(sh.nbytes) or ""
              if #s ~= sh.nbytes then
                error(string.format("%s: tensor %s: %s is truncated (its shard at byte %d runs past the end)",
                                    fname, e.name, path, sh.byte_offset), 0)
              end
              if C.lm_fnv1a(s, #s, 0) ~= sh.checksum then
                error(string.format("%s: tensor %s: its shard in %s (bytes %d to %d) is corrupt (checksum mismatch)",
                                    fname, e.name, path, sh.byte_offset, sh.byte_offset + sh.nbytes - 1), 0)
              end
              local src = T.empty(sh.size, { dtype = te.dtype })
              if sh.nbytes > 0 then ffi.copy(C.lm_data(src), s, sh.nbytes) end
              local from, to = src, dst
              for d = 1, nd do
                if len[d] ~= sh.size[d] then from = from:narrow(d, lo[d] - sh.offset[d] + 1, len[d]) end
                if len[d] ~= bsize[d] then to = to:narrow(d, lo[d] - boff[d] + 1, len[d]) end
              end
              to:copy_(from)
            end
          end
          if dst ~= L then L:copy_(dst:to(L.device)) end
        end
      end
    end)
    for _, f in pairs(handles) do f:close() end
    if not ok then error(err, 0) end
    merge_values(m.values or {}, state_dict)
  end)
  return state_dict
end

-- verify(dir): reads every file of the checkpoint and checks its size and
-- checksum against the manifest (no collectives; any rank may call it).
-- Returns true, or raises naming the file.
function M.verify(dir)
  if type(dir) ~= "string" then T.argerror("checkpoint.verify", "dir", "a directory name", T.describe(dir)) end
  dir = dir:gsub("(.)/+$", "%1")
  local m = read_manifest(dir, "checkpoint.verify")
  for _, fe in ipairs(m.files) do
    local path = dir .. "/" .. fe.name
    local f, err = io.open(path, "rb")
    if not f then error("checkpoint.verify: cannot open " .. path .. ": " .. tostring(err), 2) end
    local s = f:read("*a")
    f:close()
    if #s < fe.size then
      error(string.format("checkpoint.verify: %s is truncated (%d of %d bytes)", path, #s, fe.size), 2)
    end
    if #s ~= fe.size or C.lm_fnv1a(s, #s, 0) ~= fe.checksum then
      error("checkpoint.verify: " .. path .. " is corrupt (checksum mismatch)", 2)
    end
  end
  return true
end

---------------------------------------------------------------------------
-- optimizer state

-- optim_state_dict(opt): the optimizer's state_dict for save/load, with the
-- state tensors of DTensor parameters (plain local shards in the
-- optimizer) wrapped as DTensors with their parameter's mesh, placements
-- and global size, so they reshard like the parameters. They share storage
-- with the optimizer's state. AdamW state is made for every parameter that
-- has none yet (step 0 and zero moments, which is what its first step
-- would make), so a fresh optimizer has tensors to load into.
function M.optim_state_dict(opt)
  if type(opt) ~= "table" or type(opt.params) ~= "table" or type(opt.state) ~= "table" then
    T.argerror("optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  local D = dist()
  if opt.name == "AdamW" then
    loom.no_grad(function()
      for i, p in ipairs(opt.params) do
        if opt.state[i] == nil then
          local lp = is_dtensor(p) and p:to_local() or p
          local sd = lp.dtype == "f64" and "f64" or "f32"
          local s = { step = 0, exp_avg = loom.zeros(lp:size(), { dtype = sd, device = lp.device }),
                      exp_avg_sq = loom.zeros(lp:size(), { dtype = sd, device = lp.device }) }
          if lp.dtype ~= sd then s.master = lp:to(sd):contiguous() end
          opt.state[i] = s
        end
      end
    end)
  end
  local base = opt:state_dict()
  local out = { options = base.options, state = {} }
  for i, s in pairs(base.state) do
    local p, o = opt.params[i], {}
    for k, v in pairs(s) do
      if T.is_tensor(v) and p ~= nil and is_dtensor(p) and not is_dtensor(v) then
        local lsz, vsz = p:to_local():size(), v:size()
        if sizes(lsz) ~= sizes(vsz) then
          error(string.format("optim_state_dict: state[%d].%s has size %s, its parameter's shard %s", i, k,
                              sizes(vsz), sizes(lsz)), 2)
        end
        v = D.from_local(v, p.device_mesh, p.placements, { shape = p:size() })
      end
      o[k] = v
    end
    out.state[i] = o
  end
  return out
end

-- load_optim_state_dict(opt, sd): gives the optimizer the state (options,
-- step counters, tensors as local shards) of sd, a table from
-- optim_state_dict that dist.checkpoint.load has filled.
function M.load_optim_state_dict(opt, sd)
  if type(opt) ~= "table" or type(opt.params) ~= "table" then
    T.argerror("load_optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  if type(sd) ~= "table" or type(sd.state) ~= "table" then
    T.argerror("load_optim_state_dict", "sd", "a table from optim_state_dict", T.describe(sd))
  end
  for k, v in pairs(sd.options or {}) do opt.defaults[k] = v end
  local state = {}
  for i, s in pairs(sd.state) do
    local o = {}
    for k, v in pairs(s) do o[k] = is_dtensor(v) and v:to_local() or v end
    state[tonumber(i)] = o
  end
  opt.state = state
end

return M
