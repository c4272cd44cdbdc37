-- cuda_build_spec.lua: the CUDA build's configuration (review item 8):
-- kernels/cuda/CMakeLists.txt keeps a user's CMAKE_CUDA_ARCHITECTURES and
-- builds for sm_80 and sm_90 when none is given. Configures only (no
-- compile: about 12 s each); needs nvcc, and says so where it is absent.
local sys = require("support.sys")

local NVCC = "/usr/local/cuda/bin/nvcc"
local function archs(extra)
  local d = sys.tmpdir()
  local rc, out = sys.sh(("cmake -S . -B %s -DLOOM_CUDA=ON %s"):format(sys.shq(d), extra))
  local flags = sys.exists(d .. "/kernels/cuda/CMakeFiles/loom_cuda.dir/flags.make")
      and sys.read(d .. "/kernels/cuda/CMakeFiles/loom_cuda.dir/flags.make") or ""
  sys.rmtree(d)
  assert(rc == 0, out)
  local set, list = {}, {}
  for a in flags:gmatch("code=%[?compute_%d+,sm_(%d+)") do
    if not set[a] then set[a] = true; list[#list + 1] = a end
  end
  table.sort(list)
  return table.concat(list, ";")
end

describe("the CUDA build's architectures", function()
  if not sys.exists(NVCC) then
    print("no nvcc at " .. NVCC .. ": the CUDA build cannot be configured here")
    it("needs nvcc, which is absent", function() assert.is_false(sys.exists(NVCC)) end)
    return
  end
  it("follow -DCMAKE_CUDA_ARCHITECTURES", function()
    assert.are.equal("86", archs("-DCMAKE_CUDA_ARCHITECTURES=86"))
  end)
  it("are sm_80 and sm_90 by default", function()
    assert.are.equal("80;90", archs(""))
  end)
end)
