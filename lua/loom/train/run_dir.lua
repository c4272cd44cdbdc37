-- run_dir.lua: what a training run writes: its folder (runs/<UTC
-- date-time>: config.json, log.jsonl, the loss plot, checkpoints/), the
-- log's JSON lines, the progress line's clock and terminal, the plot.
local loom = require("loom")
local json = require("dkjson")
local posix = require("loom.posix")
local ffi = require("ffi")

local M = {}

M.now = posix.now

-- one JSON object per line, keys in the given order; numbers with %.17g
-- (dkjson's %.14g is not exact, and resumed runs are compared bit for bit)
function M.json_line(t, order)
  local parts = {}
  for _, k in ipairs(order) do
    local v = t[k]
    if v ~= nil then
      local finite = type(v) == "number" and v == v and math.abs(v) ~= math.huge
      parts[#parts + 1] = json.encode(k) .. ": " .. (finite and string.format("%.17g", v) or json.encode(v))
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

function M.fmt_time(s)
  if s >= 60 then return string.format("%dm%02ds", math.floor(s / 60), math.floor(s % 60)) end
  return string.format("%.1fs", s)
end

-- stdout is a terminal of this process's own: under an MPI launcher it is
-- a pty that mpirun forwards line by line, so no live \r line there
function M.own_terminal()
  return ffi.C.loom_isatty(1) == 1 and not (os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE"))
end

-- the run's folder, runs/<UTC date-time> (rank 0's clock, a suffix when
-- taken: the same name on every rank); --log and --save default into it.
-- Made when the run is about to start (nothing is left by a run that never
-- does), and claimed by an exclusive mkdir, so two runs started in the
-- same second get two folders. A --run-dir that holds another run is
-- refused unless this run resumes it.
-- whether dir holds another run: rank 0 looks, every rank hears its answer
-- (another rank looking after rank 0 has started writing would see this run)
function M.held(dir, w, dist)
  local fs = require("loom.fs")
  local held = w.rank == 0 and (fs.exists(dir .. "/log.jsonl") or fs.exists(dir .. "/checkpoints")) and 1 or 0
  if w.world > 1 then held = dist.broadcast(loom.tensor({ held }, { dtype = "i64" }), 0):totable()[1] end
  return held == 1
end

function M.run_folder(o, w, dist)
  if o["run-dir"] == "none" then return nil end
  local dir, fs = o["run-dir"], require("loom.fs")
  local resumed_run = o.resume:match("^(.+)/checkpoints/*$")
  if dir == "auto" and resumed_run and fs.is_file(resumed_run .. "/config.json") then
    dir = resumed_run   -- a resumed run goes on in its folder
  elseif dir == "auto" then
    local t, k = os.time(), 1
    local function name() return "runs/" .. os.date("!%Y%m%d-%H%M%S", t) .. (k > 1 and "-" .. k or "") end
    if w.rank == 0 then
      fs.mkdir_p("runs")
      while not require("lfs").mkdir(name()) do
        if k > 10000 then error("train.lua: cannot make a folder under runs/ (" .. name() .. ")", 0) end
        k = k + 1
      end
    end
    if w.world > 1 then
      local v = dist.broadcast(loom.tensor({ t, k }, { dtype = "i64" }), 0):totable()
      t, k = v[1], v[2]
    end
    dir = name()
  elseif o.resume == "" and M.held(dir, w, dist) then
    error("train.lua: --run-dir " .. dir .. " holds another run (its log or checkpoints); pass --resume "
          .. dir .. "/checkpoints to go on with it, or another --run-dir", 0)
  end
  if o.log == "" then o.log = dir .. "/log.jsonl" end
  if o.save == "" then o.save = dir .. "/checkpoints" end
  if w.rank == 0 then fs.mkdir_p(dir) end
  return dir
end

function M.write_json(path, t)
  local f = io.open(path, "w")
  if not f then error("train.lua: cannot write " .. path, 0) end
  f:write(json.encode(t, { indent = true }), "\n")
  f:close()
end

-- the loss curve as a PNG next to the log, through gnuplot when it is there
function M.plot(log_path, title)
  if os.execute("command -v gnuplot >/dev/null 2>&1") ~= 0 then
    print("gnuplot is not installed: skipping the loss plot (apt-get install gnuplot-nox)")
    return
  end
  local png = log_path:gsub("%.[^./]*$", "") .. ".png"
  local csv = os.tmpname()
  local f = assert(io.open(csv, "w"))
  for line in io.lines(log_path) do
    local e = json.decode(line)
    if type(e) == "table" and e.step and e.loss then
      f:write(string.format("%d %.17g %s\n", e.step, e.loss, e.val_loss and string.format("%.17g", e.val_loss) or "NaN"))
    end
  end
  f:close()
  local script = string.format([[set terminal png size 800,480; set output '%s'; set title '%s' noenhanced;
set xlabel 'step'; set ylabel 'loss';
set datafile missing 'NaN'; plot '%s' using 1:2 with lines title 'train', '' using 1:3 with linespoints title 'val']],
    png, (title or ""):gsub("['\"\\]", ""), csv)
  local ok = os.execute("gnuplot -e \"" .. script:gsub("\n", " ") .. "\" 2>/dev/null")
  os.remove(csv)
  print(ok == 0 and "loss curve: " .. png or "gnuplot failed: no plot")
end

return M
