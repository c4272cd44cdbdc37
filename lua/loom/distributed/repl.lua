-- repl.lua: the SPMD REPL behind `loomrun -n N --repl`. Rank 0 reads a
-- chunk (through readline on the terminal loomrun names, as the `loom`
-- command does: lua/loom/repl/); every rank runs it in its session
-- (lua/loom/repl/session.lua) with its stdout captured; rank 0 prints what the ranks
-- wrote, in rank order, output identical on several ranks once, labelled
-- with their ranks ("[ranks 0-3] ..."). Ranks waiting for the next chunk
-- sleep (a non-blocking broadcast, polled) instead of spinning a core.
local ffi = require("ffi")
local C = ffi.C

require("loom.posix")   -- declares the libc functions used here

local M = {}

local function dist() return require("loom.distributed") end

---------------------------------------------------------------------------
-- strings between ranks

-- a string as an i64 tensor (8 bytes an element, zero padded to n bytes)
local function pack(s, n)
  local TC = require("loom.tensor_create")
  local t = TC.zeros({ math.max(1, math.ceil(n / 8)) }, { dtype = "i64" })
  ffi.copy(t:data_ptr(), s, #s)
  return t
end

local ts = ffi.new("loom_timespec")
local function sleep(s)
  ts.tv_sec, ts.tv_nsec = math.floor(s), (s % 1) * 1e9
  C.loom_nanosleep(ts, nil)
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
  local D, loom = dist(), require("loom")
  local world = D.world_group()
  local n = loom.tensor({ s and #s or -1 }, { dtype = "i64" })
  n = wait_idle(D.broadcast(n, 0, world, nil, { async_op = true })):item()
  if n < 0 then return nil end
  local buf = D.broadcast(pack(s or "", n), 0, world)
  return ffi.string(buf:data_ptr(), n)
end

-- gather(s): every rank's s, on every rank, as a list indexed by rank + 1
local function gather(s)
  local D, loom = dist(), require("loom")
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
  C.loom_fflush(nil)
  local f = C.loom_tmpfile()
  if f == nil then fn() return "" end
  local fd, saved = C.loom_fileno(f), C.loom_dup(1)
  C.loom_dup2(fd, 1)
  local ok, err = pcall(fn)
  io.stdout:flush()
  C.loom_fflush(nil)
  C.loom_dup2(saved, 1)
  C.loom_close(saved)
  local size = tonumber(C.loom_lseek(fd, 0, 2))
  C.loom_lseek(fd, 0, 0)
  local buf, got = ffi.new("char[?]", math.max(1, size)), 0
  while got < size do
    local r = tonumber(C.loom_read(fd, buf + got, size - got))
    if r <= 0 then break end
    got = got + r
  end
  C.loom_fclose(f)
  local out = ffi.string(buf, got)
  if not ok then out = out .. "error: " .. tostring(err) .. "\n" end
  return out
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

-- the terminal rank 0 edits lines on: loomrun --repl names it
-- (LOOM_REPL_TTY) when its stdin is one, as mpirun gives ranks pipes
local function open_tty()
  local path = os.getenv("LOOM_REPL_TTY")
  if not path or path == "" then return nil end
  local fd = C.loom_open(path, 2 + 256)   -- O_RDWR | O_NOCTTY: loomrun keeps the Ctrl-C
  if fd < 0 then return nil end
  local f = C.loom_fdopen(fd, "r+")
  if f == nil then C.loom_close(fd) return nil end
  return f, fd
end

-- rank 0's line reader: readline on the terminal, else plain lines
local function reader_for(env)
  local top = require("loom.repl")
  local f, fd = open_tty()
  if f then
    local r = top.reader(env, true)
    if r.rl then
      r.rl.loom_rl_instream, r.rl.loom_rl_outstream = f, f
      r.tty_fd = fd
      return r
    end
  end
  return (top.reader(env, false))
end

-- settle(): the first collective after a chunk, on every rank, tried
-- again while it fails at its fingerprint (which no rank gets past, so
-- every rank tries again in step). A rank that left the chunk on its own
-- (Ctrl-C in pure Lua or local ops) marks its fingerprint, so this
-- collective fails on every rank, which try again together; a rank still
-- waiting in a collective of the chunk on the world communicator (its
-- peer left the chunk by Ctrl-C or an error) meets this one instead, whose
-- shape no user's collective has, fails it, leaves the chunk and comes
-- here. (A rank waiting on another communicator waits on: Ctrl-\ ends the
-- session.)
local SETTLE = { 1, 3, 5, 7 }
local function settle()
  local D, TC = dist(), require("loom.tensor_create")
  local t = TC.zeros(SETTLE, { dtype = "i64" })
  for _ = 1, 100 do
    local ok, err = pcall(D.all_gather, t, 1, D.world_group())
    if ok then return end
    err = tostring(err)
    if not (err:find("interrupted", 1, true) or err:find("collective mismatch", 1, true)) then error(err, 0) end
  end
  error("loom REPL: the ranks cannot agree after an interrupted chunk", 0)
end

-- run(): the loop, on every rank, until rank 0's input ends (or quit())
function M.run()
  local loom, D = require("loom"), dist()
  D.init()
  D.set_debug_collectives(true)   -- the fingerprints carry each rank's Ctrl-C vote
  local session = require("loom.repl.session")
  local me = D.rank()
  local s = session.new { env = { dist = D }, spmd = true }
  session.install_interrupt()
  local reader = me == 0 and reader_for(s.env)
  local out = io.stdout
  if reader and reader.tty_fd then   -- write where the prompts go, in order with them
    out = { write = function(_, text) C.loom_write(reader.tty_fd, text, #text) end, flush = function() end }
  end
  if reader and reader.tty_fd then out:write(require("loom.repl").BANNER .. "\n") end
  local failed = 0
  while not s.quit do
    local src = share(me == 0 and require("loom.repl").read_chunk(reader) or nil)
    if not src then break end
    local before = s.failed
    local out_text = capture(function() s:run(src) end)
    settle()
    -- a collective of the chunk that met a peer's settle(): say so plainly
    out_text = out_text:gsub("collective mismatch in a group of %d+ ranks: rank %d+ issued ([^\n]-), but rank (%d+) "
                             .. "issued call #%d+ all_gather%(dim 1%) of i64 %[1, 3, 5, 7%]",
                             "%1 was left waiting: rank %2 had left the chunk (its error says why)")
    local outs = gather(out_text)
    local fails = gather(s.failed > before and "1" or "")
    if me == 0 then
      out:write(M.format(outs))
      out:flush()
      if table.concat(fails) ~= "" then failed = failed + 1 end
    end
  end
  if reader then
    reader:close()
    if reader.tty_fd and not s.quit then out:write("\n") end
    -- loomrun --repl exits 1 when input was piped and a chunk failed
    local status = os.getenv("LOOM_REPL_STATUS")
    if status and status ~= "" and not reader.tty_fd and failed > 0 then
      local f = io.open(status, "w")
      if f then f:write("1\n") f:close() end
    end
  end
  local _ = loom
end

return M
