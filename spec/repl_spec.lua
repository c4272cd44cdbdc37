-- repl_spec.lua: the SPMD REPL (`scripts/loomrun -n N --repl`) fed chunks on
-- stdin: output grouped by rank, identical output once with its ranks,
-- errors without the REPL's own frames, prompts, a clean exit at the end
-- of input, and idle ranks that sleep. Also loomrun's threads per rank and
-- --bind.
local repl = require("loom.distributed.repl")
local fs = require("loom.fs")

local sys = require("support.sys")
local sh, write = sys.sh, sys.tmpfile
local root = sys.root
local loomrun = root .. "scripts/loomrun"

local function count(s, pat, plain)
  local n, i = 0, 1
  while true do
    local a, b = s:find(pat, i, plain)
    if not a then return n end
    n, i = n + 1, b + 1
  end
end
local function lines_of(s)
  local out = {}
  for l in s:gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end
local function repl_run(n, chunks, env)
  return sys.sh_input((env or "") .. " " .. loomrun .. " -n " .. n .. " --timeout 60 --repl", chunks)
end

-- the `loom` command (scripts/loom), piped and under a pseudo-terminal
local loom_cmd = root .. "scripts/loom"

-- plays keys (send/expect/sleep/eof lines) against `loom` in a pty
local function pty(steps, env)
  local script = write(table.concat(steps, "\n") .. "\n")
  local rc, out = sh((env or "") .. " python3 " .. root .. "spec/support/pty_drive.py " .. script .. " -- " .. loom_cmd)
  os.remove(script)
  return rc, out, tonumber(out:match("@@status=(%-?%d+)"))
end

describe("loom (the REPL command), piped", function()
  local function piped(src) return sys.sh_input(loom_cmd, src) end

  it("keeps top-level locals, echoes expressions, prints sizes as sizes", function()
    local rc, out = piped(table.concat({
      "local x = loom.ones(8, 6)",
      "local function twice(v) local y = v * 2 return y end",
      "x:size()",
      "twice(21), #x:size(), x:size()[2]",
      "x:size() == loom.Size{8, 6}",
      "{1, 2, a = 'b'}",
      "",
    }, "\n"))
    assert.equal(0, rc, out)
    assert.same({ "loom.Size{8, 6}", "42\t2\t6", "true", '{1, 2, a = "b"}' }, lines_of(out))
    assert.is_nil(out:find("loom>", 1, true), "no prompts when stdin is no terminal")
  end)

  it("shows errors without loom's frames and exits 1 when a chunk failed", function()
    local rc, out = piped(table.concat({
      "function f() return loom.zeros(2, 3) + loom.zeros(3, 2) end",
      "function g() local r = f() return r end",
      "g()",
      "print('after')",
      "",
    }, "\n"))
    assert.equal(1, rc, out)
    assert.truthy(out:find("error: ", 1, true), out)
    assert.truthy(out:find("repl:1: in function 'f'", 1, true), out)
    assert.truthy(out:find("after", 1, true), out)
    for _, frame in ipairs { "tensor.lua", "tensor_ops.lua", "lua/loom/", "[C]", "xpcall", "session.lua" } do
      assert.is_nil(out:find(frame, 1, true), frame .. " in:\n" .. out)
    end
    assert.equal(1, (piped("x = = 1\n")))
    assert.equal(0, (piped("x = 1\n")))
  end)

  it("answers help(obj) and ?name from the docstrings, and quit() ends it", function()
    local rc, out = piped("?loom.zeros\nhelp(loom.nn.Linear)\n?zeros\n?nosuchthing\nquit()\nprint('not reached')\n")
    assert.equal(0, rc, out)
    local ds = require("loom.docstrings")
    assert.equal(2, count(out, ds["loom.zeros"], true), out)
    assert.truthy(out:find(ds["nn.Linear"], 1, true), out)
    assert.truthy(out:find("no help for nosuchthing", 1, true), out)
    assert.is_nil(out:find("not reached", 1, true), out)
  end)
end)

describe("loom (the REPL command) under a terminal", function()
  local home
  before_each(function() home = sys.tmpdir() end)
  after_each(function() sys.rmtree(home) end)

  it("edits lines, recalls history across sessions with Up, completes with Tab", function()
    local env = "HOME=" .. home
    local rc, out, code = pty({
      "expect loom> ", "send local x = 21\\r", "expect loom> ",
      "send x * 2\\r", "expect 42", "expect loom> ",
      "send \\x1b[A\\r", "expect 42", "expect loom> ",          -- Up arrow: x * 2 again
      "send z = loom.ze\\t", "expect zeros", "send (2, 3)\\r", "expect loom> ",
      "send z:siz\\t", "expect size", "send ()\\r", "expect loom.Size{2, 3}", "expect loom> ",
      "send quit()\\r",
    }, env)
    assert.equal(0, rc, out)
    assert.equal(0, code, out)
    assert.truthy(out:find("z = loom.zeros(2, 3)\r", 1, true), out)
    assert.truthy(out:find("z:size()\r", 1, true), out)
    local hist = sys.read(home .. "/.loom_history")
    assert.truthy(hist:find("x * 2", 1, true), hist)
    -- a new session recalls the last one's lines
    rc, out, code = pty({ "expect loom> ", "send \\x1b[A\\x1b[A", "expect z:size()", "send \\x03", "expect loom> ",
                          "eof" }, env)
    assert.equal(0, rc, out)
    assert.equal(0, code, out)
  end)

  it("Ctrl-C interrupts a long loop, and clears a line, without ending the session", function()
    local rc, out, code = pty({
      "expect loom> ",
      "send for i = 1, 1e9 do y = loom.zeros(1) end\\r", "sleep 1", "send \\x03",
      "expect interrupted", "expect loom> ",
      "send print('half a line')\\x03", "expect loom> ",
      "send 'alive'\\r", "expect alive", "expect loom> ",
      "send ?loom.ze\\t\\r", "expect a tensor of zeros", "expect loom> ",
      "eof",
    }, "HOME=" .. home)
    assert.equal(0, rc, out)
    assert.equal(0, code, out)
    assert.is_nil(out:find("half a line\r\n", 1, true), out)   -- dropped, never run
    assert.truthy(out:find("error: interrupted", 1, true), out)
  end)
end)

describe("loomrun --repl under a terminal", function()
  it("edits rank 0's lines, completes, and Ctrl-C interrupts every rank or clears the line", function()
    local home = sys.tmpdir()
    local script = write(table.concat({
      "expect loom> ", "send x = dist.rank()\\r", "expect loom> ", "send x\\r", "expect [rank 1] 1", "expect loom> ",
      "send for i = 1, 1e9 do y = loom.zeros(1) end\\r", "sleep 2", "send \\x03",
      "expect [ranks 0-1] error: interrupted (Ctrl-C)", "expect loom> ",
      "send abc\\x03", "expect loom> ", "send dist.get_wo\\t", "expect world_size", "send ()\\r",
      "expect [ranks 0-1] 2", "expect loom> ", "send quit()\\r",
    }, "\n") .. "\n")
    local rc, out = sh("HOME=" .. home .. " python3 " .. root .. "spec/support/pty_drive.py " .. script .. " -- "
                       .. loomrun .. " -n 2 --timeout 60 --repl")
    os.remove(script)
    sys.rmtree(home)
    assert.equal(0, rc, out)
    assert.truthy(out:find("@@status=0", 1, true), out)
    assert.is_nil(out:find("Forwarding signal", 1, true), out)
    assert.is_nil(out:find("abc", out:find("abc", 1, true) + 3, true), "the cleared line ran:\n" .. out)
  end)
end)

describe("the REPL's grouping", function()
  it("labels ranks by ranges", function()
    assert.equal("[rank 2]", repl.label({ 2 }))
    assert.equal("[ranks 0-1]", repl.label({ 0, 1 }))
    assert.equal("[ranks 0-3]", repl.label({ 0, 1, 2, 3 }))
    assert.equal("[ranks 0,2]", repl.label({ 0, 2 }))
    assert.equal("[ranks 0-2,5-6,9]", repl.label({ 0, 1, 2, 5, 6, 9 }))
  end)

  it("prints each distinct output once, in rank order, every line labelled", function()
    assert.equal("[ranks 0-1] a\n[ranks 0-1] b\n", repl.format({ "a\nb\n", "a\nb\n" }))
    assert.equal("[rank 0] x\n[rank 1] y\n", repl.format({ "x\n", "y" }))
    assert.equal("[ranks 1,3] odd\n[ranks 0,2] even\n", repl.format({ "", "odd\n", "", "odd\n" })
                 .. repl.format({ "even\n", "", "even\n", "" }))
    assert.equal("[rank 1] \n", repl.format({ "", "\n" }))
    assert.equal("", repl.format({ "", "" }))
    assert.equal("one rank\n", repl.format({ "one rank" }))   -- a world of one: no labels
  end)
end)

describe("loomrun --repl", function()
  it("groups output by rank, prints identical output once, and exits cleanly at EOF", function()
    local rc, out = repl_run(2, table.concat({
      "x = dist.rank() * 10",
      'print("val", x + 1)',
      "for i = 1, 2 do",
      '  print("loop", i)',
      "end",
      'do io.write("no newline") end',
      "1 + 1, 'two'",
      "print(loom.ones(2))",
      "",
    }, "\n"))
    assert.equal(0, rc, out)
    local ls = lines_of(out)
    assert.same({ "[rank 0] val\t1", "[rank 1] val\t11", "[ranks 0-1] loop\t1", "[ranks 0-1] loop\t2",
                  "[ranks 0-1] no newline", "[ranks 0-1] 2\ttwo" }, { unpack(ls, 1, 6) })
    -- a tensor's print, through the REPL's capture of stdout, once
    assert.equal(1, count(out, "[ranks 0-1] [loom.Tensor f32 cpu of size 2]", true), out)
    assert.equal(8, #ls, out)
  end)

  it("shows errors with the user's frames only, per rank when they differ", function()
    local rc, out = repl_run(2, table.concat({
      'error("boom " .. dist.rank())',
      "function outer() local function f() error('deep') end f() end",
      "outer()",
      "x = = 1",
      'print("still alive")',
      "",
    }, "\n"))
    assert.equal(1, rc, out)   -- a piped REPL whose chunks failed exits 1
    assert.truthy(out:find("[rank 0] error: repl:1: boom 0\n[rank 1] error: repl:1: boom 1\n", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] error: repl:1: deep\n[ranks 0-1] stack traceback:\n", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] \trepl:1: in function 'outer'", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] error: repl:1: unexpected symbol near '='", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] still alive", 1, true), out)
    for _, frame in ipairs { "repl.lua", "runner.lua", "xpcall", "builtin#" } do
      assert.is_nil(out:find(frame, 1, true), frame .. " in:\n" .. out)
    end
  end)

  it("labels output identical on some ranks with those ranks, on 4 ranks", function()
    local rc, out = repl_run(4, 'print("same")\nprint(dist.rank() % 2 == 0 and "even" or "odd")\n')
    assert.equal(0, rc, out)
    assert.same({ "[ranks 0-3] same", "[ranks 0,2] even", "[ranks 1,3] odd" }, lines_of(out))
  end)

  it("prompts with loom> and ...> for the rest of an incomplete chunk", function()
    local rc, out = repl_run(2, "for i = 1, 1 do\nprint(i)\nend\n", "LOOM_REPL_PROMPT=1")
    assert.equal(0, rc, out)
    assert.truthy(out:find("loom> ...> ...> [ranks 0-1] 1\nloom> ", 1, true), out)
    rc, out = repl_run(2, "print(1)\n")   -- stdin is no terminal: no prompts
    assert.equal(0, rc, out)
    assert.equal("[ranks 0-1] 1\n", out)
  end)

  it("uses no CPU while it waits for input (under 5% per rank)", function()
    local dir = os.tmpname()
    os.remove(dir)
    fs.mkdir_p(dir)
    local fifo, out = dir .. "/in", dir .. "/out"
    assert.equal(0, (sh("mkfifo " .. fifo)))
    -- the job reads the fifo; the chunk prints each rank's pid
    os.execute("(" .. loomrun .. " -n 2 --timeout 30 --repl < " .. fifo .. " > " .. out .. " 2>&1; echo \"@@rc=$?\" >> "
               .. out .. ") &")
    local w = assert(io.open(fifo, "w"))
    w:write('local ffi = require("ffi"); pcall(ffi.cdef, "int getpid(void);"); print(ffi.C.getpid())\n')
    w:flush()
    local pids
    for _ = 1, 100 do   -- up to 10 s for the job to start and answer
      local f = io.open(out)
      local s = f and f:read("*a") or ""
      if f then f:close() end
      local a, b = s:match("%[rank 0%] (%d+)\n%[rank 1%] (%d+)\n")
      if a then pids = { a, b } break end
      os.execute("sleep 0.1")
    end
    assert.is_not_nil(pids, "no pids from the REPL")
    local function ticks(pid)
      local f = assert(io.open("/proc/" .. pid .. "/stat"))
      local s = f:read("*a")
      f:close()
      local fields = lines_of(s:gsub("^.*%) ", ""):gsub(" ", "\n"))
      return tonumber(fields[12]) + tonumber(fields[13])   -- utime + stime (fields 14, 15)
    end
    local hz = tonumber(io.popen("getconf CLK_TCK"):read("*l")) or 100
    local t0 = { ticks(pids[1]), ticks(pids[2]) }
    os.execute("sleep 2")
    local t1 = { ticks(pids[1]), ticks(pids[2]) }
    w:close()   -- EOF: the REPL ends
    local s
    for _ = 1, 100 do
      local f = io.open(out)
      s = f:read("*a")
      f:close()
      if s:find("@@rc=", 1, true) then break end
      os.execute("sleep 0.1")
    end
    fs.rm_rf(dir)
    for r = 1, 2 do
      local pct = (t1[r] - t0[r]) / hz / 2 * 100
      assert.is_true(pct < 5, string.format("rank %d used %.0f%% of a CPU while idle", r - 1, pct))
    end
    assert.truthy(s:find("@@rc=0", 1, true), s)
  end)
end)

describe("loomrun threads and --bind", function()
  local cores = tonumber(io.popen("nproc"):read("*l"))
  local probe = write [[
local f = io.open("/proc/self/status")
local s = f:read("*a")
f:close()
print("threads=" .. require("loom").num_threads() .. " cpus=" .. s:match("Cpus_allowed_list:%s*(%S+)"))
]]

  it("never gives ranks x threads more than the cores", function()
    for _, n in ipairs { 1, 2, 3 } do
      local rc, out = sh(loomrun .. " -n " .. n .. " --no-tag " .. probe)
      assert.equal(0, rc, out)
      local total = 0
      for t in out:gmatch("threads=(%d+)") do total = total + tonumber(t) end
      assert.is_true(total <= math.max(cores, n), n .. " ranks: " .. out)
      assert.equal(n, count(out, "threads=", true))
    end
  end)

  it("--bind pins each rank to cores of its own, as many as its threads", function()
    local rc, out = sh(loomrun .. " -n 2 --bind --dry-run " .. probe)
    assert.equal(0, rc, out)
    assert.truthy(out:find("--bind-to hwthread", 1, true) and out:find("--map-by slot:PE=", 1, true), out)
    assert.is_nil(out:find("--bind-to none", 1, true))
    rc, out = sh(loomrun .. " -n " .. (cores + 1) .. " --bind " .. probe)
    assert.equal(2, rc, out)
    assert.truthy(out:find("--bind needs", 1, true), out)
    if cores < 2 then return end
    rc, out = sh(loomrun .. " -n 2 --bind --no-tag " .. probe)
    assert.equal(0, rc, out)
    local sets = {}
    for t, c in out:gmatch("threads=(%d+) cpus=(%S+)") do
      sets[#sets + 1] = c
      assert.equal(math.floor(cores / 2), tonumber(t), out)
    end
    assert.equal(2, #sets, out)
    assert.are_not.equal(sets[1], sets[2])
  end)
end)
