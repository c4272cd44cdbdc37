-- profiler_plot.lua: loom.profiler's PNG timeline of one step (the last
-- one traced), one row per rank: boxes for the ops, backward nodes and
-- collections on each rank's main thread, its collectives drawn over the
-- ops they ran in, async collectives on a thin lane below, the widest
-- boxes labelled. Each rank writes its boxes as text (STEM.R.timeline.dat,
-- STEM.timeline.dat in one process); one rank draws them all with gnuplot.
local C = require("loom.lib").C
local fs = require("loom.fs")

local M = {}
local fmt = string.format

local function shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- the same string on every rank of one job, and another in the next job
local function job_token()
  return os.getenv("PMIX_NAMESPACE") or os.getenv("OMPI_MCA_ess_base_jobid") or os.getenv("OMPI_MCA_orte_ess_jobid")
         or os.getenv("SLURM_JOB_ID") or "-"
end

-- this rank's boxes of the step: "category x0 x1 lane name" (ms from the
-- step's start; lane 0 the main thread's outer events, 1 collectives inside
-- them, 2 async collectives)
local function boxes(o)
  local s0, f0, out = o.step.s, o.step.f, {}
  for _, r in ipairs(o.rows) do
    if r.s >= s0 and r.s < f0 then
      local e = o.buf[r.i]
      local cat = e.kind == C.LM_TRACE_COLL and "collective" or e.kind == C.LM_TRACE_GC and "gc" or
                  e.kind == C.LM_TRACE_BACKWARD and "backward" or "op"
      local lane = r.lane >= C.LM_TRACE_TID_ASYNC and 2 or r.lane ~= o.lane0 and -1 or r.depth == 0 and 0 or
                   cat == "collective" and 1 or -1
      if lane >= 0 then
        out[#out + 1] = fmt("%s %.4f %.4f %d %s", lane == 2 and "async" or cat, (r.s - s0) / 1e6,
                            (math.min(r.f, f0) - s0) / 1e6, lane, o.name_of(e))
      end
    end
  end
  return out
end

local function dat_path(stem, rank, world)
  return world > 1 and fmt("%s.%d.timeline.dat", stem, rank) or stem .. ".timeline.dat"
end

-- the boxes of rank r's file when it belongs to this job: list, step name
local function read_dat(path, token)
  local f = io.open(path, "r")
  if not f then return nil end
  local head = f:read("*l") or ""
  local tok, step = head:match("^# loom timeline (%S+) (%S+)")
  local rows = {}
  if tok == token then
    for line in f:lines() do rows[#rows + 1] = line end
  end
  f:close()
  return tok == token and rows or nil, step
end

local COLORS = { { "op", "#4477aa" }, { "backward", "#ee7733" }, { "collective", "#cc3311" },
                 { "async", "#aa3377" }, { "gc", "#222222" } }
local HALF = { [0] = 0.28, 0.14, 0.06 }
local OFFSET = { [0] = 0, 0, 0.38 }

-- draws every rank's boxes into stem.png; the PNG, or nil and why
local function draw(stem, world, token)
  if os.execute("command -v gnuplot >/dev/null 2>&1") ~= 0 then
    return nil, "gnuplot is not installed (apt-get install gnuplot-nox)"
  end
  local data, labels = {}, {}
  local step, span = "", 0
  for r = 0, world - 1 do
    local rows, name = read_dat(dat_path(stem, r, world), token)
    if not rows then return nil, "rank " .. r .. "'s timeline is missing" end
    step = name
    for _, line in ipairs(rows) do
      local cat, x0, x1, lane, nm = line:match("^(%S+) (%S+) (%S+) (%d) (%S+)")
      x0, x1, lane = tonumber(x0), tonumber(x1), tonumber(lane)
      if cat then
        local y = r + OFFSET[lane]
        data[#data + 1] = fmt("%.4f %.3f %.4f %.4f %.3f %.3f %s", (x0 + x1) / 2, y, x0, x1, y - HALF[lane],
                              y + HALF[lane], cat)
        span = math.max(span, x1)
        if lane == 0 then labels[#labels + 1] = { x0, x1, y, nm } end
      end
    end
  end
  local lab = {}
  for _, l in ipairs(labels) do
    if l[2] - l[1] > 0.06 * span then lab[#lab + 1] = fmt("%.4f %.3f %s", (l[1] + l[2]) / 2, l[3], l[4]) end
  end
  local dfile, lfile, sfile = stem .. ".timeline.boxes", stem .. ".timeline.labels", stem .. ".timeline.gp"
  fs.write_atomic(dfile, function(put) put(table.concat(data, "\n") .. "\n") end)
  fs.write_atomic(lfile, function(put) put(table.concat(lab, "\n") .. "\n") end)
  local ytics = {}
  for r = 0, world - 1 do ytics[#ytics + 1] = fmt("'rank %d' %d", r, r) end
  local plots = {}
  for _, c in ipairs(COLORS) do
    plots[#plots + 1] = fmt("%s using (strcol(7) eq '%s' ? $1 : 1/0):2:3:4:5:6 with boxxyerror fs solid 1.0 "
                            .. "noborder lc rgb '%s' title '%s'", #plots == 0 and shq(dfile) or "''", c[1], c[2], c[1])
  end
  if #lab > 0 then plots[#plots + 1] = shq(lfile) .. " using 1:2:3 with labels noenhanced font ',8' tc rgb 'white' notitle" end
  local png = stem .. ".png"
  local script = table.concat({
    fmt("set terminal png size 1200,%d", 140 + 110 * world),
    fmt("set output %s", shq(png .. ".tmp")),
    fmt("set title %s noenhanced", shq(fmt("loom: %s, one row per rank", step))),
    "set xlabel 'ms from the start of the step'",
    fmt("set yrange [%.2f:-0.6]", world - 0.4),
    fmt("set ytics (%s)", table.concat(ytics, ", ")),
    "set key outside right top",
    "set termoption noenhanced",
    "set datafile missing '?'",
    "plot " .. table.concat(plots, ", \\\n     "),
  }, "\n") .. "\n"
  fs.write_atomic(sfile, function(put) put(script) end)
  local rc = os.execute("gnuplot " .. shq(sfile) .. " >/dev/null 2>&1")
  os.remove(dfile) os.remove(lfile)
  if (rc ~= 0 and rc ~= true) or not fs.exists(png .. ".tmp") then
    os.remove(png .. ".tmp")
    return nil, "gnuplot failed on " .. sfile
  end
  os.remove(sfile)
  fs.rename(png .. ".tmp", png)
  return png
end

-- o: { buf, rows, step, lane0, rank, world, stem, name_of, exchange }:
-- writes this rank's boxes; the rank that draws returns the PNG. With
-- several ranks at a point they all reach (exchange), rank 0 draws after a
-- barrier; at exit, the last rank to find every rank's boxes of this job.
function M.timeline(o)
  local token = job_token()
  local lines = boxes(o)
  local dat = dat_path(o.stem, o.rank, o.world)
  local ok, err = fs.write_atomic(dat, function(put)
    put(fmt("# loom timeline %s %s %.4f\n", token, o.step.name, (o.step.f - o.step.s) / 1e6))
    put(table.concat(lines, "\n") .. "\n")
  end)
  if not ok then return nil, err end
  if o.world > 1 and o.exchange then
    if C.lm_barrier(C.lm_comm_world()) < 0 then return nil, "the ranks could not meet" end
    if o.rank ~= 0 then return nil, "rank 0 draws it" end
  elseif o.world > 1 then
    for r = 0, o.world - 1 do
      if not read_dat(dat_path(o.stem, r, o.world), token) then return nil, "another rank draws it" end
    end
  end
  return draw(o.stem, o.world, token)
end

return M
