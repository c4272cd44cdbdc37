-- bench.lua: what the scripts/bench_* share: a monotonic clock, flag
-- parsing, medians, a plain table printer and a JSON writer.
local M = {}

-- now(): seconds on the monotonic clock
M.now = require("loom.posix").now

-- args(argv, defaults, prog): --name value flags over number, string or
-- boolean defaults (lua-argparse through loom.cli); --help lists them.
function M.args(argv, defaults, prog)
  local cli = require("loom.train.cli")
  return cli.parse(prog or "bench", cli.flags_of(defaults), argv)
end

function M.median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end   -- (unpack overflows the stack on long lists)
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

function M.min(t)
  local m = math.huge
  for _, v in ipairs(t) do m = math.min(m, v) end
  return m
end

function M.max(t)
  local m = -math.huge
  for _, v in ipairs(t) do m = math.max(m, v) end
  return m
end

-- best(fn, n): the fewest seconds one of n calls of fn took
function M.best(fn, n)
  local best = math.huge
  for _ = 1, n do
    local t0 = M.now()
    fn()
    best = math.min(best, M.now() - t0)
  end
  return best
end

-- time(fn, n): median seconds of n calls after two warm-up calls
function M.time(fn, n)
  fn() fn()
  local ts_ = {}
  for i = 1, n do
    local t0 = M.now()
    fn()
    ts_[i] = M.now() - t0
  end
  return M.median(ts_)
end

local function cell(v)
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format(math.abs(v) >= 100 and "%.1f" or "%.3f", v)
  end
  return tostring(v)
end

-- table(header, rows): aligned columns
function M.table(header, rows)
  local w = {}
  for c, h in ipairs(header) do w[c] = #h end
  for _, r in ipairs(rows) do for c = 1, #header do w[c] = math.max(w[c], #cell(r[c])) end end
  local function line(r)
    local parts = {}
    for c = 1, #header do
      local s = cell(r[c])
      parts[c] = c == 1 and s .. string.rep(" ", w[c] - #s) or string.rep(" ", w[c] - #s) .. s
    end
    print(table.concat(parts, "  "))
  end
  line(header)
  local sep = {}
  for c = 1, #header do sep[c] = string.rep("-", w[c]) end
  print(table.concat(sep, "  "))
  for _, r in ipairs(rows) do line(r) end
end

-- write_json(path, value): value as JSON (dkjson), one object per file
function M.write_json(path, value)
  local text = assert(require("dkjson").encode(value, { indent = true }))
  local f, err = io.open(path, "w")
  if not f then error("write_json: cannot open " .. path .. ": " .. tostring(err), 2) end
  f:write(text, "\n")
  f:close()
end

return M
