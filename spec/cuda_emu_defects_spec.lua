-- cuda_emu_defects_spec.lua: the emulated CUDA device (kernels/emu/) fails
-- where a GPU would, each case with the defect planted on purpose:
--   asynchronous work: a query of work not yet run answers NotReady and
--   leaves it as the last error (which loom's launch check and NCCL wait
--   must not trip on); a side stream that does not wait for the default
--   stream copies stale data; a host read of an async copy's pinned
--   destination before the sync reads poison;
--   memory spaces: host code that reads device memory dies naming it; a
--   kernel reading past its allocation dies naming the kernel; every block
--   handed out holds NaN.
-- (Missing barriers: the C test kernels/emu/test_defects.cpp.) Runs in an
-- emulated build (scripts/test_emu.sh); any other build checks only that it
-- says it is not one.
local loom = require("loom")
local ffi = require("ffi")
local sys = require("support.sys")

local counters, why = loom.cuda.emu_counters()
if not counters then
  describe("the emulated CUDA device's planted defects", function()
    it("are not checked in this build, which says so", function()
      assert.truthy(why:find("not an emulated CUDA build", 1, true), why)
    end)
  end)
  return
end

-- the runtime calls, under names of this spec's own (asm labels: no clash
-- with another spec's declarations of the CUDA names)
ffi.cdef [[
  int lm_spec_event_create(void **e, unsigned flags) asm("cudaEventCreateWithFlags");
  int lm_spec_event_record(void *e, void *s) asm("cudaEventRecord");
  int lm_spec_event_query(void *e) asm("cudaEventQuery");
  int lm_spec_event_destroy(void *e) asm("cudaEventDestroy");
  int lm_spec_stream_create(void **s, unsigned flags) asm("cudaStreamCreateWithFlags");
  int lm_spec_stream_wait(void *s, void *e, unsigned flags) asm("cudaStreamWaitEvent");
  int lm_spec_stream_sync(void *s) asm("cudaStreamSynchronize");
  int lm_spec_memcpy_async(void *dst, const void *src, size_t n, int kind, void *s) asm("cudaMemcpyAsync");
  int lm_spec_host_alloc(void **p, size_t n, unsigned flags) asm("cudaHostAlloc");
  int lm_spec_free_host(void *p) asm("cudaFreeHost");
  int lm_spec_get_last(void) asm("cudaGetLastError");
  int lm_spec_peek_last(void) asm("cudaPeekAtLastError");
]]
local C = loom.C
local NOT_READY, D2H, D2D, NON_BLOCKING = 600, 2, 3, 1

local function event()
  local e = ffi.new("void *[1]")
  assert.equal(0, C.lm_spec_event_create(e, 2)) -- cudaEventDisableTiming
  return ffi.gc(e[0], C.lm_spec_event_destroy)
end

describe("the emulated device is asynchronous, as a GPU is", function()
  it("answers NotReady to a query of work not yet run, and leaves it as the last error", function()
    local y = loom.ones({ 256 }):to("cuda") * 3 -- queued, not run
    local e = event()
    assert.equal(0, C.lm_spec_event_record(e, nil))
    assert.equal(NOT_READY, C.lm_spec_event_query(e))
    assert.equal(NOT_READY, C.lm_spec_peek_last())
    assert.equal(NOT_READY, C.lm_spec_get_last()) -- returned once, then cleared
    assert.equal(0, C.lm_spec_get_last())
    assert.equal(0, C.lm_spec_event_query(e)) -- the device went on after the first query
    -- the defect of issue 35: a query's NotReady left as the last error
    -- failed the next kernel's launch check (kernels/cuda/backend.cu)
    local z = y + 1
    assert.equal(0, C.lm_spec_event_record(e, nil))
    assert.equal(NOT_READY, C.lm_spec_event_query(e))
    assert.equal(1024, (z * 1):sum():item())
  end)

  it("leaves no error behind after the wait for an NCCL collective (core/comm/nccl.c)", function()
    local rc, out = sys.luajit([[
      local loom, dist, ffi = require("loom"), require("loom.distributed"), require("ffi")
      ffi.cdef("int lm_spec_peek(void) asm(\"cudaPeekAtLastError\");")
      dist.init_device_mesh("cuda", { 1 })
      local before = loom.cuda.emu_counters().not_ready_queries
      local y = dist.all_reduce(loom.ones({ 8 }):to("cuda") * 2) -- polls its event (nccl_test)
      io.write("not_ready=", loom.cuda.emu_counters().not_ready_queries - before, " last=", loom.C.lm_spec_peek(),
               " sum=", (y + 1):sum():item(), "\n")
    ]])
    assert.equal(0, rc, out)
    assert.truthy(out:find("last=0 sum=24", 1, true), out)
    assert.truthy(tonumber(out:match("not_ready=(%d+)")) >= 1, "the wait saw the collective not ready: " .. out)
  end)

  local function side_copy(wait)
    local s = ffi.new("void *[1]")
    assert.equal(0, C.lm_spec_stream_create(s, NON_BLOCKING))
    local dst = loom.zeros({ 64 }):to("cuda")
    assert.equal(0, dst:sum():item()) -- the default stream has run
    local src = loom.ones({ 64 }):to("cuda") * 2 -- queued on the default stream
    if wait then
      local e = event()
      assert.equal(0, C.lm_spec_event_record(e, nil))
      assert.equal(0, C.lm_spec_stream_wait(s[0], e, 0))
    end
    local unordered = loom.cuda.emu_counters().unordered_stream_reuse
    assert.equal(0, C.lm_spec_memcpy_async(dst:data_ptr(), src:data_ptr(), 256, D2D, s[0]))
    assert.equal(0, C.lm_spec_stream_sync(s[0]))
    return dst:sum():item(), loom.cuda.emu_counters().unordered_stream_reuse - unordered
  end
  it("runs a side stream's copy that waits for no event before the kernel that makes its source", function()
    local sum, unordered = side_copy(false) -- planted: no cudaStreamWaitEvent
    assert.are_not.equal(128, sum)
    assert.equal(1, unordered)
    sum, unordered = side_copy(true)
    assert.equal(128, sum)
    assert.equal(0, unordered)
  end)

  it("leaves an async copy's pinned destination poisoned until the copy runs", function()
    local x = loom.ones({ 4 }):to("cuda") * 5
    local p = ffi.new("void *[1]")
    assert.equal(0, C.lm_spec_host_alloc(p, 16, 0))
    local f = ffi.cast("float *", p[0])
    assert.equal(0, C.lm_spec_memcpy_async(p[0], x:data_ptr(), 16, D2H, nil))
    assert.is_true(f[0] ~= f[0], "read before the sync (planted): NaN, not " .. f[0])
    assert.equal(0, C.lm_spec_stream_sync(nil))
    assert.equal(5, f[3])
    assert.equal(0, C.lm_spec_free_host(p[0]))
  end)
end)

describe("device memory is the device's", function()
  -- the script's output and exit code, in a child process (it dies)
  local function child(body)
    return sys.luajit("local loom, ffi = require('loom'), require('ffi')\n" .. body)
  end

  it("kills host code that reads a CUDA tensor's memory, naming what it touched", function()
    local rc, out = child([[
      local x = loom.ones({ 4 }):to("cuda")
      io.write("sum=", x:sum():item(), "\n") -- through a copy: fine
      io.stdout:flush()
      local v = ffi.cast("float *", x:data_ptr())[0] -- planted: the host reads device memory
      io.write("host_read=", v, "\n")
    ]])
    assert.are_not.equal(0, rc)
    assert.truthy(out:find("sum=4", 1, true), out)
    assert.is_falsy(out:find("host_read=", 1, true), out)
    assert.truthy(out:find("host code touched device memory: 0x%x+, byte 0 of device allocation"), out)
  end)

  it("kills a kernel that reads past the end of its allocation, naming the kernel, its block and thread", function()
    local rc, out = child([[
      local x = loom.ones({ 64 }):to("cuda")
      -- planted: the tensor claims 64 Ki elements of its 256-byte block
      local t = ffi.cast("char *", ffi.cast("const char *", ffi.cast("const lm_tensor *", x)))
      ffi.cast("int64_t *", t + ffi.offsetof("lm_tensor", "shape_"))[0] = 65536
      ffi.cast("int64_t *", t + ffi.offsetof("lm_tensor", "numel_"))[0] = 65536
      io.write("sum=", x:sum():item(), "\n")
    ]])
    assert.are_not.equal(0, rc)
    assert.is_falsy(out:find("sum=", 1, true), out)
    assert.truthy(out:find("cuda emulator: kernel [%w_]+.-, block %(%d+, 0, 0%) thread %(%d+, %d+, 0%), touched "
                           .. "0x%x+, %d+ bytes past the end of device allocation"), out)
  end)

  it("hands out every block holding NaN, fresh from the driver or reused from the cache", function()
    local function nans(t) -- counted on the CPU (a direct copy: no device scratch of t's size)
      local n = 0
      for _, v in ipairs(t:to("cpu"):totable()) do n = n + (v ~= v and 1 or 0) end
      return n
    end
    local a = loom.empty({ 1000 }, { device = "cuda" })
    assert.equal(1000, nans(a), "a fresh block")
    a:fill_(1)
    local p = a:data_ptr()
    a = nil -- luacheck: ignore 311
    collectgarbage()
    collectgarbage()
    local b = loom.empty({ 1000 }, { device = "cuda" })
    assert.equal(p, b:data_ptr(), "the cache gave the freed block back")
    assert.equal(1000, nans(b), "a reused block: NaN, not the ones it held")
  end)
end)
