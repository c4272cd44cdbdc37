-- profiler_write.lua: what loom.profiler's stop() writes from the events
-- the core recorded: the Chrome/Perfetto trace JSON of this rank ("X"
-- events with ts and dur in microseconds, pid the rank, tid the lane), a
-- summary table (time per op and device, % of the step) and, through
-- loom.profiler_plot, a PNG timeline of the last step, one row per rank.
local ffi = require("ffi")
local C = require("loom.lib").C
local fs = require("loom.fs")

local M = {}

local COLL = { [0] = "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier",
               "send", "recv" }
local CAT = { [C.LM_TRACE_OP] = "op", [C.LM_TRACE_BACKWARD] = "backward", [C.LM_TRACE_COLL] = "collective",
              [C.LM_TRACE_GC] = "gc" }

local op_names, dtype_names, device_names = {}, {}, {}
local function op_name(id)
  local s = op_names[id]
  if not s then
    local p = C.lm_op_name(id)
    s = p ~= nil and ffi.string(p) or ("op#" .. id)
    op_names[id] = s
  end
  return s
end
local function dtype_name(d)
  local s = dtype_names[d]
  if not s then
    local p = C.lm_dtype_name(d)
    s = p ~= nil and ffi.string(p) or "?"
    dtype_names[d] = s
  end
  return s
end
local dev_buf = ffi.new("char[32]")
local function device_name(d)
  if d < 0 then return "-" end
  local s = device_names[d]
  if not s then
    s = C.lm_device_name(d, dev_buf, 32) >= 0 and ffi.string(dev_buf) or ("device#" .. d)
    device_names[d] = s
  end
  return s
end

-- the name an event shows: the op, "<op>_backward", the collective, "gc"
local function name_of(e)
  local k = e.kind
  if k == C.LM_TRACE_OP then return op_name(e.id) end
  if k == C.LM_TRACE_BACKWARD then return op_name(e.id) .. "_backward" end
  if k == C.LM_TRACE_COLL then return COLL[e.id] or ("collective#" .. e.id) end
  return "gc"
end
M.name_of = name_of

-- rows of the events (steps apart): { i, s, f (ns), lane, depth, child (ns
-- of events nested in it) }, sorted by lane, then start, outer first; and
-- the step marks' times, in order
local function rows_of(buf, n)
  local rows, marks = {}, {}
  for i = 0, n - 1 do
    local e = buf[i]
    local s = tonumber(e.t0)
    if e.kind == C.LM_TRACE_STEP then marks[#marks + 1] = { s = s, lane = e.tid }
    else rows[#rows + 1] = { i = i, s = s, f = s + tonumber(e.t1 - e.t0), lane = e.tid, depth = 0, child = 0 } end
  end
  table.sort(rows, function(a, b)
    if a.lane ~= b.lane then return a.lane < b.lane end
    if a.s ~= b.s then return a.s < b.s end
    return a.f > b.f
  end)
  local stack, lane = {}, nil
  for _, r in ipairs(rows) do
    if r.lane ~= lane then stack, lane = {}, r.lane end
    while #stack > 0 and not (stack[#stack].s <= r.s and r.f <= stack[#stack].f) do stack[#stack] = nil end
    local top = stack[#stack]
    if top then top.child = top.child + (r.f - r.s) r.depth = #stack end
    stack[#stack + 1] = r
  end
  table.sort(marks, function(a, b) return a.s < b.s end)
  return rows, marks
end

-- the steps: { name, s, f } between the start, each mark and the stop (a
-- last one only when something ran in it); no marks: the whole trace
local function steps_of(rows, marks, t0, t1, first_step)
  local steps = {}
  if #marks == 0 then return { { name = "trace", s = t0, f = t1 } } end
  local b = { t0 }
  for _, m in ipairs(marks) do b[#b + 1] = m.s end
  for k = 1, #b - 1 do steps[k] = { name = "ProfilerStep#" .. (first_step + k - 1), s = b[k], f = b[k + 1] } end
  local last = b[#b]
  for _, r in ipairs(rows) do
    if r.s >= last then
      steps[#steps + 1] = { name = "ProfilerStep#" .. (first_step + #b - 1), s = last, f = t1 }
      break
    end
  end
  return steps
end

-- the lane the step marks were made on, else the busiest one
local function main_lane(rows, marks)
  if #marks > 0 then return marks[1].lane end
  local count, best, most = {}, 1, -1
  for _, r in ipairs(rows) do
    count[r.lane] = (count[r.lane] or 0) + 1
    if count[r.lane] > most and r.lane < C.LM_TRACE_TID_ASYNC then best, most = r.lane, count[r.lane] end
  end
  return best
end

---------------------------------------------------------------------------
-- waiting vs moving data: a collective cannot move data before the last
-- rank of its group arrives. The ranks swap (group key, call number,
-- start) of their collectives; until the last start a rank waited for its
-- peers, after it the data moved. Ranks of one node share the clock.

local function i64_tensor(rows, cols)
  local t = C.lm_empty(2, ffi.new("int64_t[2]", rows, cols), C.LM_I64, C.LM_CPU)
  if t == nil then error(ffi.string(C.lm_last_error()), 0) end
  return t, ffi.cast("int64_t *", C.lm_data(t))
end

local function latest_starts(buf, rows)
  local mine = {}
  for _, r in ipairs(rows) do
    local e = buf[r.i]
    if e.kind == C.LM_TRACE_COLL and e.id < C.LM_COLL_SEND then mine[#mine + 1] = e end
  end
  local world = C.lm_comm_world()
  local held = {}
  local function keep(t) if t == nil then error(ffi.string(C.lm_last_error()), 0) end held[#held + 1] = t return t end
  local ok, res = pcall(function()
    local cnt, pc = i64_tensor(1, 1)
    keep(cnt)
    pc[0] = #mine
    local most = tonumber(ffi.cast("int64_t *", C.lm_data(keep(C.lm_all_reduce(world, cnt, C.LM_RED_MAX))))[0])
    if most == 0 then return {} end
    local t, p = i64_tensor(most, 3)
    keep(t)
    for k = 0, most - 1 do
      local e = mine[k + 1]
      p[3 * k], p[3 * k + 1], p[3 * k + 2] = e and e.a or 0, e and e.b or -1, e and e.t0 or 0
    end
    local g = keep(C.lm_all_gather(world, t, 0, -1))
    local q, latest = ffi.cast("int64_t *", C.lm_data(g)), {}
    for k = 0, tonumber(g.numel_) / 3 - 1 do
      if q[3 * k + 1] >= 0 then
        local key = tostring(q[3 * k]) .. ":" .. tostring(q[3 * k + 1])
        local s = tonumber(q[3 * k + 2])
        if not latest[key] or s > latest[key] then latest[key] = s end
      end
    end
    return latest
  end)
  for _, t in ipairs(held) do C.lm_release(t) end
  if not ok then return nil, res end
  return res
end

---------------------------------------------------------------------------
-- the JSON

local fmt = string.format
local function us(ns) return fmt("%.3f", ns / 1e3) end
local function mb(b) return fmt("%.3f", tonumber(b) / 2^20) end

local function shape_json(e, k)
  local d = {}
  for j = 0, e.ndim[k] - 1 do d[#d + 1] = tostring(tonumber(e.shape[k][j])) end
  return "[" .. table.concat(d, ",") .. "]"
end

local function op_args(e)
  local shapes, dtypes = {}, {}
  for k = 0, math.min(e.n, C.LM_TRACE_INPUTS) - 1 do
    shapes[#shapes + 1] = shape_json(e, k)
    dtypes[#dtypes + 1] = '"' .. dtype_name(e.dtype[k]) .. '"'
  end
  local a = fmt('"shapes":[%s],"dtypes":[%s],"device":"%s","inputs":%d', table.concat(shapes, ","),
                table.concat(dtypes, ","), device_name(e.device), e.n)
  if bit.band(e.flags, C.LM_TRACE_DTENSOR) ~= 0 then a = a .. ',"dtensor":true' end
  if bit.band(e.flags, C.LM_TRACE_FAILED) ~= 0 then a = a .. ',"failed":true' end
  if e.bytes > 0 then a = a .. fmt(',"fresh_bytes":%d,"fresh_mappings":%d', tonumber(e.bytes), tonumber(e.c)) end
  return a
end

local function coll_args(e, split)
  local group = {}
  for q = 0, math.min(e.n, (C.LM_TRACE_INPUTS - 1) * C.LM_MAX_DIMS) - 1 do
    group[#group + 1] = tostring(tonumber(e.shape[1 + math.floor(q / C.LM_MAX_DIMS)][q % C.LM_MAX_DIMS]))
  end
  local a = fmt('"bytes":%d,"group":[%s],"group_size":%d,"group_rank":%d,"call":%d,"async":%s,"waited_ms":%.3f',
                tonumber(e.bytes), table.concat(group, ","), e.n, e.rank, tonumber(e.b),
                e.tid >= C.LM_TRACE_TID_ASYNC and "true" or "false", tonumber(e.c) / 1e6)
  if e.ndim[0] > 0 or e.bytes > 0 then a = a .. fmt(',"dtype":"%s","shape":%s', dtype_name(e.dtype[0]), shape_json(e, 0)) end
  if split then a = a .. fmt(',"peers_wait_ms":%.3f,"transfer_ms":%.3f', split[1] / 1e6, split[2] / 1e6) end
  return a
end

-- every line of the trace, in chunks handed to put
local function write_json(put, o, rows, steps, lane0, latest)
  local pid, out = o.rank, {}
  local function add(s)
    out[#out + 1] = s
    if #out >= 512 then put(table.concat(out, ",\n") .. ",\n") out = {} end
  end
  add(fmt('{"name":"process_name","ph":"M","pid":%d,"args":{"name":"rank %d"}}', pid, pid))
  add(fmt('{"name":"process_sort_index","ph":"M","pid":%d,"args":{"sort_index":%d}}', pid, pid))
  local lanes = { [lane0] = true }
  for _, r in ipairs(rows) do lanes[r.lane] = true end
  for lane in pairs(lanes) do
    local name = lane == lane0 and "main" or lane >= C.LM_TRACE_TID_ASYNC and
                 ("async collectives " .. (lane - C.LM_TRACE_TID_ASYNC + 1)) or ("thread " .. lane)
    add(fmt('{"name":"thread_name","ph":"M","pid":%d,"tid":%d,"args":{"name":"%s"}}', pid, lane, name))
  end
  for _, st in ipairs(steps) do
    add(fmt('{"name":"%s","cat":"step","ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":{}}', st.name,
            us(st.s), us(st.f - st.s), pid, lane0))
  end
  local mem_seen = {}
  for _, r in ipairs(rows) do
    local e = o.buf[r.i]
    local k = e.kind
    local args
    if k == C.LM_TRACE_COLL then
      local s = latest and latest[tostring(e.a) .. ":" .. tostring(e.b)]
      args = coll_args(e, s and { math.max(0, s - r.s), r.f - math.max(s, r.s) })
    elseif k == C.LM_TRACE_GC then
      args = fmt('"live_before_MB":%s,"freed_MB":%s,"fresh_since_last_MB":%s', mb(e.a), mb(e.bytes), mb(e.b))
    else
      args = op_args(e)
    end
    add(fmt('{"name":"%s","cat":"%s","ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":{%s}}', name_of(e),
            CAT[k] or "other", us(r.s), us(r.f - r.s), pid, r.lane, args))
    if k == C.LM_TRACE_OP or k == C.LM_TRACE_BACKWARD then
      if e.bytes > 0 then
        add(fmt('{"name":"fresh pages","cat":"allocator","ph":"i","s":"t","ts":%s,"pid":%d,"tid":%d,'
                .. '"args":{"bytes":%d,"mappings":%d}}', us(r.f), pid, r.lane, tonumber(e.bytes), tonumber(e.c)))
      end
      local dev = device_name(e.device < 0 and 0 or e.device)
      local m = mem_seen[dev]
      if not m or m[1] ~= e.a or m[2] ~= e.b then
        mem_seen[dev] = { e.a, e.b }
        add(fmt('{"name":"%s memory","cat":"allocator","ph":"C","ts":%s,"pid":%d,"args":{"allocated_MB":%s,"reserved_MB":%s}}',
                dev, us(r.f), pid, mb(e.a), mb(e.b)))
      end
    end
  end
  put(table.concat(out, ",\n"))
end

---------------------------------------------------------------------------
-- the summary: per (name, device) calls, self time (less what nested in
-- it), total time, and the self time's share of the steps

local function summarize(o, rows, steps, lane0)
  local window = 0
  for _, st in ipairs(steps) do window = window + (st.f - st.s) end
  local by, covered = {}, 0
  for _, r in ipairs(rows) do
    local e = o.buf[r.i]
    local dev = e.kind == C.LM_TRACE_GC and "lua" or device_name(e.device)
    local name = r.lane >= C.LM_TRACE_TID_ASYNC and name_of(e) .. " (async)" or name_of(e)
    local key = name .. "\0" .. dev
    local a = by[key]
    if not a then
      a = { name = name, device = dev, calls = 0, self = 0, total = 0, async = r.lane >= C.LM_TRACE_TID_ASYNC }
      by[key] = a
    end
    a.calls, a.total = a.calls + 1, a.total + (r.f - r.s)
    a.self = a.self + (r.f - r.s) - r.child
    if r.lane == lane0 and r.depth == 0 then covered = covered + (r.f - r.s) end
  end
  local list = {}
  for _, a in pairs(by) do list[#list + 1] = a end
  table.sort(list, function(a, b) if a.self ~= b.self then return a.self > b.self end return a.name < b.name end)
  local lines = {}
  local what = steps[1].name == "trace" and "the traced time" or
               fmt("%d steps (%s to %s)", #steps, steps[1].name, steps[#steps].name)
  lines[1] = fmt("loom trace summary, rank %d of %d: %s, %.3f ms%s", o.rank, o.world, what, window / 1e6,
                 #steps > 1 and fmt(" (%.3f ms a step)", window / 1e6 / #steps) or "")
  lines[2] = fmt("%-40s %-8s %8s %12s %12s %9s", "name", "device", "calls", "self ms", "total ms", "% of step")
  for _, a in ipairs(list) do
    lines[#lines + 1] = fmt("%-40s %-8s %8d %12.3f %12.3f %9.1f", a.name, a.device, a.calls, a.self / 1e6,
                            a.total / 1e6, window > 0 and 100 * a.self / window or 0)
  end
  local idle = math.max(0, window - covered)
  lines[#lines + 1] = fmt("%-40s %-8s %8s %12.3f %12s %9.1f", "(between ops: Lua, hooks)", "-", "", idle / 1e6, "",
                          window > 0 and 100 * idle / window or 0)
  for _, a in ipairs(list) do
    if a.async then
      lines[#lines + 1] = "(async collectives run beside the rest: with them the shares add up past 100%)"
      break
    end
  end
  if o.dropped > 0 then
    lines[#lines + 1] = fmt("%d events were dropped past the buffer's cap (LOOM_TRACE_MAX_EVENTS)", o.dropped)
  end
  return table.concat(lines, "\n") .. "\n", list
end

---------------------------------------------------------------------------

local function stem_of(path)
  local stem = path:match("^(.-)%.[^./]*$")
  return (stem and stem ~= "" and stem:sub(-1) ~= "/") and stem or path
end

local function write_file(path, fill)
  local ok, err = fs.write_atomic(path, fill)
  if not ok then error("profiler: cannot write " .. path .. ": " .. err, 0) end
end

-- o: { buf, n, t0, t1, first_step, path, quiet, rank, world, exchange, dropped }
function M.write(o)
  local profiler = require("loom.profiler")
  local rows, marks = rows_of(o.buf, o.n)
  local steps = steps_of(rows, marks, tonumber(o.t0), tonumber(o.t1), o.first_step)
  local lane0 = main_lane(rows, marks)
  local latest, why
  if o.exchange then
    if C.lm_dist_local_size() == o.world then latest, why = latest_starts(o.buf, rows)
    else why = "ranks on several nodes: their clocks differ" end
  end
  local trace = profiler.rank_path(o.path, o.rank, o.world)
  local dir = trace:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then fs.mkdir_p(dir) end
  write_file(trace, function(put)
    put('{"traceEvents":[\n')
    write_json(put, o, rows, steps, lane0, latest)
    put(fmt('\n],"displayTimeUnit":"ms","otherData":{"producer":"loom.profiler","rank":%d,"world":%d,'
            .. '"clock":"CLOCK_MONOTONIC","dropped":%d,"wait_split":%s}}\n', o.rank, o.world, o.dropped,
            latest and "true" or fmt('"%s"', why or "one process")))
  end)
  local stem = stem_of(trace)
  local text, list = summarize(o, rows, steps, lane0)
  local summary = stem .. ".summary.txt"
  write_file(summary, function(put) put(text) end)
  if not o.quiet and o.rank == 0 then io.stderr:write(text) end
  local png, png_error = require("loom.profiler_plot").timeline {
    buf = o.buf, rows = rows, step = steps[#steps], lane0 = lane0, rank = o.rank, world = o.world,
    stem = stem_of(o.path), name_of = name_of, exchange = o.exchange }
  return { trace = trace, trace_pattern = profiler.rank_path(o.path, o.world > 1 and "R" or 0, o.world),
           summary = summary, png = png, png_error = png_error, events = #rows + #marks, dropped = o.dropped,
           rank = o.rank, world = o.world, ops = list, steps = #steps, wait_split = latest ~= nil }
end

return M
