-- repl_interrupt_spec.lua: the REPL survives Ctrl-C in every state, driven
-- through a pseudo-terminal (spec/support/pty_drive.py) as a person types.
-- One process (scripts/loom): a pure-Lua loop (compiled traces call no
-- hooks: the chunks run with the JIT off), a function an earlier chunk
-- defined, code the session loaded. Two ranks (loomrun --repl): a pure-Lua
-- loop, a loop of collectives (the ranks stop at the same collective, no
-- "collective mismatch"), a loop on one rank only, one rank looping while
-- the other waits in a collective; closing the terminal or Ctrl-\ ends
-- every rank and mpirun. After each, the session answers the next chunk.
local sys = require("support.sys")
local root = sys.root

-- plays the steps (pty_drive.py's send/expect/sleep/eof/hangup lines, or
-- lists of them) against cmd
local function pty(steps, cmd)
  local flat = {}
  for _, s in ipairs(steps) do
    if type(s) == "table" then for _, x in ipairs(s) do flat[#flat + 1] = x end else flat[#flat + 1] = s end
  end
  local script = sys.tmpfile(table.concat(flat, "\n") .. "\n")
  local home = sys.tmpdir()
  local rc, out = sys.sh("HOME=" .. home .. " python3 " .. root .. "spec/support/pty_drive.py " .. script .. " -- " .. cmd)
  os.remove(script)
  sys.rmtree(home)
  return rc, out:gsub("\r", ""), tonumber(out:match("@@status=(%-?%d+)"))
end

-- steps: Ctrl-C after `wait` seconds of chunk, then the expected lines
local function interrupt(chunk, wait, ...)
  local steps = { "send " .. chunk .. "\\r", "sleep " .. wait, "send \\x03" }
  for _, e in ipairs { ... } do steps[#steps + 1] = "expect " .. e end
  steps[#steps + 1] = "expect loom> "
  return steps
end

local function alive(label)
  return { "send 'still ' .. 'here'\\r", "expect " .. label .. "still here", "expect loom> " }
end

describe("Ctrl-C in the REPL of one process", function()
  it("stops a pure-Lua loop, a function of an earlier chunk, and loaded code", function()
    local rc, out, status = pty({
      "expect loom> ",
      interrupt("while true do end", 1, "error: interrupted (Ctrl-C)"),
      alive(""),
      "send function spin() local n = 0 while true do n = n + 1 end end\\r", "expect loom> ",
      interrupt("spin()", 1, "error: interrupted (Ctrl-C)"),
      "send f = loadstring('while true do end')\\r", "expect loom> ",
      interrupt("f()", 1, "interrupted (Ctrl-C)"),
      alive(""),
      "eof",
    }, root .. "scripts/loom")
    assert.equal(0, rc, out)
    assert.equal(0, status, out)
  end)
end)

describe("Ctrl-C in the REPL of two ranks", function()
  local loomrun = root .. "scripts/loomrun -n 2 --timeout 120 --repl"

  it("stops a pure-Lua loop, a loop of collectives and a loop on one rank, and the session goes on", function()
    local rc, out, status = pty({
      "expect loom> ",
      interrupt("while true do end", 2, "[ranks 0-1] error: interrupted (Ctrl-C)"),
      alive("[ranks 0-1] "),
      "send x = loom.ones(4)\\r", "expect loom> ",
      interrupt("for i = 1, 1e9 do y = dist.all_reduce(x) z = dist.all_gather(x, 1) end", 2,
                "[ranks 0-1] error: interrupted (Ctrl-C)"),
      alive("[ranks 0-1] "),
      interrupt("if dist.rank() == 1 then while true do end end", 2, "[rank 1] error: interrupted (Ctrl-C)"),
      alive("[ranks 0-1] "),
      -- rank 0 waits in a collective that rank 1, looping, never reaches
      interrupt("if dist.rank() == 1 then while true do end end y = dist.all_reduce(x)", 2,
                "[ranks 0-1] error: interrupted (Ctrl-C)"),
      alive("[ranks 0-1] "),
      "send dist.all_reduce(x):sum():item()\\r", "expect [ranks 0-1] 8", "expect loom> ",
      "send quit()\\r",
    }, loomrun)
    assert.equal(0, rc, out)
    assert.equal(0, status, out)
    assert.is_nil(out:find("mismatch", 1, true), out)
    assert.is_nil(out:find("traceback", 1, true), out)
  end)

  -- the world ranks' pids and mpirun's, from a chunk; then whether any lives on
  local function pids_of(out)
    local pids = {}
    for pid, ppid in out:gmatch("@@pid%s+(%d+)%s+(%d+)") do
      pids[#pids + 1] = pid
      pids[#pids + 1] = ppid
    end
    return pids
  end
  local function left(pids)
    for _ = 1, 100 do
      local alive_now = {}
      for _, p in ipairs(pids) do
        local f = io.open("/proc/" .. p .. "/stat")
        if f then
          local st = f:read("*l") or ""
          f:close()
          if not st:match("^%d+ %b() Z") then alive_now[#alive_now + 1] = p end   -- zombies are gone
        end
      end
      if #alive_now == 0 then return alive_now end
      os.execute("sleep 0.1")
    end
    return pids
  end
  local PIDS = "send s = io.open('/proc/self/stat'):read('*l') print('@@pid', s:match('^(%d+)'), "
               .. "s:match('^%d+ %b() %S+ (%d+)'))\\r"

  for _, case in ipairs { { "closing the terminal", "hangup" }, { "Ctrl-\\", "send \\x1c" } } do
    it(case[1] .. " ends every rank and mpirun, even in a loop", function()
      local rc, out = pty({
        "expect loom> ", PIDS, "expect [rank 1] @@pid", "expect loom> ",
        "send while true do end\\r", "sleep 1", case[2],
      }, loomrun)
      local pids = pids_of(out)
      assert.equal(4, #pids, out)
      assert.same({}, left(pids), out)
      local _ = rc
    end)
  end
end)

describe("an error on one rank of the REPL", function()
  it("ends the chunk on every rank, a peer waiting in a collective too, and the session goes on", function()
    local rc, out = sys.sh_input(root .. "scripts/loomrun -n 2 --timeout 60 --repl", table.concat({
      'if dist.rank() == 0 then error("only rank 0") end dist.barrier()',
      'print("alive")',
      "x = loom.ones(2)",
      'if dist.rank() == 1 then error("only rank 1") end y = dist.all_reduce(x)',
      "dist.all_reduce(x):sum():item()",
      "",
    }, "\n"))
    assert.equal(1, rc, out)   -- piped, and chunks failed
    assert.truthy(out:find("[rank 0] error: repl:1: only rank 0\n[rank 1] error: repl:1: call #", 1, true), out)
    assert.truthy(out:find("barrier() was left waiting: rank 0 had left the chunk", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] alive", 1, true), out)
    assert.truthy(out:find("all_reduce(sum) of f32 [2] was left waiting: rank 1 had left the chunk", 1, true), out)
    assert.truthy(out:find("[ranks 0-1] 4\n", 1, true), out)
    assert.is_nil(out:find("uncaught", 1, true), out)
  end)
end)
