-- fs.lua: the file work loom does (make, list, remove and rename paths)
-- through lua-filesystem, with no shell. Failures raise errors that name
-- the path and give the system's reason.
local lfs = require("lfs")
local ffi = require("ffi")
local libc = ffi.C
local errno_msg = require("loom.posix").errno_msg   -- and the libc functions used here

local M = {}

-- mode(path): "file", "directory", ... or nil when path does not exist
-- (symbolic links are not followed)
function M.mode(path)
  return lfs.symlinkattributes(path, "mode")
end
function M.exists(path) return M.mode(path) ~= nil end
function M.is_dir(path) return lfs.attributes(path, "mode") == "directory" end
function M.is_file(path) return lfs.attributes(path, "mode") == "file" end

-- mkdir_p(path): makes path and its missing parents, like mkdir -p
local function mkdir(path)
  if M.is_dir(path) then return end
  -- (is_dir again: another rank may have made it since)
  if M.exists(path) and not M.is_dir(path) then error(path .. " exists and is not a directory", 0) end
  local parent = path:match("^(.*[^/])/+[^/]+/*$")
  if parent then mkdir(parent) end
  local ok, err = lfs.mkdir(path)
  if not ok and not M.is_dir(path) then error(path .. ": " .. tostring(err), 0) end   -- (or another rank made it)
end
function M.mkdir_p(path)
  local ok, err = pcall(mkdir, path)
  if not ok then error("cannot create the directory " .. path .. ": " .. tostring(err):gsub("^" .. path:gsub("%p", "%%%0") .. ": ", ""), 0) end
end

-- list(dir): the names in dir (without . and ..), sorted
function M.list(dir)
  local ok, iter, state = pcall(lfs.dir, dir)
  if not ok then error("cannot list the directory " .. dir .. ": " .. tostring(iter):gsub("^.-: ", ""), 0) end
  local names = {}
  for name in iter, state do
    if name ~= "." and name ~= ".." then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

-- rm_rf(path): removes path and everything under it, like rm -rf; a
-- missing path is not an error. Links are removed, not followed.
function M.rm_rf(path)
  local mode = M.mode(path)
  if mode == nil then return end
  if mode == "directory" then
    for _, name in ipairs(M.list(path)) do M.rm_rf(path .. "/" .. name) end
    local ok, err = lfs.rmdir(path)
    if not ok then error("cannot remove the directory " .. path .. ": " .. tostring(err), 0) end
  else
    local ok, err = os.remove(path)
    if not ok then error("cannot remove " .. tostring(err), 0) end   -- err starts with the path
  end
end

-- rename(from, to): os.rename with an error that names both paths
function M.rename(from, to)
  local ok, err = os.rename(from, to)
  if not ok then error("cannot rename " .. from .. " to " .. to .. ": " .. tostring(err):gsub("^.-: ", ""), 0) end
end

---------------------------------------------------------------------------
-- files written whole and only where they are named

local O_WRONLY, O_RDWR, O_CREAT, O_EXCL, O_CLOEXEC = 1, 2, 0x40, 0x80, 0x80000
local O_APPEND, O_NONBLOCK = 0x400, 0x800
local O_NOFOLLOW = ffi.arch == "arm64" and 0x8000 or 0x20000
local EINTR, EEXIST, EWOULDBLOCK, ELOOP, ENXIO, LOCK_EX, LOCK_NB = 4, 17, 11, 40, 6, 2, 4
local serial = 0
-- a per-process random part of temporary names: names planted in advance
-- cannot be guessed (and O_EXCL refuses any that exist anyway)
local salt = (function()
  local f = io.open("/dev/urandom", "rb")
  local b = f and f:read(4) or ""
  if f then f:close() end
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end)()

-- a temporary file beside path, created exclusively (never through a
-- link, never one that exists): fd, its name; or nil, the reason
local function create_tmp(path)
  for _ = 1, 100 do
    serial = serial + 1
    local tmp = string.format("%s.tmp-%d%s-%d", path, libc.loom_getpid(), salt, serial)
    local fd = libc.loom_open(tmp, O_WRONLY + O_CREAT + O_EXCL + O_NOFOLLOW + O_CLOEXEC, ffi.cast("unsigned int", 438))
    if fd >= 0 then return fd, tmp end
    if ffi.errno() ~= EEXIST then return nil, "cannot open for writing (creating " .. tmp .. "): " .. errno_msg() end
  end
  return nil, "cannot create a temporary file beside " .. path .. " (100 names taken)"
end

-- writes n bytes at p to fd; false when the write fails
local function write_all(fd, p, n)
  p = ffi.cast("const uint8_t *", p)
  local done = 0
  while done < n do
    local w = tonumber(libc.loom_write(fd, p + done, n - done))
    if w < 0 and ffi.errno() ~= EINTR then return false end
    if w > 0 then done = done + w end
  end
  return true
end

-- write_atomic(path, fill): fill(put) calls put(pointer or string, [n])
-- for each chunk; the chunks go to a temporary file beside path (created
-- exclusively: a link planted there is never written through), synced to
-- the disk and renamed over path (a link at path is replaced, not
-- followed). Returns true, or nil and the reason (nothing left behind).
function M.write_atomic(path, fill)
  local fd, tmp = create_tmp(path)
  if not fd then return nil, tmp end
  local ok, err = true, nil
  local pok, perr = pcall(fill, function(p, n)
    if ok and (n or #p) > 0 then
      ok = write_all(fd, p, n or #p)
      if not ok then err = "writing " .. tmp .. " failed: " .. errno_msg() .. " (disk full?)" end
    end
  end)
  if not pok then ok, err = false, tostring(perr) end
  if ok and libc.loom_fsync(fd) ~= 0 then ok, err = false, "syncing " .. tmp .. " failed: " .. errno_msg() end
  libc.loom_close(fd)
  if ok then
    local rok, rerr = os.rename(tmp, path)
    if not rok then ok, err = false, "cannot rename " .. tmp .. " to " .. path .. ": " .. tostring(rerr):gsub("^.-: ", "") end
  end
  if not ok then os.remove(tmp) return nil, err end
  return true
end

-- lock(path): an exclusive lock on the file path (made if missing, never
-- through a link) for one job at a time; returns a handle for unlock, or
-- nil and the reason when another process holds it. The system releases
-- the lock when the process ends, so a crash never leaves it held.
function M.lock(path)
  local fd = libc.loom_open(path, O_RDWR + O_CREAT + O_NOFOLLOW + O_CLOEXEC, ffi.cast("unsigned int", 420))
  if fd < 0 then return nil, "cannot open the lock file " .. path .. ": " .. errno_msg() end
  if libc.loom_flock(fd, LOCK_EX + LOCK_NB) ~= 0 then
    local busy = ffi.errno() == EWOULDBLOCK
    local why = errno_msg()
    libc.loom_close(fd)
    return nil, busy and "another job holds the lock " .. path .. " (it is saving into the same place)"
      or "cannot lock " .. path .. ": " .. why
  end
  return ffi.gc(ffi.new("int[1]", fd), function(p) if p[0] >= 0 then libc.loom_close(p[0]) end end)
end

function M.unlock(h)
  if h and h[0] >= 0 then libc.loom_close(h[0]) h[0] = -1 end
end

-- open_log(path, append): a log file written line by line where it is
-- named: never through a link planted at path, never a FIFO or a device
-- (refused before anything is written or truncated; O_NONBLOCK: a FIFO
-- with no reader fails at once instead of hanging). Truncated unless
-- append. Returns a handle with write(...), flush() and close(), or nil
-- and the reason.
function M.open_log(path, append)
  local fd = libc.loom_open(path, O_WRONLY + O_CREAT + O_NOFOLLOW + O_NONBLOCK + O_CLOEXEC + (append and O_APPEND or 0),
                       ffi.cast("unsigned int", 420))
  local e = fd < 0 and ffi.errno()
  if e == ELOOP then return nil, "cannot open " .. path .. ": it is a link (not followed)" end
  if e == ENXIO then return nil, "cannot open " .. path .. ": not a regular file (a FIFO with no reader)" end
  if fd < 0 then return nil, "cannot open " .. path .. ": " .. errno_msg() end
  if lfs.symlinkattributes(path, "mode") ~= "file" then
    libc.loom_close(fd)
    return nil, "cannot open " .. path .. ": not a regular file"
  end
  if not append and libc.loom_ftruncate(fd, 0) ~= 0 then
    local why = errno_msg()
    libc.loom_close(fd)
    return nil, "cannot truncate " .. path .. ": " .. why
  end
  local h = { fd = fd }
  function h:write(...)
    for i = 1, select("#", ...) do
      local s = tostring((select(i, ...)))
      if self.fd < 0 or not write_all(self.fd, s, #s) then error("writing " .. path .. " failed: " .. errno_msg(), 2) end
    end
    return self
  end
  function h:flush() return self end   -- each write is a system call: nothing is buffered
  function h:close() if self.fd >= 0 then libc.loom_close(self.fd) self.fd = -1 end end
  return h
end

return M
