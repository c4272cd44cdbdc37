-- corpus.lua: the data of a training run (examples/train.lua): a text
-- file tokenized by characters (the char corpus) or by a tokenizer.json, or
-- nanoGPT's token files, split into train and validation ids.
local loom = require("loom")
local data = require("loom.data")

local M = {}

-- corpus(path, tokenizer_path) -> tokenizer, train ids, val ids (examples/train.lua):
-- a text file, tokenized by characters or by tokenizer.json, split 90/10;
-- or a token file (.bin, its dtype by the vocabulary: uint16 up to 65536
-- ids) with val.bin beside it as the validation set (else its last 10%)
function M.corpus(path, tokenizer_path)
  local tok = tokenizer_path ~= "" and tokenizer_path and data.Tokenizer.from_file(tokenizer_path)
  if not path:match("%.bin$") then
    local text = data.read_file(path)
    tok = tok or data.CharTokenizer(text)
    local ids = tok:encode(text, { add_special_tokens = false })
    if type(ids) == "table" then ids = loom.tensor(ids, { dtype = "i64" }) end
    return tok, data.split(ids, 0.9)
  end
  if not tok then error("data: " .. path .. " is a token file: pass the tokenizer that made it (--tokenizer)", 0) end
  local dtype = tok.vocab_size <= 65536 and "uint16" or "uint32"
  local train = data.TokenFile(path, { dtype = dtype })
  local val_path = path:gsub("[^/]*$", "val.bin")
  if val_path ~= path and require("loom.fs").is_file(val_path) then
    return tok, train, data.TokenFile(val_path, { dtype = dtype })
  end
  return tok, train:split(0.9)
end

return M
