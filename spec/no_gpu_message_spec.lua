-- no_gpu_message_spec.lua: what a user who asks for "cuda" reads when there
-- is no GPU: with no NVIDIA driver installed the message says so, not that
-- the "CUDA driver version is insufficient" (the CUDA runtime's words for a
-- missing driver too). Where there is a GPU, the tensor lands on it.
local loom = require("loom")
local ffi = require("ffi")
local C = require("loom.lib").C

describe("asking for cuda", function()
  it("names the missing driver, or works", function()
    local ok, err = pcall(loom.zeros, 2, { device = "cuda" })
    if ok then
      assert.is_true(loom.cuda.device_count() > 0)
      assert.equal("cuda:0", err.device)
      return
    end
    err = tostring(err)
    local has_driver = pcall(ffi.load, "libcuda.so.1")
    local real_cuda = ffi.string(C.lm_build_info()):find("built with CUDA", 1, true) and not loom.cuda.emu_counters()
    if not has_driver then
      assert.is_nil(err:find("driver version", 1, true), err)
      if real_cuda then assert.truthy(err:find("no GPU here: this machine has no NVIDIA driver", 1, true), err) end
    end
  end)
end)
