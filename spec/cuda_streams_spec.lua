-- cuda_streams_spec.lua: the stream rule the CUDA caching allocator's reuse
-- relies on (kernels/cuda/alloc.cu, docs/devices.md), checked in the
-- sources: freed blocks are keyed by one stream, so every launch, copy and
-- cuBLAS call must run on LM_STREAM (the legacy default stream), and NCCL's
-- side stream must be a blocking one that the default stream waits for.
-- Reads files only: runs on every machine.
local sys = require("support.sys")

local function sources(pattern)
  local rc, out = sys.sh("ls " .. pattern)
  assert(rc == 0, out)
  local t = {}
  for f in out:gmatch("%S+") do t[#t + 1] = { name = f, text = sys.read(f) } end
  return t
end

local CU = sources("kernels/cuda/*.cu kernels/cuda/*.cuh")

describe("the CUDA stream rule", function()
  it("launches every kernel on LM_STREAM (<<<...>>> or common.cuh's LM_LAUNCH)", function()
    local n = 0
    for _, f in ipairs(CU) do
      for args in f.text:gmatch("<<<(.-)>>>") do
        n = n + 1
        assert.is_truthy(args:match(",%s*LM_STREAM%s*$") or args:match("^%(grid%)"),
                         f.name .. ": a launch not on LM_STREAM: <<<" .. args .. ">>>")
      end
      -- LM_LAUNCH(grid, block, smem, kernel) is common.cuh's launch on LM_STREAM
      for _ in f.text:gmatch("LM_LAUNCH%(") do n = n + 1 end
    end
    assert.is_true(n > 10, "found only " .. n .. " launches")
  end)

  it("queues every async copy and memset, and cuBLAS, on LM_STREAM", function()
    local n = 0
    for _, f in ipairs(CU) do
      for call in f.text:gmatch("cuda%a+Async(%b())") do
        n = n + 1
        assert.is_truthy(call:match("LM_STREAM%s*%)$"), f.name .. ": not on LM_STREAM: " .. call)
      end
      for call in f.text:gmatch("cublasSetStream(%b())") do
        assert.is_truthy(call:match("LM_STREAM%s*%)$"), f.name .. ": cuBLAS on another stream: " .. call)
      end
      for call in f.text:gmatch("cublasLtMatmul(%b())") do
        assert.is_truthy(call:match("LM_STREAM%s*%)$"), f.name .. ": cuBLASLt on another stream")
      end
    end
    assert.is_true(n >= 3, "found only " .. n .. " async calls")
  end)

  it("makes no non-blocking stream, and NCCL's side stream is waited for", function()
    local nccl = sys.read("core/comm/nccl.c")
    for _, f in ipairs(CU) do assert.is_falsy(f.text:find("NonBlocking"), f.name) end
    assert.is_falsy(nccl:find("NonBlocking"))
    assert.is_truthy(nccl:find("cudaStreamCreate(&side)", 1, true), "NCCL's stream: cudaStreamCreate (blocking)")
    assert.is_truthy(nccl:find("cudaStreamWaitEvent(0, ev, 0)", 1, true), "the default stream waits for each collective")
  end)

  it("keys the allocator's blocks by LM_STREAM", function()
    local alloc = sys.read("kernels/cuda/alloc.cu")
    assert.is_truthy(alloc:find("take_free(d, size, LM_STREAM)", 1, true))
    assert.is_truthy(alloc:find("e->stream = LM_STREAM", 1, true))
  end)
end)
