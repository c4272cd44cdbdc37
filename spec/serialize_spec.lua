-- serialize_spec.lua: loom.save / loom.load. Round trips of every value
-- kind and dtype, the atomic write (PATH.tmp then rename), and clear errors
-- for truncated, corrupted and foreign files.
local loom = require("loom")
local ffi = require("ffi")
local R = require("support.ref")
local sys = require("support.sys")

local read, write, exists, errmsg = sys.read, sys.write, sys.exists, R.errmsg

-- the bytes of a tensor, for exact comparisons of every dtype
local function bytes(t)
  local c = t:contiguous()
  return ffi.string(c:data_ptr(), c:numel() * ({ f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, bool = 1 })[c.dtype])
end
local function same_tensor(a, b)
  assert.is_true(loom.is_tensor(b))
  assert.equal(a.dtype, b.dtype)
  assert.same(a:size(), b:size())
  if b:numel() > 0 then assert.is_true(b:is_contiguous()) end
  assert.equal(bytes(a), bytes(b))
end

describe("loom.save / loom.load", function()
  local dir
  before_each(function() dir = sys.tmpdir() end)
  after_each(function() sys.rmtree(dir) end)

  it("round-trips nested tables of every dtype and value kind", function()
    local obj = {
      f32 = loom.tensor({ { 1.5, -2.25 }, { 3e-38, 1e30 } }),
      f64 = loom.tensor({ math.pi, -1 / 3, 1e-300 }, { dtype = "f64" }),
      bf16 = loom.tensor({ 1.5, -0.0078125, 256 }, { dtype = "bf16" }),
      f16 = loom.tensor({ 0.1, 65504, -2 }, { dtype = "f16" }),
      i32 = loom.tensor({ -2147483648, 2147483647, 0 }, { dtype = "i32" }),
      i64 = loom.tensor({ { 1, -9007199254740991 } }, { dtype = "i64" }),
      bool = loom.tensor({ true, false, true }),
      scalar = loom.tensor(2.5),                           -- 0-dim
      empty = loom.zeros({ 0 }),
      empty2 = loom.zeros({ 3, 0, 2 }, { dtype = "i64" }),
      nested = { deeper = { list = { 1, 2, "three", { x = true } } } },
      s = "text with \0 bytes\n",
      n = 0.1, int = 42, neg = -7, big = 2 ^ 60, inf = math.huge, nan = 0 / 0,
      yes = true, no = false,
      [3] = "numeric key", ["3"] = "string key",
      i64box = ffi.new("int64_t", -5), u64box = ffi.new("uint64_t", 18446744073709551615ULL),
    }
    local path = dir .. "/all.loom"
    loom.save(obj, path)
    local back = loom.load(path)
    for _, k in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64", "bool", "scalar", "empty", "empty2" } do
      same_tensor(obj[k], back[k])
    end
    assert.equal(0, back.scalar:dim())
    assert.equal(2.5, back.scalar:item())
    assert.same({ 3, 0, 2 }, back.empty2:size())
    assert.same(obj.nested, back.nested)
    assert.equal(obj.s, back.s)
    assert.equal(0.1, back.n)
    assert.equal(42, back.int)
    assert.equal(-7, back.neg)
    assert.equal(2 ^ 60, back.big)
    assert.equal(math.huge, back.inf)
    assert.is_true(back.nan ~= back.nan)
    assert.is_true(back.yes)
    assert.is_false(back.no)
    assert.equal("numeric key", back[3])
    assert.equal("string key", back["3"])
    assert.is_true(ffi.istype("int64_t", back.i64box))
    assert.is_true(back.i64box == -5LL)
    assert.is_true(ffi.istype("uint64_t", back.u64box))
    assert.is_true(back.u64box == 18446744073709551615ULL)
    -- a bare tensor and a bare number are values too
    loom.save(loom.arange(5), path)
    assert.same({ 0, 1, 2, 3, 4 }, loom.load(path):totable())
    loom.save("just a string", path)
    assert.equal("just a string", loom.load(path))
  end)

  it("saves non-contiguous tensors as their values", function()
    local base = loom.tensor(R.rand({ 3, 4 }), { dtype = "f64" })
    local views = { t = base:t(), narrow = base:narrow(2, 2, 2), expand = loom.tensor({ 1, 2 }):view(2, 1):expand(2, 3),
                    perm = loom.tensor(R.rand({ 2, 3, 4 })):permute(3, 1, 2) }
    local path = dir .. "/views.loom"
    loom.save(views, path)
    local back = loom.load(path)
    for k, v in pairs(views) do
      assert.is_false(v:is_contiguous(), k)
      assert.same(v:size(), back[k]:size())
      R.assert_equal(back[k]:totable(), v:totable())
    end
  end)

  it("saves a module's state_dict and an optimizer's state", function()
    local m = loom.nn.Linear(3, 2)
    local path = dir .. "/m.loom"
    loom.save({ model = m:state_dict(), rng = loom.get_rng_state() }, path)
    local m2 = loom.nn.Linear(3, 2)
    local ck = loom.load(path)
    m2:load_state_dict(ck.model)
    R.assert_equal(m2.weight:totable(), m.weight:totable())
    loom.set_rng_state(ck.rng)
  end)

  it("equal values make identical files", function()
    local a, b = dir .. "/a.loom", dir .. "/b.loom"
    loom.save({ z = 1, a = { 3, 2 }, m = loom.ones(2) }, a)
    loom.save({ m = loom.ones(2), a = { 3, 2 }, z = 1 }, b)
    assert.equal(read(a), read(b))
  end)

  it("writes a fresh temporary and renames it: no .tmp is left, the old file stays until the new one is complete", function()
    local path = dir .. "/ck.loom"
    loom.save({ v = 1 }, path)
    assert.is_false(exists(path .. ".tmp"))
    loom.save({ v = 2 }, path)
    assert.is_false(exists(path .. ".tmp"))
    assert.equal(2, loom.load(path).v)
    -- a value that cannot be saved fails before anything is written
    local e = errmsg(loom.save, { v = 3, f = function() end }, path)
    assert.truthy(e:find("obj.f: cannot save a function", 1, true), e)
    assert.equal(2, loom.load(path).v)
    assert.is_false(exists(path .. ".tmp"))
    -- something planted at PATH.tmp is left alone: the temporary is a
    -- fresh name, created exclusively
    os.execute("mkdir '" .. path .. ".tmp'")
    loom.save({ v = 4 }, path)
    assert.equal(4, loom.load(path).v)
    assert.is_true(exists(path .. ".tmp"))   -- (still the directory planted there)
    os.execute("rmdir '" .. path .. ".tmp'")
    -- the file appears under its name only by the rename: saving into a
    -- missing directory fails and creates nothing
    e = errmsg(loom.save, 1, dir .. "/missing/x.loom")
    assert.matches("/missing/x.loom: cannot open for writing", e, 1, true)
    assert.is_false(exists(dir .. "/missing/x.loom"))
  end)

  it("a truncated file is reported as truncated", function()
    local path = dir .. "/t.loom"
    loom.save({ w = loom.randn({ 64 }), name = "weights" }, path)
    local s = read(path)
    for _, keep in ipairs { #s - 1, #s - 8, math.floor(#s / 2), 20, 15, 7, 3 } do
      write(path, s:sub(1, keep))
      local e = errmsg(loom.load, path)
      assert.truthy(e:find("truncated", 1, true), keep .. ": " .. e)
      assert.truthy(e:find(path, 1, true), e)
    end
    write(path, "")
    assert.truthy(errmsg(loom.load, path):find("truncated", 1, true))
  end)

  it("a flipped byte anywhere is reported as corrupt", function()
    local path = dir .. "/c.loom"
    loom.save({ w = loom.randn({ 16 }), step = 3, name = "x" }, path)
    local s = read(path)
    -- past the magic and the length: every record byte, and the checksum
    for pos = 15, #s, 7 do
      local flipped = s:sub(1, pos - 1) .. string.char(bit.bxor(s:byte(pos), 0x10)) .. s:sub(pos + 1)
      write(path, flipped)
      local e = errmsg(loom.load, path)
      assert.truthy(e:find("corrupt", 1, true), pos .. ": " .. e)
    end
    -- a file with bytes appended is not silently accepted either
    write(path, s .. "x")
    assert.truthy(errmsg(loom.load, path):find("corrupt", 1, true))
  end)

  it("a forged string length (checksum rewritten) is corrupt, not an allocation of that size", function()
    -- past the 64 KiB window, a string's bytes were read into a buffer of
    -- its declared length before the length was checked against the file:
    -- 4 GiB for a 60-byte file, and under a memory limit, once the decoder
    -- was compiled, a crash (the fuzzer's case 2:908). In a child under
    -- ulimit -v 3 GB, as the fuzzer runs.
    -- (under ASan, whose shadow memory needs terabytes of address space, without the limit)
    local limit = (os.getenv("LD_PRELOAD") or ""):find("asan") and "" or "ulimit -v 3000000;"
    local path = dir .. "/forged.loom"
    loom.save({ name = "abc" }, path)
    local s = read(path)
    local at = assert(s:find("s\3\0\0\0abc", 1, true))
    for _, n in ipairs { 70000, 0x7ffffff0, 0xfffffff0 } do
      local body = s:sub(1, at) .. ffi.string(ffi.new("uint32_t[1]", n), 4) .. s:sub(at + 5, -9)
      write(path, body .. ffi.string(ffi.new("uint64_t[1]", loom.C.lm_fnv1a(body, #body, 0)), 8))
      local rc, out = sys.luajit(string.format([[
        local loom = require("loom")
        for _ = 1, 100 do   -- enough calls to compile the decoder
          local ok, e = pcall(loom.load, %q)
          assert(not ok and e:find("is corrupt (a record runs past the end)", 1, true), e)
        end
        print("ok")]], path), limit)
      assert.are.equal(0, rc, n .. ": " .. out)
      assert.truthy(out:find("ok", 1, true), out)
    end
  end)

  it("a file that is not loom's, another version, or a missing file: clear errors", function()
    local path = dir .. "/other.txt"
    write(path, "hello, this is a plain text file with enough bytes to look like something")
    local e = errmsg(loom.load, path)
    assert.truthy(e:find("is not a loom file", 1, true), e)
    loom.save(1, path)
    local s = read(path)
    write(path, "LOOM\1" .. s:sub(6))
    e = errmsg(loom.load, path)
    assert.truthy(e:find("unsupported format version 1", 1, true), e)
    e = errmsg(loom.load, dir .. "/nope.loom")
    assert.truthy(e:find("cannot open", 1, true), e)
    assert.truthy(errmsg(loom.load, 5):find("path expected a file name", 1, true))
    assert.truthy(errmsg(loom.save, {}, nil):find("path expected a file name", 1, true))
    assert.truthy(errmsg(loom.save, { [true] = 1 }, path):find("keys must be strings or numbers", 1, true))
  end)

  it("load holds no copy of the file: a 128 MiB tensor raises the peak RSS by less than 1.5x its size", function()
    -- in a child (its own peak); reading the file whole as a string, load
    -- raised it by 545 MiB here
    local path = os.tmpname()
    local w = loom.ones(32 * 2^20)
    loom.save({ w = w }, path)
    w:free()
    local code = string.format([[
      local loom = require("loom")
      local function hwm() return tonumber(io.open("/proc/self/status"):read("*a"):match("VmHWM:%%s*(%%d+) kB")) / 1024 end
      local before = hwm()
      local v = loom.load(%q)
      assert(v.w:numel() == 32 * 2^20 and v.w:min():item() == 1 and v.w:max():item() == 1)
      io.write(string.format("%%.0f", hwm() - before))
    ]], path)
    local rc, out = sys.luajit(code)
    os.remove(path)
    assert.equal(0, rc, out)
    assert.is_true(tonumber(out) ~= nil and tonumber(out) < 192, "peak RSS grew by " .. out .. " MiB")
  end)
end)
