-- fault_drills_spec.lua: what ends a job on 2 and 4 ranks, and how fast: a
-- rank that returns early, raises mid-step, calls another collective or
-- another shape than the others, is killed (SIGKILL) or stopped (SIGSTOP).
-- Each drill must end the whole job (non-zero exit) within 30 s with a
-- message naming the rank. Every drill runs under `timeout 60`, so a hang
-- fails the spec instead of the suite. The time of each is printed.
local sys = require("support.sys")

local root = sys.root
local loomrun = root .. "scripts/loomrun"
local dir = sys.tmpdir()
local mpi_vars = "env $(env | grep -oE '^(OMPI|PMIX|OPAL|ORTE)[A-Z_]*' | sed 's/^/-u /')"

-- the drills: each a script that every rank runs; `culprit` is the rank
-- the message must name, `says` what it must say
local PRE = [[
local loom = require("loom"); local dist = require("loom.distributed")
local ffi = require("ffi"); pcall(ffi.cdef, "int getpid(void); int kill(int, int);")
local m = dist.init_device_mesh("cpu", { dist.world_size() })
local last = dist.world_size() - 1
for _ = 1, 3 do dist.all_reduce(loom.ones(8), "sum", m) end  -- a few steps together
]]
local drills = {
  { name = "a rank returns early", says = "rank %d finished its script", body = [[
if dist.rank() == last then return end
dist.all_reduce(loom.ones(8), "sum", m) ]] },
  { name = "a rank raises mid-step", says = "rank %d: uncaught error", body = [[
if dist.rank() == last then error("boom") end
dist.all_reduce(loom.ones(8), "sum", m) ]] },
  { name = "ranks call different collectives", says = "rank %d issued call #4 all_gather", body = [[
if dist.rank() == last then dist.all_gather(loom.ones(8), 1, m) else dist.all_reduce(loom.ones(8), "sum", m) end ]] },
  { name = "ranks pass different shapes", says = "rank %d issued call #4 all_reduce(sum) of f32 [9]", body = [[
dist.all_reduce(loom.ones(dist.rank() == last and 9 or 8), "sum", m) ]] },
  { name = "a rank is killed (SIGKILL)", says = "rank %d", body = [[
if dist.rank() == last then ffi.C.kill(ffi.C.getpid(), 9) end
dist.all_reduce(loom.ones(8), "sum", m) ]] },
  { name = "a rank is stopped (SIGSTOP)", says = "rank %d stopped answering", body = [[
if dist.rank() == last then ffi.C.kill(ffi.C.getpid(), 19) end
dist.all_reduce(loom.ones(8), "sum", m) ]] },
}

describe("fault drills", function()
  teardown(function() sys.rmtree(dir) end)
  for _, n in ipairs { 2, 4 } do
    for i, d in ipairs(drills) do
      it(string.format("%s: the job of %d ranks ends within 30 s naming the rank", d.name, n), function()
        local script = string.format("%s/drill%d.lua", dir, i)
        sys.write(script, PRE .. d.body .. "\n")
        local rc, out, secs = sys.sh(string.format("%s timeout 60 %s -n %d %s", mpi_vars, loomrun, n, script))
        print(string.format("  drill %-34s %d ranks: exit %d after %.1f s", d.name, n, rc, secs))
        assert.are_not.equal(0, rc)
        assert.is_true(rc ~= 124, "the job hung until timeout:\n" .. out)
        assert.is_true(secs < 30, string.format("took %.1f s", secs))
        local want = d.says:format(n - 1)
        assert.truthy(out:find(want, 1, true), "expected \"" .. want .. "\" in:\n" .. out)
      end)
    end
  end
end)
