-- check_tokenizer_hf.lua: loom's ids against Hugging Face `tokenizers` on
-- one tokenizer.json, over seeded random texts drawn from many scripts and
-- the edge cases tokenizers trip on (combining marks NFC composes, zero-width
-- joiners, emoji sequences, digit runs, other whitespace, letters newer
-- than PCRE2's Unicode tables, special-token
-- strings, apostrophes), plus the fixtures' texts. Needs a Python with
-- `tokenizers` ($PYTHON, else /opt/hfenv/bin/python, else python3): HF's
-- ids come from it in the same run; prints how many texts agree and the
-- first that differ. Exit 1 when any differs.
--   luajit scripts/check_tokenizer_hf.lua TOKENIZER.json [--texts 3000 --seed 1]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/check_tokenizer_hf%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local cjson = require("cjson")
local Tokenizer = require("loom.text.tokenizer")

local path = arg[1]
if not path or path:sub(1, 2) == "--" then
  io.stderr:write("usage: luajit scripts/check_tokenizer_hf.lua TOKENIZER.json [--texts N --seed S]\n")
  os.exit(2)
end
local o = { texts = 3000, seed = 1 }
for i = 2, #arg - 1, 2 do o[arg[i]:gsub("^%-%-", "")] = tonumber(arg[i + 1]) end

local function python()
  if os.getenv("PYTHON") then return os.getenv("PYTHON") end
  local f = io.open("/opt/hfenv/bin/python", "r")
  if f then f:close() return "/opt/hfenv/bin/python" end
  return "python3"
end

-- the texts: Python draws them (its random and chr), so both sides read the same file
local tmp = os.tmpname()
local py = string.format([==[
import json, random, sys
from tokenizers import Tokenizer
rng = random.Random(%d)
pools = [range(0x20, 0x7f), range(0xc0, 0x250), range(0x300, 0x370), range(0x370, 0x400), range(0x400, 0x530),
         range(0x590, 0x5f5), range(0x600, 0x700), range(0x900, 0x980), range(0xe00, 0xe60), range(0x1100, 0x1200),
         range(0x3040, 0x3100), range(0x4e00, 0x4f00), range(0xac00, 0xad00), range(0x1f300, 0x1f700),
         range(0xff00, 0xff60), range(0x2000, 0x2070),
         # code points newer than PCRE2 10.42's Unicode 14: CJK Ext H, Kawi, Garay, new emoji; Dives Akuru
         range(0x31350, 0x313a0), range(0x11f00, 0x11f5a), range(0x10d40, 0x10d8f), range(0x1fa70, 0x1faf8),
         range(0x11900, 0x11960)]
words = [" ", " ", "\n", "\t", "'s", "'T", "'ll", "'ſ", "\u200d", "\u200c", "\ufe0f", "\u0301", "\u0308", "\u3000",
         "\u0085", "\u00a0", "\r\n", "  ", "1234567", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start",
         "<think>", "\U0001f469\u200d\U0001f469\u200d\U0001f467", "\U0001f44d\U0001f3fd", "e\u0301", "\u1100\u1161",
         "\u212b", "\uf900", "def f(x):\n    return x", "http://a.b/c?d=1", "I'M", "DON'T"]
texts = []
for _ in range(%d):
    parts = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.35:
            parts.append(rng.choice(words))
        else:
            pool = rng.choice(pools)
            parts.append("".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 8))))
    texts.append("".join(parts))
fixtures = json.load(open(%q, encoding="utf-8"))["texts"]
texts = fixtures + texts
t = Tokenizer.from_file(%q)
ids = [e.ids for e in t.encode_batch(texts)]
decoded = t.decode_batch(ids, skip_special_tokens=True)
n = t.get_vocab_size()
random_ids = [[rng.randrange(n) for _ in range(rng.randint(1, 20))] for _ in range(len(texts))]
random_decoded = t.decode_batch(random_ids, skip_special_tokens=False)
json.dump({"texts": texts, "ids": ids, "decoded": decoded, "random_ids": random_ids, "random_decoded": random_decoded},
          open(%q, "w", encoding="utf-8"), ensure_ascii=False)
]==], o.seed, o.texts, root .. "spec/fixtures/tokenizers/regex.expected.json", path, tmp)
local pf = assert(io.open(tmp .. ".py", "w")) pf:write(py) pf:close()
local ok = os.execute(python() .. " " .. tmp .. ".py")
os.remove(tmp .. ".py")
if ok ~= 0 and ok ~= true then io.stderr:write("check_tokenizer_hf: the Python side failed (is tokenizers installed?)\n") os.exit(1) end
local f = assert(io.open(tmp, "rb"))
local ref = cjson.decode(f:read("*a"))
f:close()
os.remove(tmp)

local tok = Tokenizer.from_file(path)
local same, shown = 0, 0
for i, text in ipairs(ref.texts) do
  local got = tok:encode(text)
  local want = ref.ids[i]
  local eq = #got == #want
  for k = 1, #want do if not eq then break end eq = got[k] == want[k] + 1 end
  if eq then same = same + 1
  elseif shown < 5 then
    shown = shown + 1
    local g = {}
    for k, v in ipairs(got) do g[k] = v - 1 end
    print(string.format("differs: %q\n  loom-1 %s\n  HF     %s", text, table.concat(g, ","), table.concat(want, ",")))
  end
end
-- decodes: of HF's ids (special tokens skipped), and of random ids (any bytes: U+FFFD where HF puts it)
local dsame, rsame = 0, 0
local function plus1(t) local r = {} for k, v in ipairs(t) do r[k] = v + 1 end return r end
for i = 1, #ref.texts do
  if tok:decode(plus1(ref.ids[i])) == ref.decoded[i] then dsame = dsame + 1
  elseif shown < 10 then shown = shown + 1 print(string.format("decode differs: %q vs HF %q", tok:decode(plus1(ref.ids[i])), ref.decoded[i])) end
  local fine, d = pcall(tok.decode, tok, plus1(ref.random_ids[i]), { skip_special_tokens = false })
  if fine and d == ref.random_decoded[i] then rsame = rsame + 1
  elseif shown < 10 then shown = shown + 1 print(string.format("random decode differs: %s: %q vs HF %q", table.concat(ref.random_ids[i], ","), tostring(d), ref.random_decoded[i])) end
end
print(string.format("%s: %d/%d texts give HF's ids, %d/%d HF's decodes, %d/%d random id lists HF's decodes",
                    path, same, #ref.texts, dsame, #ref.texts, rsame, #ref.texts))
os.exit((same == #ref.texts and dsame == #ref.texts and rsame == #ref.texts) and 0 or 1)
