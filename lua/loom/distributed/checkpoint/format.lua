-- format.lua: a distributed checkpoint on disk. A checkpoint is a directory:
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
-- Atomic replacement: everything is written into DIR.tmp-ckpt; then a
-- previous DIR moves to DIR.old, DIR.tmp-ckpt to DIR, and DIR.old is
-- removed. A crash before that leaves the previous DIR intact; a crash
-- between the two renames leaves it in DIR.old, which load errors offer.
-- One job at a time: rank 0 holds DIR.lock (flock) through the save, and a
-- directory holding files that are not loom's is refused, never replaced.
local ffi = require("ffi")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C
local serialize = require("loom.serialize")
local fs = require("loom.fs")

local M = {}

M.MANIFEST = "manifest.loom"
M.FORMAT, M.VERSION = "loom-dcp", 1

function M.shard_file(r) return string.format("rank%05d.shards", r) end
function M.tmp_of(dir) return dir .. ".tmp-ckpt" end
function M.old_of(dir) return dir .. ".old" end
function M.is_checkpoint(dir) return fs.is_file(dir .. "/" .. M.MANIFEST) end

-- the hint a failed load of dir ends with when dir.old holds a checkpoint
function M.old_hint(dir, fname)
  local old = M.old_of(dir)
  if not M.is_checkpoint(old) then return "" end
  local call = fname == "load" and string.format("loom.load(%q)", old)
      or string.format("dist.checkpoint.load(state_dict, %q)", old)
  return string.format("; %s holds an earlier checkpoint (left by an interrupted save): load it with %s, "
                       .. "or move it back to %s", old, call, dir)
end

-- fail(dir, fname, fmt, ...): raises a load error about the files of dir
function M.fail(dir, fname, fmt, ...)
  error(fname .. ": " .. string.format(fmt, ...) .. M.old_hint(dir, fname), 0)
end

---------------------------------------------------------------------------
-- writing

-- write_shards(path, entries, mine): writes the local blocks of the
-- entries this rank owns (mine[i]) to path, durably; returns the file's
-- size, its checksum and each written shard's checksum
function M.write_shards(path, entries, mine)
  local fsum, size, sums = C.lm_fnv1a("", 0, 0), 0, {}
  -- (fs.write_atomic: created exclusively, never through a link planted in the directory)
  local ok, err = fs.write_atomic(path, function(put)
    for i, e in ipairs(entries) do
      if mine[i] then
        local c = e.local_t
        if c.device ~= "cpu" then c = c:to("cpu") end
        c = c:contiguous()
        local n = c:numel() * C.lm_dtype_size(c.dtype_)
        local p = C.lm_data(c)
        sums[i] = C.lm_fnv1a(p, n, 0)
        fsum = C.lm_fnv1a(p, n, fsum)
        put(p, n)
        size = size + n
      end
    end
  end)
  if not ok then error("checkpoint.save: writing " .. path .. " failed: " .. err, 0) end
  return size, fsum, sums
end

function M.write_manifest(dir, m)
  m.format, m.version = M.FORMAT, M.VERSION
  serialize.save(m, dir .. "/" .. M.MANIFEST)
end

local function wrap(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then error("checkpoint.save: " .. tostring(err), 0) end
end

-- loom's own files in a checkpoint directory: a save replaces only these
function M.is_own_file(name)
  return name == M.MANIFEST or name:match("^rank%d%d%d%d%d+%.shards$") ~= nil
end

-- check_target(dir): dir may be replaced (it is missing, an empty
-- directory, or a checkpoint holding only loom's files); raises otherwise
function M.check_target(dir)
  if fs.exists(dir) and not M.is_checkpoint(dir) then
    -- an empty directory (mkdir -p DIR before saving) may be replaced
    if fs.is_dir(dir) and #fs.list(dir) == 0 then return wrap(fs.rm_rf, dir) end
    error("checkpoint.save: " .. dir .. " exists and is not a loom checkpoint (no " .. M.MANIFEST
          .. "); refusing to replace it", 0)
  end
  if fs.exists(dir) then
    for _, name in ipairs(fs.list(dir)) do
      if not M.is_own_file(name) then
        error(string.format("checkpoint.save: %s holds %s, which is not loom's (a save replaces the whole "
                            .. "directory); move it out, or save into a directory of its own", dir, name), 0)
      end
    end
  end
end

-- lock(dir): one job at a time saves into dir (DIR.lock, held by rank 0
-- from make_tmp to the end of install; the system frees it if the job dies)
function M.lock(dir)
  local h, err = fs.lock(dir .. ".lock")
  if not h then error("checkpoint.save: " .. dir .. ": " .. err, 0) end
  return h
end

-- make_tmp(dir): a fresh, empty dir.tmp-ckpt (under the lock)
function M.make_tmp(dir)
  M.check_target(dir)
  wrap(fs.rm_rf, M.tmp_of(dir))
  wrap(fs.mkdir_p, M.tmp_of(dir))
end

-- install(dir): dir.tmp-ckpt becomes dir (see the top of the file)
function M.install(dir)
  M.check_target(dir)
  local tmp, old = M.tmp_of(dir), M.old_of(dir)
  local had = fs.exists(dir)
  if had then
    if fs.exists(old) then
      if not M.is_checkpoint(old) then
        error("checkpoint.save: " .. old .. " exists and is not a loom checkpoint; refusing to replace it", 0)
      end
      wrap(fs.rm_rf, old)
    end
    wrap(fs.rename, dir, old)
  end
  local ok, err = pcall(fs.rename, tmp, dir)
  if not ok then
    if had then os.rename(old, dir) end
    error("checkpoint.save: " .. tostring(err), 0)
  end
  if had then wrap(fs.rm_rf, old) end
end

---------------------------------------------------------------------------
-- reading

-- read_manifest(dir, fname) -> manifest, its path
function M.read_manifest(dir, fname)
  local path = dir .. "/" .. M.MANIFEST
  if not fs.exists(dir) then
    M.fail(dir, fname, "%s is not a checkpoint: the directory does not exist (no %s)", dir, path)
  end
  if not M.is_checkpoint(dir) then
    M.fail(dir, fname, "%s is not a checkpoint: %s is missing", dir, path)
  end
  local ok, m = pcall(serialize.load, path)
  if not ok then M.fail(dir, fname, "%s", (tostring(m):gsub("^load: ", ""))) end
  if type(m) ~= "table" or m.format ~= M.FORMAT or type(m.tensors) ~= "table" or type(m.files) ~= "table" then
    M.fail(dir, fname, "%s is not a loom distributed checkpoint manifest", path)
  end
  if m.version ~= M.VERSION then
    error(string.format("%s: %s has format version %s (this loom reads version %d)", fname, path,
                        tostring(m.version), M.VERSION), 0)
  end
  local valid, err = pcall(M.check_manifest, m)
  if not valid then M.fail(dir, fname, "%s is corrupt (%s)", path, tostring(err)) end
  return m, path
end

---------------------------------------------------------------------------
-- the manifest's own consistency: its checksum guards against damage, but
-- a file that is well formed and lies (edited, or written by a buggy
-- tool) must not make the reader copy past a buffer or index past a list

local DTYPE_SIZE = { f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, bool = 1 }
local u64_ct = ffi.typeof("uint64_t")

local function bad(where, expected, got)
  error(string.format("%s: expected %s, got %s", where, expected, T.describe(got)), 0)
end
local function is_list(t, n)
  if type(t) ~= "table" or T.is_tensor(t) then return false end
  local k = 0
  for _ in pairs(t) do k = k + 1 end
  return k == #t and (n == nil or #t == n)
end
local function nonneg_int(v) return T.is_int(v) and v >= 0 and v < 2 ^ 53 end
local function size_list(where, t, n)
  if not is_list(t, n) or #t > 8 then bad(where, n and ("a list of " .. n .. " sizes") or "a list of at most 8 sizes", t) end
  for d, v in ipairs(t) do if not nonneg_int(v) then bad(where .. "[" .. d .. "]", "an integer >= 0", v) end end
end

function M.check_manifest(m)
  if not is_list(m.files) then bad("files", "a list", m.files) end
  for r, fe in ipairs(m.files) do
    local w = "files[" .. r .. "]"
    if type(fe) ~= "table" then bad(w, "a table", fe) end
    if type(fe.name) ~= "string" or not fe.name:match("^[%w_.-]+$") or fe.name:match("^%.") then
      bad(w .. ".name", "a file name inside the checkpoint", fe.name)
    end
    if not nonneg_int(fe.size) then bad(w .. ".size", "an integer >= 0", fe.size) end
    if not ffi.istype(u64_ct, fe.checksum) then bad(w .. ".checksum", "a uint64", fe.checksum) end
  end
  if not is_list(m.tensors) then bad("tensors", "a list", m.tensors) end
  for i, te in ipairs(m.tensors) do
    local w = "tensors[" .. i .. "]"
    if type(te) ~= "table" then bad(w, "a table", te) end
    if not is_list(te.path) or #te.path == 0 then bad(w .. ".path", "a non-empty list of keys", te.path) end
    for _, k in ipairs(te.path) do
      if type(k) ~= "string" and type(k) ~= "number" then bad(w .. ".path", "string or number keys", k) end
      if k ~= k then bad(w .. ".path", "keys that are not NaN (a NaN cannot index a table)", k) end
    end
    if type(te.name) ~= "string" then bad(w .. ".name", "a string", te.name) end
    local es = DTYPE_SIZE[te.dtype]
    if not es then bad(w .. ".dtype", "a dtype name", te.dtype) end
    size_list(w .. ".shape", te.shape)
    if not is_list(te.shards) then bad(w .. ".shards", "a list", te.shards) end
    local covered, total = 0, 1
    for d = 1, #te.shape do total = total * te.shape[d] end
    for j, sh in ipairs(te.shards) do
      local ws = w .. ".shards[" .. j .. "]"
      if type(sh) ~= "table" then bad(ws, "a table", sh) end
      if not T.is_int(sh.file) or sh.file < 1 or sh.file > #m.files then
        bad(ws .. ".file", "a file number in [1, " .. #m.files .. "]", sh.file)
      end
      size_list(ws .. ".offset", sh.offset, #te.shape)
      size_list(ws .. ".size", sh.size, #te.shape)
      local n = es
      for d = 1, #te.shape do
        if sh.offset[d] + sh.size[d] > te.shape[d] then
          bad(ws, string.format("a block inside the shape in dim %d (offset %d, size %d, of %d)", d, sh.offset[d],
                                sh.size[d], te.shape[d]), "one past it")
        end
        n = n * sh.size[d]
      end
      if sh.nbytes ~= n then bad(ws .. ".nbytes", n .. " (its size times " .. es .. " bytes)", sh.nbytes) end
      if not nonneg_int(sh.byte_offset) or sh.byte_offset + n > m.files[sh.file].size then
        bad(ws .. ".byte_offset", "an offset whose block lies inside " .. m.files[sh.file].name, sh.byte_offset)
      end
      if not ffi.istype(u64_ct, sh.checksum) then bad(ws .. ".checksum", "a uint64", sh.checksum) end
      covered = covered + n / es
      for q = 1, j - 1 do   -- blocks are written once each: none overlaps another
        local o, apart = te.shards[q], false
        for d = 1, #te.shape do
          if o.offset[d] >= sh.offset[d] + sh.size[d] or sh.offset[d] >= o.offset[d] + o.size[d] then apart = true end
        end
        if not apart and n > 0 and o.nbytes > 0 then bad(ws, "a block apart from shards[" .. q .. "]", "an overlap") end
      end
    end
    -- every element comes from a shard (a load never hands out unwritten memory)
    if covered ~= total then
      bad(w .. ".shards", string.format("blocks covering its %d elements", total), covered .. " elements")
    end
  end
  if m.values ~= nil and type(m.values) ~= "table" then bad("values", "a table", m.values) end
end

-- reader(dir, m, fname) -> read(shard, name), close(): read returns the
-- saved shard as a tensor, after checking its file's size and the
-- shard's checksum (errors name the tensor and the file)
function M.reader(dir, m, fname)
  local handles = {}
  local function open(fi, name)
    if handles[fi] then return handles[fi], dir .. "/" .. m.files[fi].name end
    local fe = m.files[fi]
    if fe == nil then M.fail(dir, fname, "%s/%s names file #%d, which it does not list", dir, M.MANIFEST, fi) end
    local path = dir .. "/" .. fe.name
    local mode = require("lfs").attributes(path, "mode")   -- (a FIFO there would stall the read)
    if mode and mode ~= "file" then M.fail(dir, fname, "tensor %s: %s is a %s, not a regular file", name, path, mode) end
    local f, err = io.open(path, "rb")
    if not f then M.fail(dir, fname, "tensor %s: cannot open %s: %s", name, path, tostring(err)) end
    local len = f:seek("end")
    if len ~= fe.size then
      f:close()
      if len < fe.size then M.fail(dir, fname, "tensor %s: %s is truncated (%d of %d bytes)", name, path, len, fe.size) end
      M.fail(dir, fname, "tensor %s: %s has %d bytes, the manifest says %d (corrupt)", name, path, len, fe.size)
    end
    handles[fi] = f
    return f, path
  end
  local function read(sh, te)
    local f, path = open(sh.file, te.name)
    f:seek("set", sh.byte_offset)
    local s = f:read(sh.nbytes) or ""
    if #s ~= sh.nbytes then
      M.fail(dir, fname, "tensor %s: %s is truncated (its shard at byte %d runs past the end)", te.name, path,
             sh.byte_offset)
    end
    if C.lm_fnv1a(s, #s, 0) ~= sh.checksum then
      M.fail(dir, fname, "tensor %s: its shard in %s (bytes %d to %d) is corrupt (checksum mismatch)", te.name,
             path, sh.byte_offset, sh.byte_offset + sh.nbytes - 1)
    end
    local src = TC.empty(sh.size, { dtype = te.dtype })
    if sh.nbytes > 0 then ffi.copy(C.lm_data(src), s, sh.nbytes) end
    return src
  end
  local function close()
    for _, f in pairs(handles) do f:close() end
    handles = {}
  end
  return read, close
end

-- verify(dir, fname): every file's size and checksum against the manifest
function M.verify(dir, fname)
  local m = M.read_manifest(dir, fname)
  for _, fe in ipairs(m.files) do
    local path = dir .. "/" .. fe.name
    local mode = require("lfs").attributes(path, "mode")
    if mode and mode ~= "file" then M.fail(dir, fname, "%s is a %s, not a regular file", path, mode) end
    local f, err = io.open(path, "rb")
    if not f then M.fail(dir, fname, "cannot open %s: %s", path, tostring(err)) end
    local s = f:read("*a")
    f:close()
    if #s < fe.size then M.fail(dir, fname, "%s is truncated (%d of %d bytes)", path, #s, fe.size) end
    if #s ~= fe.size or C.lm_fnv1a(s, #s, 0) ~= fe.checksum then
      M.fail(dir, fname, "%s is corrupt (checksum mismatch)", path)
    end
  end
  return m
end

return M
