-- pipeline_fault_spec.lua: a rank that raises in the middle of a pipeline
-- schedule (stage 1's forward of microbatch 2, while stage 0 waits for its
-- gradients) ends the whole job, fast and non-zero, naming the rank.
-- Runs loomrun from one process: luajit scripts/run_specs.lua spec/pipeline_fault_spec.lua
local sys = require("support.sys")
local root = sys.root

local script = [[
local loom = require("loom")
local dist = require("loom.distributed")
local pp = require("loom.distributed.pipelining")
local nn = loom.nn
local Boom = nn.Module:extend("Boom")
function Boom:__init() self.lin = nn.Linear(4, 4) self.calls = 0 end
function Boom:forward(x)
  self.calls = self.calls + 1
  if dist.rank() == 1 and self.calls == 3 then error("stage 1 broke on microbatch 2") end
  return self.lin(x)
end
loom.manual_seed(1)
local m = nn.Sequential(Boom(), Boom())
local st = pp.pipeline(m, { num_stages = 2 }):build_stage(dist.rank())
local sched = pp.Schedule1F1B(st, 4, function(o, y) return (o - y):pow(2):mean() end)
sched:step(loom.randn(8, 4), { target = loom.randn(8, 4) })
print("rank " .. dist.rank() .. " finished the step")
]]

describe("a pipeline with a failing rank", function()
  it("ends the job within 30 s naming the rank that raised", function()
    local path = sys.tmpfile(script, ".lua")
    local rc, out, secs = sys.sh(root .. "scripts/loomrun -n 2 --timeout 60 " .. path)
    os.remove(path)
    assert.is_not.equal(0, rc)
    assert.is_true(secs < 30, "took " .. secs .. " s")
    assert.matches("rank 1: uncaught error: [^\n]*stage 1 broke on microbatch 2", out)
    assert.is_nil(out:match("finished the step"))
  end)
end)
