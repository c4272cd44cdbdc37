-- data.lua: a character-level tokenizer over a text file and a seeded
-- random batch sampler over its train/val splits (90/10).
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C

local M = {}

-- Tokenizer.from_file("tokenizer.json"): Hugging Face tokenizers (BPE),
-- loaded on first use (loom.text.tokenizer)
M.Tokenizer = setmetatable({}, { __index = function(_, k) return require("loom.text.tokenizer")[k] end })

-- TokenFile("train.bin", {dtype = "uint16"|"uint32"}): nanoGPT's token
-- files, memory-mapped (loom.text.token_file); Sampler draws from them too
function M.TokenFile(path, opts) return require("loom.text.token_file").open(path, opts) end
local function is_token_file(x)
  local tf = package.loaded["loom.text.token_file"]
  return tf ~= nil and type(x) == "table" and getmetatable(x) == tf.TokenFile
end

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

function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("data: cannot open " .. tostring(path) .. ": " .. tostring(err), 2) end
  local s = f:read("*a")
  f:close()
  return s
end

local Sampler = {}
Sampler.__index = Sampler

-- Sampler(ids, {batch, seq, seed, rank=0, world=1}): next() gives x, y of
-- (batch, seq) i64 with y shifted by one. Offsets come from their own
-- Philox stream (seed, counter), so sampling never moves loom's RNG and a
-- resumed run draws the same batches. With world > 1 each rank takes its
-- slice of a global batch of batch * world rows (data parallelism).
function M.Sampler(ids, opts)
  if not is_token_file(ids) then   -- (a token file is read row by row from the map)
    T.check_tensor(ids, "Sampler", "ids")
    if ids.dtype ~= "i64" or ids:dim() ~= 1 or not ids:is_contiguous() or ids.device ~= "cpu" then
      T.argerror("Sampler", "ids", "a contiguous 1-D i64 CPU tensor",
                 string.format("a %d-D %s tensor on %s", ids:dim(), ids.dtype, ids.device))
    end
  end
  opts = opts or {}
  local self = setmetatable({ ids = ids, batch = opts.batch or 12, seq = opts.seq or 64,
    seed = opts.seed or 1337, counter = opts.counter or 0, rank = opts.rank or 0,
    world = opts.world or 1 }, Sampler)
  for _, k in ipairs { "batch", "seq", "world" } do
    local v = self[k]
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      T.argerror("Sampler", k, "a positive integer", T.describe(v))
    end
  end
  if type(self.rank) ~= "number" or self.rank < 0 or self.rank >= self.world or self.rank ~= math.floor(self.rank) then
    T.argerror("Sampler", "rank", "an integer in [0, world)", T.describe(self.rank))
  end
  if ids:numel() <= self.seq + 1 then
    error(string.format("Sampler: %d tokens are too few for sequences of %d", ids:numel(), self.seq), 2)
  end
  return self
end

local ctr, key, rnd = ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]"), ffi.new("uint32_t[4]")
local function draw(seed, counter, n)   -- a uniform integer in [0, n)
  ctr[0], ctr[1], ctr[2], ctr[3] = counter % 2^32, math.floor(counter / 2^32), 0, 0
  key[0], key[1] = seed % 2^32, 0
  C.lm_philox4x32(ctr, key, rnd)
  return math.floor((rnd[0] * 2^21 + math.floor(rnd[1] / 2^11)) / 2^53 * n)
end

function Sampler:next()
  local b, t = self.batch, self.seq
  local x = loom.empty({ b, t }, { dtype = "i64" })
  local y = loom.empty({ b, t }, { dtype = "i64" })
  local file = is_token_file(self.ids) and self.ids
  local src = not file and ffi.cast("int64_t*", C.lm_data(self.ids))
  local px, py = ffi.cast("int64_t*", C.lm_data(x)), ffi.cast("int64_t*", C.lm_data(y))
  local span = self.ids:numel() - t - 1
  for row = 0, b * self.world - 1 do   -- every rank draws every offset: its rows are its slice
    local off = draw(self.seed, self.counter + row, span)
    local r = row - self.rank * b
    if r >= 0 and r < b and file then
      file:copy_ids(px + r * t, off, t)
      file:copy_ids(py + r * t, off + 1, t)
    elseif r >= 0 and r < b then
      ffi.copy(px + r * t, src + off, 8 * t)
      ffi.copy(py + r * t, src + off + 1, 8 * t)
    end
  end
  self.counter = self.counter + b * self.world
  return x, y
end

-- state for checkpoints: where the stream is
function Sampler:state() return { counter = self.counter, seed = self.seed } end
function Sampler:set_state(s) self.counter, self.seed = s.counter, s.seed end

-- corpus(path, tokenizer_path) -> tokenizer, train ids, val ids (examples/train.lua):
-- a text file, tokenized by characters or by tokenizer.json, split 90/10;
-- or a token file (.bin, its dtype by the vocabulary: uint16 up to 65536
-- ids) with val.bin beside it as the validation set (else its last 10%)
function M.corpus(path, tokenizer_path)
  local tok = tokenizer_path ~= "" and tokenizer_path and M.Tokenizer.from_file(tokenizer_path)
  if not path:match("%.bin$") then
    local text = M.read_file(path)
    tok = tok or M.CharTokenizer(text)
    local ids = tok:encode(text, { add_special_tokens = false })
    if type(ids) == "table" then ids = loom.tensor(ids, { dtype = "i64" }) end
    return tok, M.split(ids, 0.9)
  end
  if not tok then error("data: " .. path .. " is a token file: pass the tokenizer that made it (--tokenizer)", 0) end
  local dtype = tok.vocab_size <= 65536 and "uint16" or "uint32"
  local train = M.TokenFile(path, { dtype = dtype })
  local val_path = path:gsub("[^/]*$", "val.bin")
  if val_path ~= path and require("loom.fs").is_file(val_path) then
    return tok, train, M.TokenFile(val_path, { dtype = dtype })
  end
  return tok, train:split(0.9)
end

-- split(ids, 0.9) -> train, val (views; of a TokenFile too)
function M.split(ids, frac)
  if is_token_file(ids) then return ids:split(frac) end
  local n = ids:numel()
  local k = math.floor(n * (frac or 0.9))
  return ids:narrow(1, 1, k), ids:narrow(1, k + 1, n - k)
end

return M
