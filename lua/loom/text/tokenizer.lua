-- tokenizer.lua: Hugging Face tokenizers from their tokenizer.json: BPE
-- models, byte-level (GPT-2, Llama 3, Qwen2/2.5/3, OLMo 2) or SentencePiece
-- style with byte fallback (Llama 2, Mistral, Phi-3, Gemma), their added
-- and special tokens, encode, decode and batch encode with padding. Ids are
-- 1-based, as every index in loom: the id of tokenizer.json plus one.
--
-- The JSON is read by lua-cjson and checked field by field (loom.text.fields),
-- the normalizers run in utf8proc (loom.text.unicode), the pre-tokenizers'
-- regexes in PCRE2 (loom.text.regex), the merge loop in C (core/text/bpe.c).
local ffi = require("ffi")
local cjson = require("cjson")
local F = require("loom.text.fields")
local pipeline = require("loom.text.pipeline")
local decoder = require("loom.text.decoder")
local added = require("loom.text.added")
local regex = require("loom.text.regex")
local lib = require("loom.lib")
local C = lib.C

local M = {}
local MAX_FILE = 256 * 2 ^ 20   -- a tokenizer.json larger than this is refused

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

local function fail(msg) error("Tokenizer: " .. msg, 0) end

-- (lua-cjson decodes {} and [] alike: an empty object passes for an empty array and back)
local json = cjson

local function read_json(path)
  if type(path) ~= "string" then
    error("Tokenizer.from_file: path: expected a string, got " .. type(path), 3)
  end
  local f, err = io.open(path, "rb")
  if not f then error("Tokenizer.from_file: cannot open " .. path .. ": " .. tostring(err), 3) end
  local size = f:seek("end")
  f:seek("set", 0)
  if not size or size > MAX_FILE then
    f:close()
    error(string.format("Tokenizer.from_file: %s is %s bytes, more than the %d a tokenizer.json may have",
                        path, tostring(size), MAX_FILE), 3)
  end
  local s = f:read("*a")
  f:close()
  local ok, j = pcall(json.decode, s)
  if not ok then error("Tokenizer.from_file: " .. path .. " is not JSON: " .. tostring(j), 3) end
  return j
end

local function check_id(id, path)
  if type(id) ~= "number" or id < 0 or id % 1 ~= 0 or id >= C.LM_BPE_MAX_VOCAB then
    F.fail(path, string.format("an id in [0, %d)", C.LM_BPE_MAX_VOCAB), id)
  end
  return id
end

-- the merges as pairs of strings: ["a b", ...] or [["a", "b"], ...], as HF reads them
local function read_merges(m)
  local merges = F.get(m, "merges", "array", "model", {})
  local out = {}
  for rank, mg in ipairs(merges) do
    local a, b
    if type(mg) == "string" then
      a, b = mg:match("^([^ ]*) ([^ ]*)$")
    elseif F.is_array(mg) and #mg == 2 and type(mg[1]) == "string" and type(mg[2]) == "string" then
      a, b = mg[1], mg[2]
    end
    if not a then F.fail("model.merges[" .. rank .. "]", "\"left right\" (one space) or [\"left\", \"right\"]", mg) end
    out[rank] = { a, b }
  end
  return out
end

-- the BPE model into C: tokens as raw bytes (byte-level: through GPT-2's
-- map; tokens outside it can never be made and are left out), merges as
-- (left, right, merged)
local function build_model(self, m, byte_level)
  F.object(m, "model")
  local mtype = F.get(m, "type", "string", "model", "BPE")
  if mtype ~= "BPE" then fail("model: the model " .. mtype .. " is not supported (loom reads BPE models)") end
  for _, k in ipairs { "continuing_subword_prefix", "end_of_word_suffix" } do
    local v = F.get(m, k, "string", "model", "")   -- "" (Qwen2's layout) is the same as none
    if v ~= "" then fail("model." .. k .. ": BPE models with a " .. k .. " (" .. v .. ") are not supported") end
  end
  local dropout = F.get(m, "dropout", "number", "model", 0)
  if dropout ~= 0 then fail("model.dropout: BPE dropout (" .. dropout .. ") is random and not supported; set it to null") end
  local vocab = F.need(m, "vocab", "object", "model")
  local byte_fallback = F.get(m, "byte_fallback", "boolean", "model", false)
  local fuse_unk = F.get(m, "fuse_unk", "boolean", "model", false)
  local ignore_merges = F.get(m, "ignore_merges", "boolean", "model", false)
  local unk_token = F.get(m, "unk_token", "string", "model")
  local merges = read_merges(m)
  local n, owner = 0, {}
  for tok, id in pairs(vocab) do
    check_id(id, "model.vocab[" .. string.format("%q", tok) .. "]")
    if owner[id] then
      fail(string.format("model.vocab: %q and %q share the id %d", owner[id], tok, id))
    end
    owner[id] = tok
    n = math.max(n, id + 1)
  end
  self.vocab, self.owner = vocab, owner
  for _, a in ipairs(self.added) do n = math.max(n, a.id) end
  if n == 0 then fail("model.vocab: the vocabulary is empty") end
  self.vocab_size = n
  local bpe = C.lm_bpe_new(n)
  if bpe == nil then fail(ffi.string(C.lm_last_error())) end
  self.bpe = ffi.gc(bpe, C.lm_bpe_free)
  local byte_ids = ffi.new("int32_t[256]")
  for i = 0, 255 do byte_ids[i] = -1 end
  for tok, id in pairs(vocab) do
    local raw = tok
    if byte_level then raw = decoder.byte_level_bytes(tok) end
    if raw and raw ~= "" and C.lm_bpe_add_token(self.bpe, raw, #raw, id) ~= 0 then
      fail("model.vocab[" .. string.format("%q", tok) .. "]: " .. ffi.string(C.lm_last_error()))
    end
    local hex = byte_fallback and #tok == 6 and tok:match("^<0x(%x%x)>$")
    if hex and hex == hex:upper() then byte_ids[tonumber(hex, 16)] = id end   -- HF looks up <0x%02X>
  end
  for rank, mg in ipairs(merges) do
    local a, b = mg[1], mg[2]
    local l, r, merged = vocab[a], vocab[b], vocab[a .. b]
    if not (l and r and merged) then
      fail(string.format("model.merges[%d]: the merge (%s %s) is out of the vocabulary", rank, a, b))
    end
    if C.lm_bpe_add_merge(self.bpe, l, r, merged, rank - 1) ~= 0 then fail(ffi.string(C.lm_last_error())) end
  end
  local unk = -1
  if unk_token then
    unk = vocab[unk_token]
    if not unk then fail(string.format("model.unk_token: %q is not in the vocabulary", unk_token)) end
  end
  C.lm_bpe_set_options(self.bpe, byte_level and 1 or 0, ignore_merges and 1 or 0, unk, byte_fallback and byte_ids or nil)
  C.lm_bpe_set_fuse_unk(self.bpe, fuse_unk and 1 or 0)
end

-- the added tokens, checked against the vocabulary: one that is in it keeps
-- its id, one that is not takes an id of its own
local function read_added(self, j)
  local list = F.get(j, "added_tokens", "array", "tokenizer.json", {})
  local by_content, by_id = {}, {}
  for i, a in ipairs(list) do
    local path = "added_tokens[" .. i .. "]"
    F.object(a, path)
    local content = F.need(a, "content", "string", path)
    if content == "" then F.fail(path .. ".content", "a non-empty string", content) end
    local id = check_id(a.id, path .. ".id")
    local special = F.get(a, "special", "boolean", path, false)
    local e = { id = id + 1, content = content, special = special,
                lstrip = F.get(a, "lstrip", "boolean", path, false), rstrip = F.get(a, "rstrip", "boolean", path, false),
                normalized = F.get(a, "normalized", "boolean", path, not special) }
    if F.get(a, "single_word", "boolean", path, false) then fail(path .. ": single_word added tokens are not supported") end
    if by_content[content] then fail(string.format("%s: the token %q is added twice", path, content)) end
    if by_id[id] then fail(string.format("%s: %q and %q share the id %d", path, by_id[id], content, id)) end
    by_content[content], by_id[id] = e, content
    self.added[#self.added + 1] = e
  end
end

local function check_added(self)
  for i, a in ipairs(self.added) do
    local in_vocab, owner = self.vocab[a.content], self.owner[a.id - 1]
    if in_vocab and in_vocab ~= a.id - 1 then
      fail(string.format("added_tokens[%d]: %q has the id %d, but the vocabulary gives it %d", i, a.content, a.id - 1, in_vocab))
    end
    if owner and owner ~= a.content then
      fail(string.format("added_tokens[%d]: the id %d of %q is the vocabulary's token %q", i, a.id - 1, a.content, owner))
    end
  end
end

-- from_file(path) -> tokenizer (path: a tokenizer.json, or a model's
-- directory holding one); from_json(table) the same from a decoded one
function M.from_file(path)
  if type(path) == "string" and require("loom.fs").is_dir(path) then path = path:gsub("/*$", "") .. "/tokenizer.json" end
  local self = M.from_json(read_json(path))
  self.source = path   -- (what hf.save_pretrained copies beside a model)
  return self
end

function M.from_json(j)
  if not F.is_object(j) then F.fail("tokenizer.json", "an object", j) end
  local self = setmetatable({ added = {}, token_to_id = {} }, Tokenizer)
  read_added(self, j)
  self.normalize = pipeline.normalizer(j.normalizer)
  self.pre = pipeline.pretokenizer(j.pre_tokenizer)
  self.dec = decoder.decoder(j.decoder)
  build_model(self, j.model, self.pre.byte_level)
  check_added(self)
  self.tokens = {}   -- 1-based id -> its token string (HF's spelling)
  for tok, id in pairs(self.vocab) do self.tokens[id + 1] = tok self.token_to_id[tok] = id + 1 end
  self.special = {}
  local raw, normalized = {}, {}
  for _, a in ipairs(self.added) do
    self.tokens[a.id] = a.content
    self.token_to_id[a.content] = a.id
    if a.special then self.special[a.content] = true end
    if a.normalized then   -- matched, and spelled (id_to_token, decode), as the normalizer writes it
      local n = self.normalize and self.normalize(a.content) or a.content
      if n ~= "" then normalized[#normalized + 1] = { content = n, id = a.id, lstrip = a.lstrip, rstrip = a.rstrip } end
      self.tokens[a.id] = n
    else
      raw[#raw + 1] = a
    end
  end
  -- HF matches the tokens that are not normalized in the raw text, the others in the normalized pieces
  self.match_raw, self.match_normalized = added.new(raw), added.new(normalized)
  self.post = pipeline.post_processor(j.post_processor, function(id, path)
    check_id(id, path)
    if not self.tokens[id + 1] then F.fail(path, "an id of the vocabulary or an added token", id) end
    return id
  end)
  local pad = F.is_object(j.padding) and j.padding.pad_id
  if pad ~= nil and pad ~= false then
    check_id(pad, "padding.pad_id")
    if not self.tokens[pad + 1] then F.fail("padding.pad_id", "an id of the vocabulary or an added token", pad) end
  end
  self.pad_id = pad and pad + 1 or self.token_to_id["<pad>"]
  return self
end

-- the model's ids of a normalized, token-free piece of text into out
local buf, buf_n = nil, 0
local function encode_piece(self, seg, first, out, newer)
  local text, starts, stops = pipeline.pieces(self.pre, seg, first, newer)
  if #text == 0 then return end
  local longest = 0
  for i = 1, #starts do longest = math.max(longest, stops[i] - starts[i]) end
  if buf_n < longest then buf_n = longest * 2 buf = ffi.new("int32_t[?]", buf_n) end
  local n = #out
  for i = 1, #starts do
    local a, b = starts[i], stops[i]
    if b > a then   -- (text itself is passed: a pointer cast from it would not keep it alive)
      local k = C.lm_bpe_encode(self.bpe, text, a, b, buf, buf_n)
      if k < 0 then fail(ffi.string(C.lm_last_error())) end
      for j = 0, tonumber(k) - 1 do n = n + 1 out[n] = buf[j] + 1 end
    end
  end
end

-- the ids of a text between raw added tokens into out: HF normalizes it,
-- then finds the normalized added tokens in it, then the model encodes the rest
local function encode_segment(self, seg, first, out, newer)
  if self.normalize then seg = self.normalize(seg, newer) end
  local norm = self.match_normalized
  if not (norm.class and seg:find(norm.class)) then return encode_piece(self, seg, first, out, newer) end
  norm:split(seg, function(x, y, e)
    if e then out[#out + 1] = e.id else encode_piece(self, seg:sub(x, y), first and x == 1, out, newer) end
  end)
end

-- encode(text, {add_special_tokens = true}) -> a Lua table of 1-based ids
function Tokenizer:encode(text, opts)
  if type(text) ~= "string" then error("Tokenizer:encode: text: expected a string, got " .. type(text), 2) end
  opts = opts or {}
  -- (the text's UTF-8 checked once, up front; a text holding code points newer than PCRE2's
  -- Unicode tables runs the regexes that class them as HF's Oniguruma does)
  local newer = regex.newer_than_tables(text)
  local out = {}
  local raw = self.match_raw
  if raw.class and text:find(raw.class) then
    raw:split(text, function(a, b, e)
      if e then out[#out + 1] = e.id else encode_segment(self, text:sub(a, b), a == 1, out, newer) end
    end)
  else   -- (most texts: no added token can start in them)
    encode_segment(self, text, true, out, newer)
  end
  if self.post and opts.add_special_tokens ~= false then out = self.post(out) end
  return out
end

local function as_list(ids, what)
  if type(ids) == "table" and ids.dtype == nil then return ids end
  local T = require("loom.tensor")
  if T.is_tensor(ids) then return ids:reshape(-1):totable() end
  error(what .. ": ids: expected a table or a tensor of ids, got " .. type(ids), 3)
end

-- decode(ids, {skip_special_tokens = true}) -> text (ids: a table or a tensor)
function Tokenizer:decode(ids, opts)
  ids = as_list(ids, "Tokenizer:decode")
  local skip = not (opts and opts.skip_special_tokens == false)
  local toks = {}
  for i, id in ipairs(ids) do
    local tok = self.tokens[id]
    if tok == nil then error(string.format("Tokenizer:decode: ids[%d] = %s is not a token id", i, tostring(id)), 2) end
    if not (skip and self.special[tok]) then toks[#toks + 1] = tok end
  end
  return self.dec(toks)
end

-- encode_batch(texts, {padding = "longest"|"max_length", max_length,
-- pad_id, truncation = false, add_special_tokens}) -> ids, attention_mask:
-- (B, T) i64 tensors, padded on the right with pad_id (1-based; default the
-- tokenizer's padding id or its <pad> token), the mask 1 on real tokens
function Tokenizer:encode_batch(texts, opts)
  if type(texts) ~= "table" or #texts == 0 then error("Tokenizer:encode_batch: texts: expected a non-empty list of strings", 2) end
  opts = opts or {}
  local pad = opts.pad_id or self.pad_id
  if type(pad) ~= "number" then error("Tokenizer:encode_batch: pad_id: the tokenizer has no padding token; pass opts.pad_id", 2) end
  local rows, width = {}, 0
  for i, t in ipairs(texts) do
    if type(t) ~= "string" then error("Tokenizer:encode_batch: texts[" .. i .. "]: expected a string, got " .. type(t), 2) end
    local ids = self:encode(t, opts)
    if opts.truncation and opts.max_length and #ids > opts.max_length then ids = { unpack(ids, 1, opts.max_length) } end
    rows[i] = ids
    width = math.max(width, #ids)
  end
  if opts.padding == "max_length" then
    if type(opts.max_length) ~= "number" then error("Tokenizer:encode_batch: max_length: expected a number with padding = \"max_length\"", 2) end
    width = math.max(width, opts.max_length)
  end
  local loom = require("loom")
  local ids = loom.full({ #rows, math.max(width, 1) }, pad, { dtype = "i64" })
  local mask = loom.zeros({ #rows, math.max(width, 1) }, { dtype = "i64" })
  local pi, pm = ffi.cast("int64_t *", C.lm_data(ids)), ffi.cast("int64_t *", C.lm_data(mask))
  for r, row in ipairs(rows) do
    for c, id in ipairs(row) do pi[(r - 1) * width + c - 1], pm[(r - 1) * width + c - 1] = id, 1 end
  end
  return ids, mask
end

-- the token string of a 1-based id (HF's spelling: Ġ for a byte-level space)
function Tokenizer:id_to_token(id) return self.tokens[id] end
function Tokenizer:get_vocab_size() return self.vocab_size end

return M
