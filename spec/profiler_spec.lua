-- profiler_spec.lua: loom.profiler and LOOM_PROFILE=trace:FILE in one
-- process: the trace opens as Chrome trace JSON with the ops (names,
-- shapes, dtypes, device), backward nodes, step marks, the collections
-- loom's GC pacing runs and the allocator's counters; the summary and the
-- timeline beside it; the file naming rule; examples/train.lua's
-- --profile-steps; and nothing recorded while tracing is off.
local loom = require("loom")
local TJ = require("support.trace_json")
local sys = require("support.sys")
local profiler = require("loom.profiler")
local gc_pacing = require("loom.gc_pacing")
local C = loom.C

local function decode(path)
  local ok, j = TJ.read(path)
  assert(ok, "not JSON: " .. path .. ": " .. tostring(j))
  assert.is_table(j.traceEvents, "no traceEvents in " .. path)
  return j
end

local find = TJ.find

local function is_png(path) return sys.exists(path) and sys.read(path):sub(1, 8) == "\137PNG\r\n\26\n" end

describe("loom.profiler", function()
  local dir
  before_each(function() dir = sys.tmpdir() end)
  after_each(function() profiler.cancel() sys.rmtree(dir) end)

  it("names one file per rank: the rank before the extension", function()
    assert.equal("t.json", profiler.rank_path("t.json", 0, 1))
    assert.equal("t.0.json", profiler.rank_path("t.json", 0, 2))
    assert.equal("t.1.json", profiler.rank_path("t.json", 1, 2))
    assert.equal("out/t.3.json", profiler.rank_path("out/t.json", 3, 4))
    assert.equal("t.tar.1.json", profiler.rank_path("t.tar.json", 1, 2))
    assert.equal("a.d/t.1", profiler.rank_path("a.d/t", 1, 2))   -- a dot in a folder is no extension
    assert.equal("t.1", profiler.rank_path("t", 1, 2))
  end)

  it("traces ops with their shapes, dtypes and device, backward nodes and steps, as Chrome trace JSON", function()
    local path = dir .. "/t.json"
    local a, b = loom.randn(64, 32), loom.randn(32, 16)
    a.requires_grad = true
    profiler.start { path = path, quiet = true }
    for _ = 1, 2 do
      a:matmul(b):sum():backward()
      profiler.step()
    end
    local res = profiler.stop()
    assert.equal(path, res.trace)
    local j = decode(path)
    local mm = find(j, { name = "matmul", cat = "op", ph = "X" })
    assert.equal(2, #mm)
    assert.same({ { 64, 32 }, { 32, 16 } }, mm[1].args.shapes)
    assert.same({ "f32", "f32" }, mm[1].args.dtypes)
    assert.equal("cpu", mm[1].args.device)
    assert.equal(0, mm[1].pid)
    assert.is_true(mm[1].dur > 0 and mm[1].ts > 0)
    assert.equal(2, #find(j, { name = "matmul_backward", cat = "backward", ph = "X" }))
    local s1, s2 = find(j, { name = "ProfilerStep#1", ph = "X" })[1], find(j, { name = "ProfilerStep#2", ph = "X" })[1]
    assert.is_table(s1) assert.is_table(s2)
    -- the first matmul ran in step 1, the second in step 2
    assert.is_true(s1.ts <= mm[1].ts and mm[1].ts + mm[1].dur <= s1.ts + s1.dur + 1e-3)
    assert.is_true(s2.ts <= mm[2].ts and mm[2].ts + mm[2].dur <= s2.ts + s2.dur + 1e-3)
    assert.is_true(#find(j, { name = "cpu memory", ph = "C" }) > 0, "no allocator counter")
    -- the summary beside it: matmul's 2 calls; and the timeline of step 2
    local summary = sys.read(dir .. "/t.summary.txt")
    assert.truthy(summary:match("\nmatmul%s+cpu%s+2%s"), summary)
    assert.truthy(summary:find("2 steps (ProfilerStep#1 to ProfilerStep#2)", 1, true), summary)
    assert.equal(dir .. "/t.png", res.png, res.png_error)
    assert.is_true(is_png(res.png))
  end)

  it("marks the collections loom's GC pacing runs, and fresh pages the allocator maps", function()
    local path = dir .. "/gc.json"
    -- outputs of a size class of their own (12 MiB + 28 bytes) pile up
    -- until the pacing collects: the allocator maps fresh pages for them.
    -- (Not loom.empty_cache(): its malloc_trim walk of malloc's heap is
    -- left to cpu_alloc_spec; see docs/reliability.md.)
    profiler.start { path = path, quiet = true }
    local before = gc_pacing.collections()
    local x = loom.empty(3 * 2^20 + 7):fill_(1)
    for _ = 1, 400 do   -- dead 4 MB outputs pile up until the pacing collects
      x = x + 1
      if gc_pacing.collections() > before + 1 then break end
    end
    profiler.stop()
    assert.is_true(x:min():item() >= 2)
    assert.is_true(gc_pacing.collections() > before, "no collection ran")
    local gcs = find(decode(path), { cat = "gc", ph = "X" })
    assert.is_true(#gcs >= 1, "no gc event")
    assert.is_true(gcs[1].args.live_before_MB > 0 and gcs[1].args.freed_MB >= 0)
    local fresh = find(decode(path), { name = "fresh pages", ph = "i" })
    assert.is_true(#fresh >= 1, "no fresh pages event")
    assert.is_true(fresh[1].args.bytes >= 2^20)
  end)

  it("records nothing while off (LOOM_PROFILE unset)", function()
    assert.equal(0, C.lm_trace_enabled())
    C.lm_trace_clear()
    local x = loom.randn(8, 8)
    x.requires_grad = true
    local y = x:matmul(x):sum()
    y:backward()
    assert.is_true(y:item() == y:item())
    assert.equal(0, tonumber(C.lm_trace_pending()))
    assert.equal(0, tonumber(C.lm_trace_dropped()))
    -- a fresh process without LOOM_PROFILE starts none
    local rc, out = sys.luajit('print(require("loom.profiler").running(), require("loom").C.lm_trace_enabled())',
                               "env -u LOOM_PROFILE")
    assert.equal(0, rc, out)
    assert.equal("false\t0", out:match("[^\n]*"))
  end)

  it("refuses bad arguments, naming them", function()
    assert.has_error(function() profiler.start { path = 5 } end,
                     "profiler.start: argument 'path' expected a file name, got 5")
    profiler.start { path = dir .. "/x.json", quiet = true }
    assert.has_error(function() profiler.start { path = dir .. "/y.json" } end)
    profiler.cancel()
    assert.is_nil(profiler.stop())
    assert.has_error(function() profiler.for_steps("3:2") end,
                     "--profile-steps: expected A:B with 1 <= A <= B (steps A to B traced), got 3:2")
  end)

  it("LOOM_PROFILE=trace:FILE traces a whole script, written when it ends", function()
    local path = dir .. "/env.json"
    local rc, out = sys.luajit('local loom = require("loom") local x = loom.randn(16, 8) x = x:matmul(x:t())',
                               "LOOM_PROFILE=trace:" .. path)
    assert.equal(0, rc, out)
    assert.truthy(out:find("loom profiler: ", 1, true), out)
    local mm = find(decode(path), { name = "matmul", ph = "X" })
    assert.equal(1, #mm)
    assert.same({ { 16, 8 }, { 8, 16 } }, mm[1].args.shapes)
    -- and an empty file name is refused when loom loads
    rc, out = sys.luajit('require("loom")', "LOOM_PROFILE=trace:")
    assert.are_not.equal(0, rc)
    assert.truthy(out:find("LOOM_PROFILE: expected trace:FILE", 1, true), out)
  end)

  it("LOOM_PROFILE=trace:FILE on 2 ranks writes FILE.0 and FILE.1 and one timeline", function()
    local script = sys.tmpfile([[
local loom = require("loom")
local dist = require("loom.distributed")
local t = loom.ones(1000)
for _ = 1, 2 do t = dist.all_reduce(t, "sum") / 2 end
]], ".lua")
    local rc, out = sys.sh_clean("LOOM_PROFILE=trace:" .. dir .. "/r.json " .. sys.root .. "scripts/loomrun -n 2 "
                                 .. script)
    os.remove(script)
    assert.equal(0, rc, out)
    assert.is_false(sys.exists(dir .. "/r.json"), "one file for both ranks")
    for r = 0, 1 do
      local j = decode(dir .. "/r." .. r .. ".json")
      local ar = find(j, { name = "all_reduce", cat = "collective" })
      assert.equal(2, #ar)
      assert.equal(4000, ar[1].args.bytes)
      assert.equal(2, ar[1].args.group_size)
      assert.equal(r, ar[1].pid)
    end
    assert.is_true(is_png(dir .. "/r.png"), out)
  end)

  it("examples/train.lua --profile-steps A:B traces steps A to B only", function()
    local run = dir .. "/run"
    local rc, out = sys.sh_clean("env -u LOOM_PROFILE luajit " .. sys.root .. "examples/train.lua --steps 4 --batch 2 "
                                 .. "--seq 16 --dim 32 --layers 1 --heads 2 --eval-every 100 --sample 0 --quiet "
                                 .. "--profile-steps 2:3 --run-dir " .. run)
    assert.equal(0, rc, out)
    local j = decode(run .. "/trace.json")
    local names = {}
    for _, e in ipairs(find(j, { cat = "step", ph = "X" })) do names[#names + 1] = e.name end
    table.sort(names)
    assert.same({ "ProfilerStep#2", "ProfilerStep#3" }, names)
    assert.is_true(#find(j, { name = "matmul", cat = "op" }) > 0)
    assert.is_true(#find(j, { cat = "backward" }) > 0)
    assert.truthy(sys.read(run .. "/trace.summary.txt"):find("ProfilerStep#2 to ProfilerStep#3", 1, true))
    assert.is_true(is_png(run .. "/trace.png"))
  end)
end)
