-- profiler.lua: loom.profiler, a trace of where the time goes, read the way
-- a torch.profiler trace is: start(), step() at the end of each training
-- step, stop(). While it runs, the C core records every op call (the op
-- door), every backward node, every collective, and loom's GC pacing its
-- collections; stop() writes them as Chrome/Perfetto trace JSON (one file
-- per rank), a summary table and a PNG timeline of one step
-- (loom.profiler_write). LOOM_PROFILE=trace:FILE traces a whole run, from
-- require("loom") to the end of the script.
local ffi = require("ffi")
local C = require("loom.lib").C

local M = {}

local run = nil   -- while tracing: { path, first_step, steps, t0, quiet }
local mark = ffi.new("lm_trace_event")

local function argerror(fname, arg, expected, got)
  error(string.format("profiler.%s: argument '%s' expected %s, got %s", fname, arg, expected, got), 3)
end

-- the file of `rank` of `world` ranks: path itself in one process, else
-- the rank before the extension (t.json -> t.0.json; t -> t.0)
function M.rank_path(path, rank, world)
  if world <= 1 then return path end
  local stem, ext = path:match("^(.-)(%.[^./]*)$")
  if not stem or stem == "" or stem:sub(-1) == "/" then stem, ext = path, "" end
  return string.format("%s.%s%s", stem, tostring(rank), ext)
end

-- this process's rank and the world's size: the runtime's once it is up,
-- else the launcher's environment (a script that never used
-- loom.distributed still gets one file per rank)
function M.rank_world()
  if C.lm_dist_is_initialized() == 1 then return C.lm_dist_rank(), C.lm_dist_world_size() end
  for _, v in ipairs { { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" }, { "PMI_RANK", "PMI_SIZE" } } do
    local r, w = tonumber(os.getenv(v[1]) or ""), tonumber(os.getenv(v[2]) or "")
    if r and w then return r, w end
  end
  return 0, 1
end

function M.running() return run ~= nil end

-- start{path = "trace.json", first_step = 1, quiet = false}: traces from
-- now on into path (one file per rank, M.rank_path); first_step numbers
-- the first step (ProfilerStep#first_step); quiet: no summary on stderr
function M.start(opts)
  opts = opts or {}
  if type(opts) ~= "table" then argerror("start", "opts", "a table", type(opts)) end
  local path, first = opts.path or "trace.json", opts.first_step or 1
  if type(path) ~= "string" or path == "" then argerror("start", "path", "a file name", tostring(path)) end
  if type(first) ~= "number" or first ~= math.floor(first) then
    argerror("start", "first_step", "an integer", tostring(first))
  end
  if run then error("profiler.start: already tracing into " .. run.path .. " (stop() first)", 2) end
  C.lm_trace_clear()
  run = { path = path, first_step = first, steps = 0, quiet = opts.quiet, t0 = C.lm_trace_now() }
  C.lm_trace_enable(1)
end

-- step(): the current step ends here and the next begins (as
-- torch.profiler's step()); nothing when not tracing
function M.step()
  if not run then return end
  mark.kind, mark.id = C.LM_TRACE_STEP, run.first_step + run.steps
  mark.t0 = C.lm_trace_now()
  mark.t1 = mark.t0
  C.lm_trace_record(mark)
  run.steps = run.steps + 1
end

-- the recorded events, oldest first in the buffer: a cdata array and its length
local function drain()
  local n = tonumber(C.lm_trace_pending())
  local buf = ffi.new("lm_trace_event[?]", math.max(n, 1))
  return buf, tonumber(C.lm_trace_drain(buf, n))
end

-- cancel(): stops tracing and drops what was recorded
function M.cancel()
  C.lm_trace_enable(0)
  C.lm_trace_clear()
  run = nil
end

-- stop({exiting = bool}): stops tracing and writes the trace, its summary
-- and the timeline; returns { trace = file, summary = file, png = file or
-- nil, png_error = why not, events = count, dropped = count, rank, world }.
-- Every rank calls it at the same point (it exchanges collectives' start
-- times to tell waiting from moving data), except at exit, where nothing
-- is exchanged. Nil when not tracing.
function M.stop(opts)
  if not run then return nil end
  C.lm_trace_enable(0)
  local r, t1 = run, C.lm_trace_now()
  run = nil
  local buf, n = drain()
  local dropped = tonumber(C.lm_trace_dropped())
  C.lm_trace_clear()
  local rank, world = M.rank_world()
  local exchange = not (opts and opts.exiting) and world > 1 and C.lm_dist_is_initialized() == 1
  return require("loom.profiler_write").write {
    buf = buf, n = n, t0 = r.t0, t1 = t1, first_step = r.first_step, path = r.path, quiet = r.quiet,
    rank = rank, world = world, exchange = exchange, dropped = dropped,
  }
end

-- for_steps("A:B", default_path): what examples/train.lua calls at the top
-- of each step (tick(step)) and once after its loop (tick()): tracing
-- starts at step A, step() marks each step after, and it stops before step
-- B + 1 (or after the loop). The file: LOOM_PROFILE's trace:FILE when set
-- (a whole-run trace it started is dropped), else default_path. "": tick
-- does nothing.
function M.for_steps(spec, default_path)
  if spec == nil or spec == "" then return function() end end
  local a, b = tostring(spec):match("^(%d+):(%d+)$")
  a, b = tonumber(a), tonumber(b)
  if not a or a < 1 or b < a then
    error("--profile-steps: expected A:B with 1 <= A <= B (steps A to B traced), got " .. tostring(spec), 0)
  end
  local path = M.env_path() or default_path
  if run then M.cancel() end
  local mine = false
  return function(step)
    if mine and (step == nil or step > b) then
      mine = false
      local res = M.stop()
      if res then M.announce(res) end
    elseif mine then
      M.step()
    elseif step and step >= a and step <= b and not run then
      M.start { path = path, first_step = step }
      mine = true
    end
  end
end

-- one line on stderr naming what a trace wrote (rank 0, or one process)
function M.announce(res)
  if res.rank ~= 0 then return end
  io.stderr:write(string.format("loom profiler: %d events in %s%s; summary %s%s\n", res.events,
                                res.trace_pattern, res.dropped > 0 and string.format(" (%d dropped past LOOM_TRACE_MAX_EVENTS)", res.dropped) or "",
                                res.summary, res.png and "; timeline " .. res.png or
                                  (res.png_error and "; no timeline: " .. res.png_error or "")))
end

-- LOOM_PROFILE=trace:FILE -> FILE; nil when LOOM_PROFILE asks no trace
-- (LOOM_PROFILE=1 is the core's table of time per op, printed at exit)
function M.env_path()
  local v = os.getenv("LOOM_PROFILE")
  if not v or not v:match("^trace:") then return nil end
  local path = v:sub(7)
  if path == "" then error("LOOM_PROFILE: expected trace:FILE (a file name after trace:), got '" .. v .. "'", 0) end
  return path
end

-- from_env(): require("loom") calls it: LOOM_PROFILE=trace:FILE starts
-- tracing, and the trace is written when the Lua state closes (the script
-- ends, or raises); os.exit(code) without its second argument true skips that
function M.from_env()
  local path = M.env_path()
  if not path or run then return end
  M.start { path = path }
  M._at_exit = ffi.gc(ffi.new("char[1]"), function()
    local ok, res = pcall(M.stop, { exiting = true })
    if ok and res then M.announce(res)
    elseif not ok then io.stderr:write("loom profiler: writing the trace failed: ", tostring(res), "\n") end
  end)
end

return M
