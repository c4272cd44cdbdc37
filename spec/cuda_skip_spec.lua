-- cuda_skip_spec.lua: the CUDA specs skip only where there is no GPU. On a
-- machine with one (LOOM_EXPECT_GPU=1 stands in for it here) a CUDA spec
-- whose backend cannot load fails, so a broken load never looks green.
local loom = require("loom")
local sys = require("support.sys")
local G = require("support.cuda")

-- the output of spec/cuda_spec.lua run with env, asserting its exit code
local function run_cuda_spec(env, want_rc)
  return sys.output(env .. " luajit scripts/run_specs.lua -o plainTerminal spec/cuda_spec.lua", want_rc)
end

describe("the CUDA specs", function()
  if G.ok then
    it("run: this machine has a usable GPU", function() assert.is_true(loom.cuda.device_count() > 0) end)
    return
  end

  it("fail where a GPU is expected but loom cannot use one", function()
    local out = run_cuda_spec("LOOM_EXPECT_GPU=1", "nonzero")
    assert.matches("a GPU is here %(LOOM_EXPECT_GPU=1%) but loom cannot use it", out)
    assert.matches("0 successes / 0 failures / 1 error", out, 1, true)
  end)

  it("skip, saying why, where there is no GPU", function()
    assert.matches("no GPU: skipping cuda", run_cuda_spec("LOOM_EXPECT_GPU=0", 0), 1, true)
  end)

  it("count no device here, as is_available says", function()
    assert.are.equal(0, loom.cuda.device_count())
    assert.is_false(loom.cuda.is_available())
  end)
end)
