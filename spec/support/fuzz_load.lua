-- fuzz_load.lua: the loaders fed damaged files. Run as a script (a child of
-- spec/fuzz_load_spec.lua, so a crash shows as a signal with its case):
--   luajit spec/support/fuzz_load.lua SEED ITERATIONS SECONDS
-- It writes a state with loom.save and with dist.checkpoint.save, then for
-- each iteration damages a fresh copy with a seeded RNG and loads it with
-- loom.load (file and directory) and dist.checkpoint.load. Damage of two
-- kinds:
--   raw:    truncate, flip or set random bytes, zero or duplicate a range,
--           append junk, change the length field of loom.save's header,
--           remove a shard file. A load must then raise a Lua error, or
--           give back values equal to the saved ones (the checksums catch
--           the rest): never a wrong value in silence.
--   forged: the damage is made past the checksums (a loom file's bytes
--           changed and its length and checksum written anew; a manifest's
--           fields changed and saved anew): such a file is well formed but
--           lies, and a load must raise a Lua error or return, never crash.
-- Prints "case SEED:I TARGET KIND" before each load (flushed) and ends with
-- "fuzz: N iterations, N loads (N raw: N equal, N errors; N forged: N
-- loaded, N errors), N wrong, T s"; exits 1 when a raw case loaded wrong
-- values.
local root = debug.getinfo(1, "S").source:match("^@(.*)spec/support/fuzz_load%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
local ffi = require("ffi")
local bit = require("bit")
local loom = require("loom")
local dist = require("loom.distributed")
local sys = require("support.sys")
local C = loom.C

local seed, iters, budget = tonumber(arg[1]) or 1, tonumber(arg[2]) or 300, tonumber(arg[3]) or 20
local verbose = arg[4] == "-v"   -- also print each load's error
math.randomseed(seed)
local rnd = math.random
dist.init()

---------------------------------------------------------------------------
-- the state saved, and equality of what comes back

local function state()
  loom.manual_seed(seed)
  return {
    w = loom.randn(5, 3), b = loom.rand(7, { dtype = "f64" }), h = loom.randn(4, { dtype = "bf16" }),
    e = loom.randn(3, { dtype = "f16" }), ids = loom.randint(-9, 9, { 2, 3 }), k = loom.randint(0, 99, { 3 }, { dtype = "i32" }),
    mask = loom.rand(6):ge(0.5), scalar = loom.tensor(2.5), none = loom.zeros(0, 4),
    meta = { step = 12, name = "run \0 7", lr = 3e-4, flags = { true, false } },
  }
end

local function bytes(t)
  local c = t:contiguous()
  return ffi.string(c:data_ptr(), c:numel() * C.lm_dtype_size(c.dtype_))
end

-- a == b: same keys, values, tensors of the same dtype, size and bytes
local function equal(a, b)
  if loom.is_tensor(a) then
    return loom.is_tensor(b) and a.dtype == b.dtype and table.concat(a:size(), "x") == table.concat(b:size(), "x")
        and bytes(a) == bytes(b)
  end
  if type(a) ~= "table" then return a == b or (a ~= a and b ~= b) end
  if type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- a state of zeros shaped like s (what dist.checkpoint.load fills)
local function zeros_like(s)
  local out = {}
  for k, v in pairs(s) do
    if loom.is_tensor(v) then out[k] = loom.zeros(v:size(), { dtype = v.dtype })
    elseif type(v) == "table" then out[k] = zeros_like(v)
    else out[k] = v end
  end
  return out
end

---------------------------------------------------------------------------
-- damage

local u64 = function(n) return ffi.string(ffi.new("uint64_t[1]", n), 8) end

local function raw_damage(s)
  local n, kind = #s, rnd(7)
  if n == 0 then return s .. "junk", "append to empty" end
  if kind == 1 then local at = rnd(0, n - 1) return s:sub(1, at), "truncate at " .. at end
  if kind == 2 then
    local out = { s:byte(1, -1) }
    local k = rnd(1, 4)
    for _ = 1, k do local i = rnd(n) out[i] = bit.bxor(out[i], bit.lshift(1, rnd(0, 7))) end
    local parts = {}
    for i = 1, #out, 4096 do parts[#parts + 1] = string.char(unpack(out, i, math.min(#out, i + 4095))) end
    return table.concat(parts), "flip " .. k .. " bits"
  end
  if kind == 3 then local i = rnd(n) return s:sub(1, i - 1) .. string.char(rnd(0, 255)) .. s:sub(i + 1), "set byte " .. i end
  if kind == 4 then
    local i = rnd(n)
    local len = math.min(n - i + 1, rnd(1, 64))
    return s:sub(1, i - 1) .. string.rep("\0", len) .. s:sub(i + len), "zero " .. len .. " bytes at " .. i
  end
  if kind == 5 then
    local i = rnd(n)
    local len = math.min(n - i + 1, rnd(1, 32))
    return s:sub(1, i + len - 1) .. s:sub(i, i + len - 1) .. s:sub(i + len), "duplicate " .. len .. " bytes at " .. i
  end
  if kind == 6 then return s .. string.rep(string.char(rnd(0, 255)), rnd(1, 16)), "append junk" end
  -- a loom file's length field (bytes 7..14), set to a nearby or absurd value
  local v = ({ #s - 1, #s + 1, 0, 2 ^ 40, 2 ^ 63 })[rnd(5)]
  return s:sub(1, 6) .. u64(ffi.cast("uint64_t", v)) .. s:sub(15), "length field " .. tostring(v)
end

-- a loom file's bytes changed, then its length and checksum made right
local function forge_file(s)
  local body = raw_damage(s:sub(15, -9))
  local lens = { 0, 1, 2, 3, 4, 8, 2 ^ 31, 2 ^ 40, 2 ^ 62, -1 }
  -- half the time aim at a number the decoder reads: a count or a size
  if rnd(2) == 1 and #body > 8 then
    local i = rnd(#body - 7)
    body = body:sub(1, i - 1) .. ffi.string(ffi.new("int64_t[1]", lens[rnd(#lens)]), rnd(2) == 1 and 4 or 8)
        .. body:sub(i + 8)
  end
  local head = s:sub(1, 6) .. u64(6 + 8 + #body + 8)
  local all = head .. body
  return all .. u64(C.lm_fnv1a(all, #all, 0))
end

-- a manifest's field changed and saved anew (a valid file that lies)
local VALUES = { 0, -1, 1, 2, 7, 0.5, 2 ^ 40, 2 ^ 62, -2 ^ 62, 0 / 0, math.huge, "x", true, false, {}, { 1, 2 },
                 { -1 }, { 2 ^ 40 }, "f64", "bool", "i32" }
local function forge_manifest(path)
  local m = loom.load(path)
  -- every table inside, with its keys
  local tables = {}
  local function walk(t) tables[#tables + 1] = t for _, v in pairs(t) do if type(v) == "table" then walk(v) end end end
  walk(m)
  local t = tables[rnd(#tables)]
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local what
  if #keys == 0 or rnd(10) == 1 then
    t[rnd(2) == 1 and "extra" or rnd(5)] = VALUES[rnd(#VALUES)]
    what = "add a key"
  else
    local k = keys[rnd(#keys)]
    local r = rnd(8)
    if r == 1 then t[k] = nil what = "remove " .. tostring(k)
    elseif r == 2 and type(t[k]) == "number" then t[k] = t[k] + ({ -1, 1, 8, -8 })[rnd(4)] what = "nudge " .. tostring(k)
    else t[k] = VALUES[rnd(#VALUES)] what = "set " .. tostring(k) end
  end
  loom.save(m, path)
  return what
end

---------------------------------------------------------------------------
-- the loads

local tmp = sys.tmpdir()
local orig = state()
local file, ckpt = tmp .. "/state.loom", tmp .. "/ckpt"
loom.save(orig, file)
dist.checkpoint.save(orig, ckpt)
local good = { file = sys.read(file) }
local shard_names = {}
for _, name in ipairs(require("loom.fs").list(ckpt)) do
  good[name] = sys.read(ckpt .. "/" .. name)
  shard_names[#shard_names + 1] = name
end

local counts = { raw = 0, equal = 0, raw_err = 0, forged = 0, loaded = 0, forged_err = 0, wrong = 0 }
local function report_wrong(case) counts.wrong = counts.wrong + 1 print("WRONG VALUES: " .. case) end

-- restores the checkpoint directory to what was saved
local function reset_ckpt()
  for _, name in ipairs(require("loom.fs").list(ckpt)) do os.remove(ckpt .. "/" .. name) end
  for _, name in ipairs(shard_names) do sys.write(ckpt .. "/" .. name, good[name]) end
end

local function try(case, forged, fn)
  print("case " .. case) io.stdout:flush()
  if forged then counts.forged = counts.forged + 1 else counts.raw = counts.raw + 1 end
  local ok, got = pcall(fn)
  if not ok then
    if type(got) ~= "string" then error("a load raised a non-string error: " .. tostring(got)) end
    if verbose then print("  -> " .. got) end
    if forged then counts.forged_err = counts.forged_err + 1 else counts.raw_err = counts.raw_err + 1 end
    return
  end
  if forged then counts.loaded = counts.loaded + 1
  elseif equal(orig, got) then counts.equal = counts.equal + 1
  else report_wrong(case) end
end

local t0 = os.clock()
local wall0 = os.time()
local done = 0
for i = 1, iters do
  if os.clock() - t0 > budget or os.time() - wall0 > budget then break end
  done = i
  local id = seed .. ":" .. i
  local target = rnd(4)
  if target == 1 then   -- loom.save's file
    local forged = rnd(2) == 1
    local s, what = good.file
    if forged then s, what = forge_file(s), "forged bytes" else s, what = raw_damage(s) end
    sys.write(file, s)
    try(id .. " file " .. what, forged, function() return loom.load(file) end)
    if rnd(2) == 1 then   -- the same file read by dist.checkpoint.load
      try(id .. " file via checkpoint.load " .. what, forged, function()
        return dist.checkpoint.load(zeros_like(orig), file)
      end)
    end
  else                  -- the checkpoint directory: its manifest or a shard file
    reset_ckpt()
    local forged, what = false
    local name = shard_names[rnd(#shard_names)]
    if target == 2 and rnd(2) == 1 then
      forged, what = true, "manifest " .. forge_manifest(ckpt .. "/manifest.loom")
    elseif rnd(12) == 1 then
      os.remove(ckpt .. "/" .. name)
      what = "remove " .. name
    else
      local d
      sys.write(ckpt .. "/" .. name, (function() local s s, d = raw_damage(good[name]) return s end)())
      what = name .. " " .. d
    end
    if rnd(2) == 1 then
      try(id .. " loom.load(dir) " .. what, forged, function() return loom.load(ckpt) end)
    else
      try(id .. " checkpoint.load " .. what, forged, function()
        local sd = zeros_like(orig)
        dist.checkpoint.load(sd, ckpt)
        return sd
      end)
    end
  end
  if i % 50 == 0 then collectgarbage() end
end
reset_ckpt()
sys.rmtree(tmp)

print(string.format("fuzz: %d iterations, %d loads (%d raw: %d equal, %d errors; %d forged: %d loaded, %d errors), %d wrong, %.1f s",
                    done, counts.raw + counts.forged, counts.raw, counts.equal, counts.raw_err, counts.forged, counts.loaded, counts.forged_err,
                    counts.wrong, os.time() - wall0))
os.exit(counts.wrong == 0 and 0 or 1)
