-- check_cuda_resources_spec.lua: scripts/check_cuda_resources.sh, the static
-- resource check of the CUDA kernels, catches what it is for: a kernel
-- without __launch_bounds__ fails it, a file of bounded kernels passes (two
-- small files, sm_80 and sm_90: about 10 s). Without nvcc the script skips,
-- saying so, and this spec checks that line instead.
local sys = require("support.sys")

local NVCC = "/usr/local/cuda/bin/nvcc"
-- the check's output for one file, asserting its exit code
local function check(file, want_rc)
  return sys.output("NVCC=" .. NVCC .. " bash scripts/check_cuda_resources.sh --quiet " .. sys.shq(file), want_rc)
end

describe("scripts/check_cuda_resources.sh", function()
  if not sys.exists(NVCC) then
    it("skips, saying why, without nvcc", function()
      assert.matches("skipped: no nvcc", sys.output("NVCC=/nonexistent bash scripts/check_cuda_resources.sh"), 1, true)
    end)
    return
  end

  it("fails a kernel without __launch_bounds__, naming it", function()
    local d = sys.tmpdir()
    sys.write(d .. "/plain.cu", "__global__ void plain_kernel(float *x) { x[threadIdx.x] *= 2; }\n")
    local out = check(d .. "/plain.cu", 1)
    sys.rmtree(d)
    assert.matches("no __launch_bounds__ plain_kernel", out, 1, true)
    assert.matches("cuda resources: 0 passed, 2 failed", out, 1, true)
  end)

  it("passes bounded kernels (kernels/cuda/check.cu, sm_80 and sm_90)", function()
    assert.matches("cuda resources: 2 passed, 0 failed", check("kernels/cuda/check.cu", 0), 1, true)
  end)
end)
