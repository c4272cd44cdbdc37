-- repl.lua: the SPMD REPL behind `loomrun -n N --repl`. Rank 0 reads a
-- chunk (prompting "loom> ", and "...> " while the chunk is incomplete);
-- every rank runs it with its stdout captured; rank 0 prints what the ranks
-- wrote, in rank order, output identical on several ranks once, labelled
-- with their ranks ("[ranks 0-3] ..."). Ranks waiting for the next chunk
-- sleep (a non-blocking broadcast, polled) instead of spinning a core.
local ffi = require "ffi"
local C = ffi.C

for _, decl in ipairs {
  "typedef struct { long tv_sec; long tv_nsec; } loom_timespec;",
  "int nanosleep(const loom_timespec *req, loom_timespec *rem);",
  "int isatty(int fd);",
  "int dup(int fd);",
  "int dup2(int fd, int fd2);",
  "int close(int fd);",
  "typedef struct FILE FILE;",
  "FILE *tmpfile(void);",
  "int fileno(FILE *f);",
  "int fflush(FILE *f);",
  "int fclose(FILE *f);",
  "long lseek(int fd, long offset, int whence);",
  "long read(int fd, void *buf, unsigned long n);",
} do pcall(ffi.cdef, decl) end

local M = {}

local function dist() return require "loom.distributed" end

---------------------------------------------------------------------------
-- strings between ranks

-- a string as an i64 tensor (8 bytes an element, zero padded to n bytes)
local function pack(s, n)
  local T = require "loom.tensor"
local TC = require "loom.tensor_create"
  local t = TC.zeros({ math.max(1, math.ceil(n / 8)) }, { dtype = "i64" })
  ffi.copy(t:data_ptr(), s, #s)
  return t
end

local ts = ffi.new("loom_timespec")
local function sleep(s)
  ts.tv_sec, ts.tv_nsec = math.floor(s), (s % 1) * 1e9
  C.nanosleep(ts, nil)
end

-- waits for a non-blocking collective, sleeping between polls (1 to 20 ms)
-- so that an idle rank uses no CPU
local function wait_idle(work)
  local nap = 0.001
  while not work:is_completed() do
    sleep(nap)
    nap = math.min(nap * 2, 0.02)
  end
  return work:wait()
end

-- share(s): rank 0's s (nil: the end) on every rank
local function share(s)
  local D, loom = dist(), require "loom"
  local world = D.world_group()
  local n = loom.tensor({ s and #s or -1 }, { dtype = "i64" })
  n = wait_idle(D.broadcast(n, 0, world, nil, { async_op = true })):item()
  if n < 0 then return nil end
  local buf = D.broadcast(pack(s or "", n), 0, world)
  return ffi.string(buf:data_ptr(), n)
end

-- gather(s): every rank's s, on every rank, as a list indexed by rank + 1
local function gather(s)
  local D, loom = dist(), require "loom"
  local world = D.world_group()
  local lens = D.all_gather(loom.tensor({ #s }, { dtype = "i64" }), 1, world)
  local p, n, longest = ffi.cast("int64_t*", lens:data_ptr()), D.world_size(), 0
  for r = 0, n - 1 do longest = math.max(longest, tonumber(p[r])) end
  local chunk = 8 * math.max(1, math.ceil(longest / 8))
  local all = D.all_gather(pack(s, chunk), 1, world)
  local base, out = ffi.cast("const char*", all:data_ptr()), {}
  for r = 0, n - 1 do out[r + 1] = ffi.string(base + r * chunk, tonumber(p[r])) end
  return out
end

---------------------------------------------------------------------------
-- running a chunk

-- capture(fn): runs fn with this process's stdout (fd 1: print, io.write,
-- C's printf) going to a temporary file; returns what was written
local function capture(fn)
  io.stdout:flush()
  C.fflush(nil)
  local f = C.tmpfile()
  if f == nil then fn() return "" end
  local fd, saved = C.fileno(f), C.dup(1)
  C.dup2(fd, 1)
  local ok, err = pcall(fn)
  io.stdout:flush()
  C.fflush(nil)
  C.dup2(saved, 1)
  C.close(saved)
  local size = tonumber(C.lseek(fd, 0, 2))
  C.lseek(fd, 0, 0)
  local buf, got = ffi.new("char[?]", math.max(1, size)), 0
  while got < size do
    local r = tonumber(C.read(fd, buf + got, size - got))
    if r <= 0 then break end
    got = got + r
  end
  C.fclose(f)
  local out = ffi.string(buf, got)
  if not ok then out = out .. "error: " .. tostring(err) .. "\n" end
  return out
end

-- the message and the user's frames of a traceback: frames from the REPL
-- itself (its xpcall and what runs it) are left out, and so is the whole
-- traceback when the chunk's main body is the only frame of the user's
local function user_traceback(msg)
  local tb = debug.traceback(tostring(msg), 2)
  local lines, user = {}, false
  for line in tb:gmatch("[^\n]+") do
    if line:find("in function 'xpcall'", 1, true) or line:find("loom/distributed/repl.lua", 1, true) then break end
    lines[#lines + 1] = line
    if line:match("^\t") and not line:match("^\t%[C%]") and not line:match("^\t%[builtin#")
       and not line:match("^\trepl:%d+: in main chunk") then
      user = true
    end
  end
  if not user then return tostring(msg) end
  return table.concat(lines, "\n")
end

-- compile(src) -> function, or nil and the error. An expression's values
-- go through the packer the function is called with (passed, not
-- returned: a returned call would be a tail call, which loses the
-- position of its errors).
local function compile(src)
  local f, err = loadstring("local pack_ = ... return pack_(" .. src .. "\n)", "=repl")
  if not f then f, err = loadstring(src, "=repl") end
  return f, err
end
local function pack_(...) return { n = select("#", ...), ... } end

local function run(src, env)
  local f, err = compile(src)
  if not f then print("error: " .. err) return end
  setfenv(f, env)
  local ok, res = xpcall(f, user_traceback, pack_)
  if not ok then print("error: " .. res) return end
  if type(res) == "table" and res.n and res.n > 0 then
    local parts = {}
    for i = 1, res.n do parts[i] = tostring(res[i]) end
    print(table.concat(parts, "\t"))
  end
end

---------------------------------------------------------------------------
-- rank 0: reading and printing

-- "[rank 2]", "[ranks 0-3]", "[ranks 0,2]", "[ranks 0-2,5-6]"
function M.label(ranks)
  if #ranks == 1 then return "[rank " .. ranks[1] .. "]" end
  local parts, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and ranks[i] .. "-" .. ranks[j] or tostring(ranks[i])
    i = j + 1
  end
  return "[ranks " .. table.concat(parts, ",") .. "]"
end

-- format(outs): the ranks' outputs (a list by rank + 1), grouped: each
-- distinct non-empty output once, in the order of its lowest rank, every
-- line prefixed with the label of the ranks that wrote it
function M.format(outs)
  if #outs == 1 then return (outs[1]:gsub("([^\n])$", "%1\n")) end
  local groups, by_text = {}, {}
  for r, s in ipairs(outs) do
    if s ~= "" then
      local g = by_text[s]
      if not g then
        g = { text = s, ranks = {} }
        by_text[s] = g
        groups[#groups + 1] = g
      end
      g.ranks[#g.ranks + 1] = r - 1
    end
  end
  local lines = {}
  for _, g in ipairs(groups) do
    local label = M.label(g.ranks)
    for line in (g.text:gsub("([^\n])$", "%1\n")):gmatch("([^\n]*)\n") do lines[#lines + 1] = label .. " " .. line end
  end
  return #lines > 0 and table.concat(lines, "\n") .. "\n" or ""
end

-- read_chunk(prompt): lines from stdin until they compile (or cannot be
-- completed); nil at the end of input
local function read_chunk(prompt)
  local lines = {}
  while true do
    if prompt then
      io.write(#lines == 0 and "loom> " or "...> ")
      io.stdout:flush()
    end
    local line = io.read("*l")
    if not line then break end
    lines[#lines + 1] = line
    local _, err = compile(table.concat(lines, "\n"))
    if not (err and err:match("<eof>")) then break end
  end
  return #lines > 0 and table.concat(lines, "\n") or nil
end

local function want_prompt()
  local v = os.getenv("LOOM_REPL_PROMPT")
  if v ~= nil and v ~= "" then return v ~= "0" end
  return C.isatty(0) == 1
end

-- run(): the loop, on every rank, until rank 0's input ends
function M.run()
  local loom, D = require "loom", dist()
  D.init()
  local me = D.rank()
  local prompt = me == 0 and want_prompt()
  local env = setmetatable({ loom = loom, dist = D }, { __index = _G })
  while true do
    local src = share(me == 0 and read_chunk(prompt) or nil)
    if not src then break end
    local outs = gather(capture(function() run(src, env) end))
    if me == 0 then
      io.write(M.format(outs))
      io.stdout:flush()
    end
  end
  if prompt then io.write("\n") end
end

return M
