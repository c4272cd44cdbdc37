-- cpu_alloc_spec.lua: the CPU caching allocator (kernels/cpu/alloc.c): a
-- freed large block is handed to the next request of its size class, never
-- while a live tensor holds it; values written after reuse are the new
-- ones; loom.memory_stats("cpu") counts live, peak and reserved bytes and
-- the mmap calls; loom.empty_cache() hands cached blocks back to the OS;
-- LOOM_CPU_CACHE_MB=0 keeps no cache.
local loom = require("loom")
local ffi = require("ffi")
local sys = require("support.sys")

local N = 2 * 2^20                  -- 8 MiB of f32: a large block
local function addr(t) return tonumber(ffi.cast("uintptr_t", t:data_ptr())) end
local function f32(t) return ffi.cast("float*", t:data_ptr()) end
local function stats() return loom.memory_stats("cpu") end
-- the number a child luajit (env: its environment) writes after running code
local function child_number(code, env)
  local rc, out = sys.luajit(code, env)
  assert.equal(0, rc, out)
  return assert(tonumber(out), "the child wrote no number: " .. out)
end

describe("the CPU caching allocator", function()
  before_each(function() loom.empty_cache() end)

  it("hands a freed block to the next request of its class, and counts no new mmap", function()
    local a = loom.full({ N }, 1)
    local pa = addr(a)
    a:free()
    local before = stats()
    local b = loom.empty({ N })
    assert.are.equal(pa, addr(b))
    assert.are.equal(before.driver_allocs, stats().driver_allocs)
    -- a size of the same class (within a quarter of a power of two) reuses it too
    b:free()
    local c = loom.empty({ N + 1000 })
    assert.are.equal(pa, addr(c))
  end)

  it("never hands out a block a live tensor holds, and values after reuse are the new ones", function()
    local live = {}
    for k = 1, 6 do live[k] = loom.full({ N }, k) end
    local dead = loom.full({ N }, -1)
    dead:free()
    local fresh = {}
    for k = 1, 3 do fresh[k] = loom.full({ N }, 100 + k) end
    -- no two live blocks overlap
    local all = {}
    for _, t in ipairs(live) do all[#all + 1] = t end
    for _, t in ipairs(fresh) do all[#all + 1] = t end
    for i = 1, #all do
      for j = i + 1, #all do
        local a, b = addr(all[i]), addr(all[j])
        assert.is_true(a + N * 4 <= b or b + N * 4 <= a, "blocks " .. i .. " and " .. j .. " overlap")
      end
    end
    -- every tensor holds its own values, first and last element included
    for k, t in ipairs(live) do
      assert.are.equal(k, f32(t)[0]); assert.are.equal(k, f32(t)[N - 1])
      assert.are.equal(k * N, t:sum():item())
    end
    for k, t in ipairs(fresh) do
      assert.are.equal(100 + k, f32(t)[0]); assert.are.equal(100 + k, f32(t)[N - 1])
    end
    -- zeros on a reused block are zeros
    fresh[1]:free()
    local z = loom.zeros({ N })
    assert.are.equal(0, z:abs():sum():item())
  end)

  it("an op's output in a loop reuses the block the last one freed", function()
    local x = loom.randn({ N })
    local y = x:silu()
    local before = stats().driver_allocs
    for _ = 1, 20 do y:free(); y = x:silu() end
    assert.are.equal(before, stats().driver_allocs)
    assert.are.equal(x:sigmoid():mul(x):sum():item(), y:sum():item())
  end)

  it("an op's output in a loop reuses the blocks the collector frees", function()
    -- in a process of its own, with the collector's allowance at 64 MB
    local code = [[
      local loom = require("loom")
      local x, y = loom.randn({ 2097152 })
      for _ = 1, 40 do y = x:silu() end
      local before = loom.memory_stats().driver_allocs
      for _ = 1, 80 do y = x:silu() end
      io.write(loom.memory_stats().driver_allocs - before)
    ]]
    local n = child_number(code, "LOOM_GC_CAP_MB=64")
    -- (a block or two more when the garbage at a collection varies by one output; 80 without reuse)
    assert.is_true(n <= 2, "new mmaps in 80 calls: " .. n)
  end)

  it("caches more large blocks than a big model's step frees (400 here; it held 256)", function()
    local code = [[
      local loom = require("loom")
      local t = {}
      for i = 1, 400 do t[i] = loom.empty({ 262144 }) end   -- 1 MiB each: mapped blocks
      for i = 1, 400 do t[i]:free() end
      local before = loom.memory_stats().driver_allocs
      for i = 1, 400 do t[i] = loom.empty({ 262144 }) end
      io.write(loom.memory_stats().driver_allocs - before)
    ]]
    local n = child_number(code)
    assert.equal(0, n, "fresh mappings for blocks the cache could have kept")
  end)

  it("building a 97M model asks for few collections: its fresh pages are live, not garbage", function()
    local code = [[
      local loom = require("loom")
      local gc = require("loom.gc_pacing")
      local before = gc.collections()
      loom.models.transformer.new { vocab_size = 8192, dim = 768, n_layers = 12, n_heads = 12, max_seq_len = 256 }
      io.write(gc.collections() - before)
    ]]
    local n = child_number(code)
    -- 86 when each one waited for as little as the last: each freed nothing
    assert.is_true(n <= 20, "full collections while building: " .. n)
  end)

  it("a small model's training step, once warm, asks for no full collection per MiB of activations", function()
    -- its blocks (under 1 MiB) come from malloc's heap: reserved grows with
    -- the live set, no fresh pages; the rule for fresh pages once collected
    -- about 12 times a step here (a tenth of the step's time); now at most once
    local code = [[
      local loom = require("loom")
      local gc = require("loom.gc_pacing")
      local model = require("loom.models.transformer").Transformer({ vocab_size = 65, dim = 128, n_layers = 4, n_heads = 4, max_seq_len = 64 })
      local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
      local ids = loom.randint(1, 66, { 12, 64 }, { dtype = "i64" })
      local function step()
        local loss = loom.F.cross_entropy(model(ids):view(-1, 65), ids:view(-1))
        opt:zero_grad() loss:backward() opt:step()
      end
      for _ = 1, 3 do step() end
      local before = gc.collections()
      for _ = 1, 6 do step() end
      io.write(gc.collections() - before)
    ]]
    local n = child_number(code)
    assert.is_true(n <= 6, "full collections in 6 steps: " .. n)
  end)

  it("counts live, peak and reserved bytes", function()
    local s0 = stats()
    local a = loom.empty({ N })
    local s1 = stats()
    assert.is_true(s1.allocated - s0.allocated >= N * 4)
    assert.is_true(s1.peak >= s1.allocated)
    assert.is_true(s1.reserved >= s1.allocated)
    a:free()
    local s2 = stats()
    assert.are.equal(s0.allocated, s2.allocated)
    assert.is_true(s2.reserved >= s1.reserved)     -- cached, still held
    assert.are.equal(s1.peak, s2.peak)
    loom.empty_cache()
    local s3 = stats()
    assert.is_true(s3.reserved <= s2.reserved - N * 4)   -- handed back
  end)

  it("keeps no cache with LOOM_CPU_CACHE_MB=0", function()
    local code = [[
      local loom = require("loom")
      local a = loom.empty({ 4194304 })
      local r1 = loom.memory_stats().reserved
      a:free()
      local r2 = loom.memory_stats().reserved
      io.write(r1 - r2 >= 16777216 and "returned" or ("kept " .. (r1 - r2)))
    ]]
    local rc, out = sys.luajit(code, "LOOM_CPU_CACHE_MB=0")
    assert.equal(0, rc, out)
    assert.are.equal("returned", out)
  end)

  it("rejects devices it does not know, naming the argument", function()
    assert.has_error(function() loom.memory_stats(5) end,
                     "memory_stats: device expected \"cpu\" or \"cuda[:N]\", got 5")
    local ok, err = pcall(loom.memory_stats, "nowhere")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("nowhere", 1, true))
    assert.has_error(function() loom.empty_cache({}) end)
  end)
end)
