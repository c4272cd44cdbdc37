-- checkpoint_format_spec.lua: one checkpoint format family for one process
-- and many. loom.load reads a dist.checkpoint directory whole, and
-- dist.checkpoint.load takes each rank's shard from a loom.save file; a
-- failed load of DIR says what is wrong and offers DIR.old. Runs on any
-- number of ranks (scripts/test.sh: 2 and 4). References are full tensors
-- drawn with the same seed on every rank; shards are cut with torch.chunk
-- arithmetic written here. Every rank collects its mismatches and asserts
-- after the collectives, so a failure cannot hang the others.
local ffi = require("ffi")
local loom = require("loom")
local dist = require("loom.distributed")
local fs = require("loom.fs")
local ck = dist.checkpoint
local S = require("support.dist")

local Shard, Replicate = dist.Shard, dist.Replicate
local ws, me = dist.world_size(), dist.rank()
local mesh = dist.init_device_mesh("cpu", { ws })

local ROOT = S.scratch_dir("ckfmt-spec")
local on0 = S.on0
teardown(function() on0(function() fs.rm_rf(ROOT) end) end)
local function path(name) return ROOT .. "/" .. name end

local function randn(seed, ...)
  loom.manual_seed(seed)
  return loom.randn(...)
end
-- torch.chunk: size and 0-based offset of chunk q of n in k
local function chunk(n, k, q)
  local c = math.ceil(n / k)
  return math.max(0, math.min(c, n - q * c)), math.min(q * c, n)
end
-- exact comparison of two plain tensors, collected into bad
local function same(bad, what, got, want)
  if got == nil then bad[#bad + 1] = what .. ": nil" return end
  if dist.is_dtensor(got) then bad[#bad + 1] = what .. ": a DTensor" return end
  local a, b = got:size(), want:size()
  if table.concat(a, "x") ~= table.concat(b, "x") then
    bad[#bad + 1] = what .. ": size " .. table.concat(a, "x") .. " vs " .. table.concat(b, "x")
  elseif got.dtype ~= want.dtype then
    bad[#bad + 1] = what .. ": dtype " .. got.dtype .. " vs " .. want.dtype
  elseif got:numel() > 0 and (got:to("f64") - want:to("f64")):abs():max():item() ~= 0 then
    bad[#bad + 1] = what .. ": values differ"
  end
end
local D = require("support.dist")
local err_of, has = D.err_of, D.has

local W, B = randn(11, 10, 6), randn(12, 5)
local IDS = loom.arange(7):to("i64")

describe("loom.load of a dist.checkpoint directory", function()
  it("gives the whole state_dict back with full plain tensors, on every rank", function()
    local dir = path("whole")
    local sd = { model = { w = dist.distribute_tensor(W, mesh, { Shard(2) }),       -- uneven on 4 ranks
                           b = dist.distribute_tensor(B, mesh, { Replicate() }) },
                 ids = IDS, step = 3, meta = { name = "run", big = ffi.new("int64_t", 2 ^ 40) } }
    ck.save(sd, dir)
    local got = loom.load(dir)
    local bad = {}
    same(bad, "model.w", got.model.w, W)
    same(bad, "model.b", got.model.b, B)
    same(bad, "ids", got.ids, IDS)
    assert.same({}, bad)
    assert.equal(3, got.step)
    assert.equal("run", got.meta.name)
    assert.is_true(got.meta.big == ffi.new("int64_t", 2 ^ 40))
    -- with a trailing slash too
    same(bad, "model.w (dir/)", loom.load(dir .. "/").model.w, W)
    assert.same({}, bad)
  end)
end)

describe("dist.checkpoint.load of a loom.save file", function()
  local file = path("single.loom")
  on0(function() loom.save({ model = { w = W, b = B }, ids = IDS, step = 5, opts = { lr = 0.1 } }, file) end)

  it("gives every rank its shard of the file's full tensors", function()
    local sd = { model = { w = dist.distribute_tensor(loom.zeros(10, 6), mesh, { Shard(1) }),
                           b = dist.distribute_tensor(loom.zeros(5), mesh, { Replicate() }) },
                 ids = loom.zeros({ 7 }, { dtype = "i64" }) }
    local ret = ck.load(sd, file)
    local n, o = chunk(10, ws, me)
    local bad = {}
    same(bad, "w shard", sd.model.w:to_local(), W:narrow(1, o + 1, n))
    same(bad, "w full", sd.model.w:full_tensor(), W)
    same(bad, "b", sd.model.b:to_local(), B)
    same(bad, "ids", sd.ids, IDS)
    assert.same({}, bad)
    assert.equal(sd, ret)
    assert.equal(5, sd.step)
    assert.equal(0.1, sd.opts.lr)
  end)

  it("says what does not match, naming the file, on every rank", function()
    local e1 = err_of(ck.load, { model = { w = dist.distribute_tensor(loom.zeros(10, 5), mesh, { Shard(1) }) } }, file)
    local e2 = err_of(ck.load, { model = { w = loom.zeros(10, 6), extra = loom.zeros(1) } }, file)
    local e3 = err_of(ck.load, { model = { w = loom.zeros({ 10, 6 }, { dtype = "f64" }) } }, file)
    local sd = { model = { w = loom.zeros(10, 6), extra = loom.full({ 1 }, 9) } }
    ck.load(sd, file, { strict = false })
    -- a file that is not a state_dict, and one that is not loom's
    local scalar, junk = path("scalar.loom"), path("junk.bin")
    on0(function()
      loom.save(42, scalar)
      local f = io.open(junk, "wb")
      f:write("not loom")
      f:close()
    end)
    local e4 = err_of(ck.load, { w = loom.zeros(1) }, scalar)
    local e5 = err_of(ck.load, { w = loom.zeros(1) }, junk)
    assert.is_true(has(e1, "tensor model.w", "10x5", "10x6", file), tostring(e1))
    assert.is_true(has(e2, "tensor model.extra is not in the checkpoint", file), tostring(e2))
    assert.is_true(has(e3, "tensor model.w", "f64", "f32", file), tostring(e3))
    local bad = {}
    same(bad, "w", sd.model.w, W)
    same(bad, "extra", sd.model.extra, loom.full({ 1 }, 9))
    assert.same({}, bad)
    assert.is_true(has(e4, "checkpoint.load", scalar, "not a state_dict"), tostring(e4))
    assert.is_true(has(e5, "checkpoint.load", junk, "not a loom file"), tostring(e5))
  end)
end)

describe("a failed load of DIR", function()
  local function sd_of(v) return { w = dist.distribute_tensor(loom.full({ 8, 2 }, v), mesh, { Shard(1) }), v = v } end
  local function fresh() return { w = dist.distribute_tensor(loom.zeros(8, 2), mesh, { Shard(1) }) } end
  local function last_file(dir) return string.format("%s/rank%05d.shards", dir, ws - 1) end

  it("says the directory is missing, and offers DIR.old only when it holds a checkpoint", function()
    local dir = path("gone")
    local e0 = err_of(ck.load, fresh(), dir)
    ck.save(sd_of(1), dir)
    on0(function() fs.rename(dir, dir .. ".old") end)   -- a save interrupted between its two renames
    local e1 = err_of(ck.load, fresh(), dir)
    local e2 = err_of(loom.load, dir)
    local sd = ck.load(fresh(), dir .. ".old")   -- what it offers loads
    assert.is_true(has(e0, dir, "does not exist"), tostring(e0))
    assert.is_nil(e0:find(".old", 1, true))
    assert.is_true(has(e1, "checkpoint.load", dir, "does not exist", dir .. ".old",
                       'dist.checkpoint.load(state_dict, "' .. dir .. '.old")'), tostring(e1))
    assert.is_true(has(e2, "load", dir, dir .. ".old", 'loom.load("' .. dir .. '.old")'), tostring(e2))
    assert.equal(1, sd.v)
  end)

  it("says a shard file is truncated or the manifest corrupt, and offers DIR.old", function()
    local dir = path("damaged")
    ck.save(sd_of(1), dir .. ".old")
    ck.save(sd_of(2), dir)
    on0(function()
      local f = io.open(last_file(dir), "rb")
      local s = f:read("*a")
      f:close()
      f = io.open(last_file(dir), "wb")
      f:write(s:sub(1, #s - 3))
      f:close()
    end)
    local e1 = err_of(ck.load, fresh(), dir)
    local e2 = err_of(loom.load, dir)
    local e3 = err_of(ck.verify, dir)
    on0(function()
      local m = dir .. "/manifest.loom"
      local f = io.open(m, "rb")
      local s = f:read("*a")
      f:close()
      f = io.open(m, "wb")
      f:write(s:sub(1, 40) .. string.char((s:byte(41) + 1) % 256) .. s:sub(42))
      f:close()
    end)
    local e4 = err_of(ck.load, fresh(), dir)
    local e5 = err_of(loom.load, dir)
    -- a mismatch of the state_dict is not the files' fault: no DIR.old offered
    local e6 = err_of(ck.load, { w = loom.zeros(3) }, dir .. ".old")
    assert.is_true(has(e1, "tensor w", last_file(dir), "truncated", dir .. ".old"), tostring(e1))
    assert.is_true(has(e2, "load: ", last_file(dir), "truncated", 'loom.load("' .. dir .. '.old")'), tostring(e2))
    assert.is_true(has(e3, last_file(dir), "truncated", dir .. ".old"), tostring(e3))
    assert.is_true(has(e4, dir .. "/manifest.loom", "corrupt", dir .. ".old"), tostring(e4))
    assert.is_true(has(e5, dir .. "/manifest.loom", "corrupt", dir .. ".old"), tostring(e5))
    assert.is_true(has(e6, "tensor w", "3", "8x2"), tostring(e6))
    assert.is_nil(e6:find(".old.old", 1, true))
  end)
end)

describe("the writers keep to their own format", function()
  it("loom.save refuses DTensors and directories, naming what to use instead", function()
    local d = dist.distribute_tensor(W, mesh, { Shard(1) })
    local e1 = err_of(loom.save, { model = { w = d } }, path("never.loom"))
    ck.save({ w = d }, path("a-dir"))
    local e2 = err_of(loom.save, { w = W }, path("a-dir"))
    assert.is_true(has(e1, "obj.model.w", "DTensor", "dist.checkpoint.save(state_dict, dir)", ":full_tensor()"),
                   tostring(e1))
    assert.is_false(fs.exists(path("never.loom")))
    assert.is_true(has(e2, path("a-dir"), "is a directory", "dist.checkpoint.save"), tostring(e2))
  end)

  it("dist.checkpoint.save refuses to replace a file that loom.save wrote", function()
    local file = path("keep.loom")
    on0(function() loom.save({ w = W }, file) end)
    local e = err_of(ck.save, { w = dist.distribute_tensor(W, mesh, { Shard(1) }) }, file)
    assert.is_true(has(e, file, "is not a loom checkpoint", "refusing"), tostring(e))
    local bad = {}
    same(bad, "the file", loom.load(file).w, W)
    assert.same({}, bad)
  end)
end)
