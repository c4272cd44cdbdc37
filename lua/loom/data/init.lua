-- loom.data: the datasets users load: Hugging Face tokenizers
-- (Tokenizer.from_file), nanoGPT's token files (TokenFile), the char corpus
-- (CharTokenizer: one id per character of a text), a seeded batch sampler
-- over any of them (Sampler), and a train/val split.

local M = {}

-- Tokenizer.from_file("tokenizer.json"): Hugging Face tokenizers (BPE),
-- loaded on first use (loom.text.tokenizer)
M.Tokenizer = setmetatable({}, { __index = function(_, k) return require("loom.text.tokenizer")[k] end })

-- TokenFile("train.bin", {dtype = "uint16"|"uint32"}): nanoGPT's token
-- files, memory-mapped (loom.text.token_file); Sampler draws from them too
function M.TokenFile(path, opts) return require("loom.text.token_file").open(path, opts) end

-- CharTokenizer(text) or tokenizer_from_vocab(chars): the char corpus's
-- tokenizer (loom.data.char)
local char = require("loom.data.char")
M.CharTokenizer, M.tokenizer_from_vocab = char.CharTokenizer, char.tokenizer_from_vocab

-- Sampler(ids, {batch, seq, seed, rank, world}): loom.data.sampler
local sampler = require("loom.data.sampler")
M.Sampler = sampler.Sampler
local is_token_file = sampler.is_token_file

function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then
    error("data: cannot open " .. tostring(path) .. ": " .. tostring(err):gsub("^" .. tostring(path):gsub("%p", "%%%0") .. ": ", ""), 2)
  end
  local s = f:read("*a")
  f:close()
  return s
end

-- split(ids, 0.9) -> train, val (views; of a TokenFile too)
function M.split(ids, frac)
  if is_token_file(ids) then return ids:split(frac) end
  local n = ids:numel()
  local k = math.floor(n * (frac or 0.9))
  return ids:narrow(1, 1, k), ids:narrow(1, k + 1, n - k)
end

return M
