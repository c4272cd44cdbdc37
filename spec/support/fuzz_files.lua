-- fuzz_files.lua: every file reader fed mutated files (issue 26). Run as a
-- script (a child of spec/fuzz_files_spec.lua, under a memory limit, so a
-- crash shows as a signal with its case):
--   luajit spec/support/fuzz_files.lua SEED SECONDS
-- Each iteration picks a reader and mutates a good file with a seeded RNG:
--   safetensors  raw bytes (flip, set, truncate, the length field) or the
--                header's JSON (a token replaced by a hostile value, text
--                cut, nesting and escapes inserted, an entry duplicated)
--   index        a weight_map naming odd files (itself, ../, nested JSON)
--   load         loom.save files with bytes changed and checksum rewritten
--   manifest     a checkpoint's manifest with a field set to a hostile value
--   config       an HF config.json with a field set to a hostile value,
--                read and built by from_pretrained (checked against weights)
-- Every call must return or raise a Lua error: never crash, hang or run out
-- of memory. Prints "case SEED:I READER" before each (flushed) and ends
-- with "fuzz-files: N cases (...), N errors, N returned, T s".
local root = debug.getinfo(1, "S").source:match("^@(.*)spec/support/fuzz_files%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. root .. "spec/?.lua;" .. package.path
local ffi = require("ffi")
local bit = require("bit")
local loom = require("loom")
local sys = require("support.sys")
local ckpt = require("loom.distributed.checkpoint")
local lfs = require("lfs")
local hf = loom.models.hf
local C = loom.C

local seed, budget = tonumber(arg[1]) or 1, tonumber(arg[2]) or 4
local verbose = arg[3] == "-v"   -- also print each call's error
math.randomseed(seed)
local rnd = math.random
local dir = sys.tmpdir()
local FIX = root .. "spec/fixtures/hf_llama_gqa/"

-- values an attacker puts where a number or a string belongs
local HOSTILE = { "null", "-1", "1.5", "1e300", "-0", "9007199254740993", "18446744073709551616", '""', '"x"',
                  "[]", "{}", "true", string.rep("[", 200) .. string.rep("]", 200), '"\\ud800"', '"\\u0000"',
                  "0", "2147483648", "1e-300", "[1,2,3]", '{"rope_type":"llama3"}' }
local function hostile() return HOSTILE[rnd(#HOSTILE)] end

local function mutate_bytes(s)
  local kind = rnd(4)
  if #s == 0 then return "x" end
  if kind == 1 then return s:sub(1, rnd(0, #s - 1)) end                          -- truncate
  local b = { s:byte(1, -1) }
  for _ = 1, rnd(1, 4) do
    local i = rnd(#b)
    b[i] = kind == 2 and bit.bxor(b[i], bit.lshift(1, rnd(0, 7))) or rnd(0, 255)   -- flip or set
  end
  if kind == 4 then b[rnd(#b)] = 255 end
  return string.char(unpack(b))
end

-- the header's JSON with one hostile change
local function mutate_json(h)
  local kind = rnd(6)
  if kind == 1 then   -- a token (number, string, literal) replaced
    local spans = {}
    for a, b in h:gmatch("()[%w\"%.%-_]+()") do spans[#spans + 1] = { a, b } end
    local sp = spans[rnd(#spans)]
    return h:sub(1, sp[1] - 1) .. hostile() .. h:sub(sp[2])
  elseif kind == 2 then return h:sub(1, rnd(0, #h))                               -- cut
  elseif kind == 3 then   -- nesting or an escape inserted
    local at = rnd(#h)
    local ins = ({ string.rep("[", 5000), "\\u", '\\"', "\0", "\255", ",", ":" })[rnd(7)]
    return h:sub(1, at) .. ins .. h:sub(at + 1)
  elseif kind == 4 then   -- an entry duplicated under its name
    local e = h:match('("[^"]+":{[^}]*})')
    return e and h:gsub("}$", "," .. e .. "}") or h
  elseif kind == 5 then return h:gsub("%d+", function(d) return rnd(3) == 1 and tostring(d * rnd(0, 3)) or d end)
  end
  return h:gsub('"(%w+)"', function(w) return rnd(4) == 1 and '"' .. w .. w .. '"' or nil end)
end

---------------------------------------------------------------------------
-- the good files

local good = {}
do
  loom.manual_seed(seed)
  local st = dir .. "/good.safetensors"
  loom.save_safetensors({ w = loom.randn(3, 4), b = loom.rand(5):ge(0.5), i = loom.randint(0, 9, { 6 }),
                          h = loom.randn(2, { dtype = "bf16" }), e = loom.zeros(0, 3) }, st, { metadata = { format = "pt" } })
  good.st = sys.read(st)
  good.st_n = tonumber(ffi.cast("uint64_t *", good.st:sub(1, 8))[0])
  local f = dir .. "/good.loom"
  loom.save({ w = loom.randn(4, 3), meta = { step = 3, name = "x", flags = { true } }, k = loom.randint(0, 5, { 2 }) }, f)
  good.loom = sys.read(f)
  ckpt.save({ w = loom.randn(4, 3), step = 5 }, dir .. "/ck")
  good.manifest = loom.load(dir .. "/ck/manifest.loom")
  good.shards = sys.read(dir .. "/ck/rank00000.shards")
  good.config = sys.read(FIX .. "config.json")
  os.execute(string.format("cp %s %s", sys.shq(FIX .. "model.safetensors"), sys.shq(dir .. "/model.safetensors")))
end

-- sets a random field somewhere in table t to a hostile Lua value
local LUA_HOSTILE = { 0 / 0, math.huge, -1, 1.5, 2 ^ 63, "", "x", "{}", "{1,2}", true, -2 ^ 60, 1e300 }
local function poke(t, depth)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  if #keys == 0 then return end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local k = keys[rnd(#keys)]
  if type(t[k]) == "table" and not loom.is_tensor(t[k]) and depth < 6 and rnd(3) > 1 then return poke(t[k], depth + 1) end
  local v = LUA_HOSTILE[rnd(#LUA_HOSTILE)]
  t[k] = v == "{}" and {} or v == "{1,2}" and { 1, 2 } or v   -- (fresh tables: no cycles)
end
local function deep_copy(v)
  if type(v) ~= "table" or loom.is_tensor(v) then return v end
  local o = {}
  for k, x in pairs(v) do o[k] = deep_copy(x) end
  return o
end

---------------------------------------------------------------------------
-- the readers, each on a freshly mutated file

local readers = {}
function readers.safetensors(i)
  local p = dir .. "/f" .. i .. ".safetensors"
  local s = good.st
  if rnd(2) == 1 then s = mutate_bytes(s)
  else
    local h = mutate_json(s:sub(9, 8 + good.st_n))
    s = ffi.string(ffi.new("uint64_t[1]", #h), 8) .. h .. s:sub(9 + good.st_n)
  end
  sys.write(p, s)
  return function()
    local t = loom.load_safetensors(p)
    require("loom.safetensors").metadata(p)
    return t
  end
end
function readers.index(i)
  local p = dir .. "/i" .. i .. ".json"
  local names = { "good.safetensors", "i" .. i .. ".json", "../good.safetensors", "", ".", "missing.safetensors",
                  "good.loom", "ck" }
  local wm = {}
  for _, n in ipairs { "w", "b", "i", "h", "e" } do wm[#wm + 1] = string.format('"%s":"%s"', n, names[rnd(#names)]) end
  local text = '{"metadata":{},"weight_map":{' .. table.concat(wm, ",") .. "}}"
  if rnd(2) == 1 then text = mutate_json(text) end
  sys.write(p, text)
  return function() return loom.load_safetensors(p) end
end
function readers.load(i)
  local p = dir .. "/l" .. i .. ".loom"
  local s = mutate_bytes(good.loom:sub(1, -9))
  if #s >= 14 then   -- forged past the length and checksum
    s = s:sub(1, 6) .. ffi.string(ffi.new("uint64_t[1]", #s + 8), 8) .. s:sub(15)
  end
  sys.write(p, s .. ffi.string(ffi.new("uint64_t[1]", C.lm_fnv1a(s, #s, 0)), 8))
  return function() return loom.load(p) end
end
function readers.manifest(i)
  local d = dir .. "/m" .. i
  lfs.mkdir(d)
  sys.write(d .. "/rank00000.shards", good.shards)
  local m = deep_copy(good.manifest)
  for _ = 1, rnd(1, 3) do poke(m, 0) end
  loom.save(m, d .. "/manifest.loom")
  return function()
    if rnd(2) == 1 then return loom.load(d) end
    return ckpt.load({ w = loom.zeros(4, 3), step = 0 }, d)
  end
end
function readers.config(i)
  local d = dir .. "/c" .. i
  lfs.mkdir(d)
  lfs.link(dir .. "/model.safetensors", d .. "/model.safetensors", true)
  local text = good.config
  if rnd(3) == 1 then text = mutate_json(text)
  else
    text = text:gsub('("[%w_]+"): ([^,\n]+)', function(k, v) return k .. ": " .. (rnd(5) == 1 and hostile() or v) end)
  end
  if rnd(4) == 1 then text = text:gsub('"rope_theta": [^,\n]+', '"rope_parameters": ' .. hostile()) end
  sys.write(d .. "/config.json", text)
  return function() return hf.from_pretrained(d) end
end

local order = { "safetensors", "index", "load", "manifest", "config" }
local counts, errors, returned = {}, 0, 0
local now = require("loom.train.bench").now   -- the one clock_gettime declaration (loom_timespec)
local t0, i = now(), 0
while now() - t0 < budget do
  i = i + 1
  local name = order[(i - 1) % #order + 1]
  io.write(string.format("case %d:%d %s\n", seed, i, name))
  io.flush()
  local fn = readers[name](i)
  local ok, err = pcall(fn)
  if not ok and verbose then print("  error: " .. tostring(err):sub(1, 300)) end
  counts[name] = (counts[name] or 0) + 1
  if ok then returned = returned + 1 else errors = errors + 1 end
  if i % 50 == 0 then collectgarbage() end
end
local parts = {}
for _, n in ipairs(order) do parts[#parts + 1] = n .. " " .. (counts[n] or 0) end
print(string.format("fuzz-files: %d cases (%s), %d errors, %d returned, %.1f s", i, table.concat(parts, ", "),
                    errors, returned, now() - t0))
sys.rmtree(dir)
