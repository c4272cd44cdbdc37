-- speed_guard_spec.lua: a slow path must not land unseen. Each check times
-- loom next to a reference measured in the same run, rounds interleaved so
-- both see the same neighbours, the best round of each, and fails only on
-- a large regression: loom at less than half the reference's rate (2x
-- slower). It never asserts an absolute time. References: memcpy of the same
-- bytes for an elementwise op, cblas_sgemm called directly on the same
-- buffers for a matmul, x + y for a Lua number as an operand.
local loom = require("loom")
local ffi = require("ffi")
local bench = require("loom.train.bench")

pcall(ffi.cdef, [[
void *malloc(size_t n); void free(void *p);
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]])

-- best seconds of `mine` and of `ref` over interleaved rounds, each round
-- three calls in a row (a call right after the other's differs: BLAS
-- threads asleep or spinning, caches)
local function race(mine, ref, rounds)
  local bm, br = math.huge, math.huge
  for _ = 1, 3 do mine() ref() end
  for _ = 1, rounds do
    local t0 = bench.now(); mine() mine() mine(); bm = math.min(bm, (bench.now() - t0) / 3)
    t0 = bench.now(); ref() ref() ref(); br = math.min(br, (bench.now() - t0) / 3)
  end
  return bm, br
end

local function guard(what, mine, ref)
  -- loom's time over the reference's (both for the same work): under 2 passes
  assert.is_true(mine / ref < 2, string.format("%s: loom %.3f ms against the reference's %.3f ms (%.2fx slower)",
                                               what, mine * 1e3, ref * 1e3, mine / ref))
end

describe("speed against a same-run reference (fails only past 2x)", function()
  it("an elementwise op: c = a + b on one thread moves as many bytes as memcpy of 1.5 buffers", function()
    local n = 4 * 2^20
    local a, b = loom.rand(n), loom.rand(n)
    local c
    local bytes = n * 4 * 3 / 2          -- memcpy of this many bytes reads and writes 3n floats
    local src, dst = ffi.C.malloc(bytes), ffi.C.malloc(bytes)
    ffi.fill(src, bytes, 1) ffi.fill(dst, bytes, 2)
    -- on one thread, as memcpy: a machine shared with other jobs slows both alike
    local threads = loom.num_threads()
    loom.set_num_threads(1)
    local ok, mine, ref = pcall(race, function() c = a + b end, function() ffi.copy(dst, src, bytes) end, 12)
    loom.set_num_threads(threads)
    ffi.C.free(src) ffi.C.free(dst)
    assert(ok, mine)
    assert.equal(n, c:numel())
    guard("a + b on 4M f32", mine, ref)
  end)

  it("a matmul: loom.matmul against cblas_sgemm on the same buffers", function()
    local n = 512
    local a, b, out = loom.randn(n, n), loom.randn(n, n), loom.empty(n, n)
    local pa, pb, po = ffi.cast("float*", a:data_ptr()), ffi.cast("float*", b:data_ptr()),
                       ffi.cast("float*", out:data_ptr())
    local c
    local mine, ref = race(function() c = a:matmul(b) end,
                           function() ffi.C.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, po, n) end, 12)
    assert.is_true((c - out):abs():max():item() < 1e-3)   -- the same product
    guard("matmul 512", mine, ref)
  end)

  it("a Lua number as an operand: x + 1 against x + y", function()
    local x, y = loom.randn(16), loom.randn(16)
    local r
    local calls = 20000
    local mine, ref = race(function() for _ = 1, calls do r = x + 1 end end,
                           function() for _ = 1, calls do r = x + y end end, 5)
    assert.equal(16, r:numel())
    guard("x + 1 on 16 f32", mine, ref)
  end)
end)
