-- jit_retention_spec.lua: nothing a user drops stays alive because LuaJIT
-- compiled a loop. A trace keeps as constants the closures it specialised on
-- (the first few of each function), and with them what they capture: a
-- library function that wraps its work in a fresh closure capturing the
-- model, its parameters or a state dict (loom.no_grad(function() ... end),
-- a local recursive walker) would keep the first model for good.
-- support/jit_workload.lua runs what a user does under -Ohotloop=1 (every
-- loop compiles at once), drops it, and lists the tensors traces hold
-- (support/retention.lua) and the storages left after full collections;
-- support/jit_workload_dist.lua does the same for the distributed paths on
-- 2 ranks.
local sys = require("support.sys")

-- (sh_clean: the workload starts an MPI singleton of its own, which must not
-- inherit one this process may hold)
local function run(script)
  return sys.sh_clean("cd " .. sys.shq(sys.root) .. " && luajit -Ohotloop=1 -Omaxtrace=60000 -Omaxmcode=262144 -e "
                      .. sys.shq("package.path = " .. string.format("%q", package.path)) .. " " .. script .. " </dev/null")
end

describe("compiled traces", function()
  it("keep no tensor of a printed tensor alive (the check itself sees a held one)", function()
    -- a closure made here, called in a compiled loop, is what the library avoids
    local code = [[
      local loom = require("loom")
      local held = require("support.retention").held
      local x = loom.ones(40)
      local function s(v) return x.numel_ + v end
      local acc = 0
      for i = 1, 100 do acc = acc + s(i) end
      local _ = tostring(loom.randn(12, 12))
      for _, p in ipairs(held()) do print("held: " .. p) end
    ]]
    local rc, out = sys.luajit(code)
    assert.are.equal(0, rc, out)
    -- the spec's own closure s is found (the walker works) ...
    assert.truthy(out:find("upvalue x", 1, true), out)
    -- ... and the printed tensor is not (tensor_print captures no tensor)
    assert.falsy(out:find("tensor_print", 1, true), out)
  end)

  it("keep nothing of a dropped workload: training, generation, files, TP + FSDP", function()
    local rc, out = run("spec/support/jit_workload.lua")
    assert.are.equal(0, rc, out)
    assert.falsy(out:find("held: ", 1, true), out)
    local a, b = out:match("storages: (%d+) %-> (%d+)")
    assert.truthy(a, out)
    assert.are.equal(a, b, out)
  end)

  it("keep nothing of a dropped 2-rank workload: TP + SP + loss parallel, DP, pipeline, CP, checkpoints", function()
    local dir = sys.tmpdir()
    local rc, out = sys.sh_clean(sys.shq(sys.root .. "scripts/loomrun") .. " -n 2 "
                                 .. sys.shq(sys.root .. "spec/support/jit_workload_dist.lua") .. " " .. sys.shq(dir)
                                 .. " </dev/null")
    sys.rmtree(dir)
    assert.are.equal(0, rc, out)
    assert.falsy(out:find("held: ", 1, true), out)
    local n = 0
    for a, b in out:gmatch("storages: (%d+) %-> (%d+)") do
      assert.are.equal(a, b, out)
      n = n + 1
    end
    assert.are.equal(2, n, out)   -- both ranks reported
  end)
end)
