-- char.lua: the char corpus's tokenizer (loom.data.CharTokenizer): one id
-- per distinct byte of a text, as nanoGPT's shakespeare-char does.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C

local M = {}

local Tokenizer = {}
Tokenizer.__index = Tokenizer

-- CharTokenizer(text) or CharTokenizer.from_vocab(chars): ids are 1-based,
-- in the byte order of the characters (as nanoGPT's sorted(set(text))).
function M.CharTokenizer(text)
  if type(text) ~= "string" then T.argerror("CharTokenizer", "text", "a string", T.describe(text)) end
  local seen, chars = {}, {}
  for c in text:gmatch(".") do
    if not seen[c] then seen[c] = true chars[#chars + 1] = c end
  end
  table.sort(chars)
  return M.tokenizer_from_vocab(table.concat(chars))
end

function M.tokenizer_from_vocab(vocab)
  local self = setmetatable({ vocab = vocab, itos = {}, stoi = {} }, Tokenizer)
  for i = 1, #vocab do
    local c = vocab:sub(i, i)
    self.itos[i], self.stoi[c] = c, i
  end
  self.vocab_size = #vocab
  return self
end

-- encode(text) -> i64 tensor of ids
function Tokenizer:encode(text)
  local n = #text
  local t = loom.empty({ n }, { dtype = "i64" })
  local p = ffi.cast("int64_t*", C.lm_data(t))
  local stoi = self.stoi
  for i = 1, n do
    local id = stoi[text:sub(i, i)]
    if not id then error(string.format("encode: character %q is not in the vocabulary", text:sub(i, i)), 2) end
    p[i - 1] = id
  end
  return t
end

-- decode(ids): a Lua table or an integer tensor of ids
function Tokenizer:decode(ids)
  if T.is_tensor(ids) then ids = ids:reshape(-1):totable() end
  local out = {}
  for i, id in ipairs(ids) do out[i] = self.itos[id] or "?" end
  return table.concat(out)
end

return M
