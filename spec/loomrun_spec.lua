-- loomrun_spec.lua: the launcher (scripts/loomrun), run from one process:
-- rank prefixes, --quiet-others, thread counts, flags, exit codes, and the
-- abort-on-error behaviour (one rank raises; the job ends non-zero, fast).
local sys = require("support.sys")
local sh = sys.sh
local root = sys.root
local loomrun = root .. "scripts/loomrun"

-- a temporary Lua script holding text; returns its path
local function write(text) return sys.tmpfile(text, ".lua") end

-- loomrun's output for args, asserting its exit code (want_rc, or 0)
local function launch(args, want_rc) return sys.output(loomrun .. " " .. args, want_rc) end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

local hello = write [[
local dist = require("loom.distributed")
print(string.format("hello %d of %d threads=%s arg=%s", dist.rank(), dist.world_size(),
                    os.getenv("LOOM_NUM_THREADS"), tostring(arg[1])))
]]

describe("loomrun", function()
  it("prefixes each line with its rank and passes arguments", function()
    local out = launch("-n 2 " .. hello .. " xyz")
    assert.matches("%[0%] hello 0 of 2 threads=%d+ arg=xyz", out)
    assert.matches("%[1%] hello 1 of 2 threads=%d+ arg=xyz", out)
  end)

  it("shows only rank 0's stdout with --quiet-others", function()
    local out = launch("-n 2 --quiet-others " .. hello)
    assert.matches("hello 0 of 2", out)
    assert.is_nil(out:match("hello 1 of 2"))
  end)

  it("gives each rank cores / local ranks threads, unless LOOM_NUM_THREADS is set", function()
    local _, cores = sh("nproc")
    cores = tonumber(cores)
    local out = launch("-n 2 --no-tag " .. hello)
    assert.equal(2, count(out, "threads=" .. math.max(1, math.floor(cores / 2)) .. " "))
    _, out = sh("LOOM_NUM_THREADS=3 " .. loomrun .. " -n 2 " .. hello)
    assert.equal(2, count(out, "threads=3 "))
  end)

  it("oversubscribes when ranks outnumber cores, and builds a sane mpirun line", function()
    local out = launch("-n 64 --dry-run --mpi-arg --mca --mpi-arg btl --mpi-arg self,vader " .. hello)
    assert.matches("mpirun %-n 64 %-%-bind%-to none", out)
    assert.matches("%-%-oversubscribe", out)
    assert.matches("%-x LUA_PATH", out)
    assert.matches("%-%-mca btl self\\?,vader", out)
    local _, uid = sh("id -u")
    if tonumber(uid) == 0 then assert.matches("%-%-allow%-run%-as%-root", out) end
    assert.equal(4, count(launch("-n 4 " .. hello), "hello %d of 4"))
  end)

  it("rejects bad usage", function()
    for _, c in ipairs { { "-n 0 " .. hello, "positive number of ranks" },
                         { "--bogus " .. hello, "unknown option %-%-bogus" },
                         { "-n 2 /nonexistent/script.lua" } } do   -- exit code 2, and the message if given
      local out = launch(c[1], 2)
      if c[2] then assert.matches(c[2], out) end
    end
  end)

  it("exits non-zero when a rank exits non-zero", function()
    local s = write [[
local dist = require("loom.distributed")
dist.barrier()
if dist.rank() == 1 then os.exit(3) end
]]
    local rc = sh(loomrun .. " -n 2 " .. s)
    assert.is_not.equal(0, rc)
  end)

  it("aborts the whole job within 30 s when one rank raises", function()
    local s = write [[
local dist = require("loom.distributed")
if dist.rank() == 1 then error("deliberate failure on rank 1") end
dist.barrier() -- rank 0 would wait here forever without the abort
print("rank 0 passed the barrier")
]]
    local rc, out, secs = sh(loomrun .. " -n 2 --timeout 60 " .. s)
    assert.is_not.equal(0, rc)
    assert.is_true(secs < 30, "took " .. secs .. " s")
    assert.equal(1, count(out, "rank 1: uncaught error: [^\n]*deliberate failure on rank 1"))
    assert.is_nil(out:match("passed the barrier"))
    -- the same with 4 ranks, the erring rank in the middle of a collective
    s = write [[
local dist = require("loom.distributed")
local loom = require("loom")
dist.all_reduce(loom.ones({4}), "sum")
if dist.rank() == 2 then error("rank 2 gives up") end
dist.all_reduce(loom.ones({4}), "sum")
]]
    rc, out, secs = sh(loomrun .. " -n 4 --timeout 60 " .. s)
    assert.is_not.equal(0, rc)
    assert.is_true(secs < 30, "took " .. secs .. " s")
    assert.equal(1, count(out, "rank 2: uncaught error"))
  end)

  it("ends a job that hangs after --timeout seconds", function()
    local s = write [[
local dist = require("loom.distributed")
if dist.rank() == 0 then dist.barrier() end -- rank 1 never joins
while true do end
]]
    local rc, _, secs = sh(loomrun .. " -n 2 --timeout 3 " .. s)
    assert.is_not.equal(0, rc)
    assert.is_true(secs < 30, "took " .. secs .. " s")
  end)

  it("fails the run when a spec fails on any one rank", function()
    local dir = sys.tmpdir()
    sys.write(dir .. "/one_rank_fails_spec.lua", [[
local dist = require("loom.distributed")
describe("x", function()
  it("fails on rank 1 only", function() assert.is_true(dist.rank() ~= 1) end)
end)
]])
    local rc = sh(loomrun .. " -n 2 --quiet-others " .. root .. "scripts/run_specs.lua " .. dir)
    assert.is_not.equal(0, rc)
    sys.rmtree(dir)
  end)

  it("runs an SPMD REPL", function()
    local rc, out = sh("printf 'x = dist.rank() * 10\\nprint(\"val\", x + 1)\\nfor i = 1, 2 do\\nprint(\"loop\", i)\\nend\\n' | "
                       .. loomrun .. " -n 2 --repl")
    assert.equal(0, rc)
    assert.matches("%[rank 0%] val\t1", out)
    assert.matches("%[rank 1%] val\t11", out)
    assert.equal(2, count(out, "%[ranks 0%-1%] loop\t%d"))   -- identical on both ranks: printed once
  end)

  it("lets plain luajit run distributed code as a world of one", function()
    local s = write([[
package.path = "]] .. root .. [[lua/?.lua;]] .. root .. [[lua/?/init.lua;" .. package.path
local dist = require("loom.distributed")
local loom = require("loom")
local y = dist.all_reduce(loom.ones({3}), "sum")
local m = dist.init_device_mesh("cpu", {1}, {mesh_dim_names = {"tp"}})
print("single", dist.rank(), dist.world_size(), y:totable()[1], m["tp"]:size())
]])
    local rc, out = sh("luajit " .. s)
    assert.equal(0, rc)
    assert.matches("single\t0\t1\t1\t1", out)
  end)
end)
