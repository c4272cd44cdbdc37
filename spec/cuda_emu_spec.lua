-- cuda_emu_spec.lua: the emulated CUDA device (LOOM_CUDA=EMULATE,
-- kernels/emu/) counts what a real GPU run must not do, and refuses what a
-- GPU would fault on. Runs in an emulated build (scripts/test_emu.sh); any
-- other build checks only that it says it is not one.
local loom = require("loom")
local ffi = require("ffi")
local sys = require("support.sys")

local counters, why = loom.cuda.emu_counters()
if not counters then
  describe("the emulated CUDA device", function()
    it("is absent from this build, which says so", function()
      assert.truthy(why:find("not an emulated CUDA build", 1, true), why)
    end)
  end)
  return
end

local transformer = require("loom.models.transformer")
local CFG = { vocab_size = 65, dim = 128, n_layers = 2, n_heads = 2, max_seq_len = 32 }

-- one bf16 training step of the small Llama on cuda, as examples/train.lua
-- runs it; returns the loss tensor (on the GPU, not read)
local function trainer(clip)
  loom.manual_seed(3)
  local model = loom.device("cuda"):use(transformer.new, CFG)
  local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
  local x = loom.randint(1, 66, { 2, 32 }, { dtype = "i64" })
  local y = loom.randint(1, 66, { 2, 32 }, { dtype = "i64" })
  return function()
    local xs, ys = x:to("cuda"), y:to("cuda")
    local loss = loom.autocast("bf16", function() return loom.F.cross_entropy(model(xs), ys) end)
    loss:backward()
    if clip then loom.nn.utils.clip_grad_norm_(model:parameters(), 1, { tensor = true }) end
    opt:step()
    opt:zero_grad()
    return loss
  end
end

describe("the emulated CUDA device", function()
  -- the counters of the second step (the first makes the caches), read
  -- before its loss is: the logged loss is the one copy to the host a step
  -- may make
  local function step_counters(clip)
    local step = trainer(clip)
    step():item()
    loom.cuda.emu_counters({ reset = true })
    local loss = step()
    local c = loom.cuda.emu_counters()
    loss:item()
    return c
  end

  it("counts no unordered stream reuse, f32 GEMM under autocast or refused call in a bf16 step", function()
    local c = step_counters()
    print(("\ncuda_emu_spec: a bf16 step: %d kernels, %d GEMMs, %d synchronous D2H copies, %d f32 GEMMs under "
           .. "autocast, %d unordered reuses, %d refused calls, %d kernels on mapped host memory, %d device syncs")
          :format(c.kernels, c.gemms, c.sync_d2h_copies, c.f32_gemms_under_autocast, c.unordered_stream_reuse,
                  c.refused_calls, c.mapped_host_kernels, c.device_syncs))
    assert.is_true(c.kernels > 0 and c.gemms > 0, "the step ran on the emulated device")
    assert.equal(0, c.refused_calls)
    assert.equal(0, c.unordered_stream_reuse)
    assert.equal(0, c.f32_gemms_under_autocast)
  end)

  -- review item 4: the id range checks of embedding and cross entropy run
  -- on the device (kernels/cuda/check.cu), writing mapped host memory: no
  -- copy of the ids to the host and no wait for the device in a step
  it("counts no synchronous device-to-host copy in a bf16 training step", function()
    local c = step_counters()
    assert.equal(0, c.sync_d2h_copies)
    assert.equal(0, c.device_syncs)
    assert.equal(2, c.mapped_host_kernels, "the id checks of embedding and cross entropy, on the device")
  end)

  -- clip_grad_norm_ sums the norm on the device (21 waits, one per
  -- gradient, before); asked for a tensor it returns without waiting
  it("counts no synchronous device-to-host copy in a clipped bf16 training step", function()
    local c = step_counters(true)
    assert.equal(0, c.sync_d2h_copies)
    assert.equal(0, c.device_syncs)
  end)

  it("raises a bad id that the device's check found at the next copy to the host", function()
    local w = loom.randn({ 5, 4 }):to("cuda")
    local ids = loom.tensor({ 1, 7, 2 }, { dtype = "i64" }):to("cuda")
    local out = loom.F.embedding(ids, w) -- no wait: the check runs on the device
    local ok, err = pcall(function() return out:sum():item() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("holds id 7, outside [1, 5]", 1, true), tostring(err))
    local good = loom.tensor({ 1, 5, 2 }, { dtype = "i64" }):to("cuda")
    assert.is_number(loom.F.embedding(good, w):sum():item()) -- the bad id was reported once, then cleared
  end)

  it("refuses mapped host memory a kernel's device did not map, and frees only what cudaHostAlloc made", function()
    ffi.cdef [[
      int cudaHostAlloc(void **p, size_t n, unsigned flags);
      int cudaHostGetDevicePointer(void **pd, void *p, unsigned flags);
      int cudaFreeHost(void *p);
    ]]
    pcall(ffi.cdef, "int cudaGetLastError(void);")
    local C = loom.C
    local p, d = ffi.new("void *[1]"), ffi.new("void *[1]")
    assert.equal(0, C.cudaHostAlloc(p, 64, 2)) -- cudaHostAllocMapped
    assert.equal(0, C.cudaHostGetDevicePointer(d, p[0], 0))
    assert.equal(ffi.cast("uintptr_t", p[0]), ffi.cast("uintptr_t", d[0])) -- unified addressing
    local q = ffi.new("char[64]")
    assert.are_not.equal(0, C.cudaHostGetDevicePointer(d, q, 0)) -- ordinary host memory
    assert.are_not.equal(0, C.cudaFreeHost(q))
    C.cudaGetLastError()
    assert.equal(0, C.cudaHostAlloc(p, 64, 0)) -- pinned, not mapped
    assert.are_not.equal(0, C.cudaHostGetDevicePointer(d, p[0], 0))
    C.cudaGetLastError()
    assert.equal(0, C.cudaFreeHost(p[0]))
  end)

  -- review item 1: device_count()/is_available() made a context on every device
  it("makes no context on a device other than the rank's (2 devices, training on cuda:0)", function()
    local script = [[
      local loom = require("loom")
      assert(loom.cuda.is_available() and loom.cuda.device_count() == 2)
      local x = loom.randn({8, 8}):to("cuda")
      local _ = x:matmul(x):sum():item()
      io.write("contexts_other_device=", loom.cuda.emu_counters().contexts_other_device, "\n")
    ]]
    local rc, out = sys.sh("LOOM_EMU_DEVICES=2 luajit -e " .. sys.shq("package.path='lua/?.lua;lua/?/init.lua;'"
                           .. "..package.path " .. script))
    assert.equal(0, rc, out)
    assert.equal("0", out:match("contexts_other_device=(%d+)"), out)
  end)

  it("counts work on a stream that touches a block without an event after its last use elsewhere", function()
    ffi.cdef [[
      typedef struct emu_stream_ *cudaStream_t;
      typedef struct emu_event_ *cudaEvent_t;
      int cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
      int cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
      int cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
      int cudaEventRecord(cudaEvent_t e, cudaStream_t s);
      int cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
      int cudaEventDestroy(cudaEvent_t e);
    ]]
    local C = loom.C
    local s, e = ffi.new("cudaStream_t[1]"), ffi.new("cudaEvent_t[1]")
    assert.equal(0, C.cudaStreamCreateWithFlags(s, 1)) -- cudaStreamNonBlocking: no implicit order
    assert.equal(0, C.cudaEventCreateWithFlags(e, 0))
    local x = loom.ones({ 64 }):to("cuda")             -- last used on the default stream
    local function unordered() return loom.cuda.emu_counters().unordered_stream_reuse end
    local n0 = unordered()
    assert.equal(0, C.cudaMemsetAsync(x:data_ptr(), 0, 256, s[0]))
    assert.equal(n0 + 1, unordered(), "the side stream did not wait for the default stream")
    assert.equal(0, C.cudaEventRecord(e[0], s[0]))
    assert.equal(0, C.cudaStreamWaitEvent(nil, e[0], 0))
    assert.equal(64, (x + 1):sum():item())              -- zeros + 1: ordered after the memset by the event
    assert.equal(n0 + 1, unordered())
    C.cudaEventDestroy(e[0])
  end)

  it("refuses a copy whose direction is wrong, and counts it", function()
    ffi.cdef [[ int cudaMemcpy(void *dst, const void *src, size_t n, int kind); ]]
    pcall(ffi.cdef, "int cudaGetLastError(void);")
    local d = loom.arange(0, 4, 1, { dtype = "f32" }):to("cuda")
    local host = ffi.new("float[4]")
    local before = loom.cuda.emu_counters().refused_calls
    assert.are_not.equal(0, loom.C.cudaMemcpy(host, d:data_ptr(), 16, 1)) -- says host to device
    assert.equal(before + 1, loom.cuda.emu_counters().refused_calls)
    loom.C.cudaGetLastError()
    assert.equal(0, loom.C.cudaMemcpy(host, d:data_ptr(), 16, 2)) -- device to host: right
    assert.same({ 0, 1, 2, 3 }, { host[0], host[1], host[2], host[3] })
    local other = ffi.new("float[4]")
    assert.are_not.equal(0, loom.C.cudaMemcpy(other, host, 16, 2)) -- a host source, said to be the device's
    loom.C.cudaGetLastError()
  end)

  -- a GPU finds a bad address only when the kernel runs, and the error is
  -- sticky: the context is lost, every later call fails (a child process)
  it("faults a kernel given a host pointer when it runs, and every later call fails (sticky)", function()
    local rc, out = sys.luajit([[
      local loom, ffi = require("loom"), require("ffi")
      local x = loom.ones({ 4 })
      -- a CPU tensor's memory passed off as cuda:0's (the Lua view of the struct is const)
      local dev = ffi.cast("int8_t *", ffi.cast("const char *", ffi.cast("const lm_tensor *", x))
                           + ffi.offsetof("lm_tensor", "device_"))
      dev[0] = loom.C.LM_CUDA0
      local queued = pcall(function() return x + 1 end)
      dev[0] = loom.C.LM_CPU
      local _, next_err = pcall(function() return (loom.ones({ 4 }):to("cuda") + 0):sum():item() end)
      local _, later = pcall(function() return loom.ones({ 4 }):to("cuda") end)
      io.write("queued=", tostring(queued), "\nnext=", tostring(next_err), "\nlater=", tostring(later), "\n")
    ]])
    assert.equal(0, rc, out)
    assert.truthy(out:find("queued=true", 1, true), out)                -- the launch itself went out
    assert.truthy(out:match("next=[^\n]*illegal memory access"), out)  -- the next wait finds the fault
    assert.truthy(out:match("later=[^\n]*illegal memory access"), out) -- and the device stays lost
    assert.truthy(out:find("was given 0x%x+, which is not device memory"), out)
  end)
end)
