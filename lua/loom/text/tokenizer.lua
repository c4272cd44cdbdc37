-- tokenizer.lua: Hugging Face tokenizers from their tokenizer.json: BPE
-- models, byte-level (GPT-2, Llama 3) or SentencePiece style with byte
-- fallback (Llama 2), their added and special tokens, encode, decode and
-- batch encode with padding. Ids are 1-based, as every index in loom: the
-- id of tokenizer.json plus one.
--
-- The JSON is read by lua-cjson, the pre-tokenizers' regexes run in PCRE2
-- (loom.text.regex) and the merge loop in C (core/text/bpe.c).
local ffi = require("ffi")
local cjson = require("cjson")
local pipeline = require("loom.text.pipeline")
local lib = require("loom.lib")
local C = lib.C

local M = {}
local MAX_FILE = 256 * 2 ^ 20   -- a tokenizer.json larger than this is refused
local NULL = cjson.null

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

local function fail(msg) error("Tokenizer: " .. msg, 0) end

-- GPT-2's byte <-> printable character map (bytes_to_unicode): tokens of a
-- byte-level vocabulary are spelled in these characters
local unicode_to_byte
local function byte_map()
  if unicode_to_byte then return unicode_to_byte end
  unicode_to_byte = {}
  local n = 0
  for b = 0, 255 do
    local keep = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255)
    local cp = keep and b or 256 + n
    if not keep then n = n + 1 end
    local ch = cp < 0x80 and string.char(cp) or string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    unicode_to_byte[ch] = string.char(b)
  end
  return unicode_to_byte
end

-- the raw bytes of a byte-level token, or nil when it has other characters
local function byte_level_bytes(tok)
  local map, out = byte_map(), {}
  for ch in tok:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
    local b = map[ch]
    if not b then return nil end
    out[#out + 1] = b
  end
  return table.concat(out)
end

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
  local ok, j = pcall(cjson.decode, s)
  if not ok then error("Tokenizer.from_file: " .. path .. " is not JSON: " .. tostring(j), 3) end
  return j
end

local function check_id(id, what)
  if type(id) ~= "number" or id < 0 or id % 1 ~= 0 or id >= C.LM_BPE_MAX_VOCAB then
    fail(string.format("%s: expected an id in [0, %d), got %s", what, C.LM_BPE_MAX_VOCAB,
                       type(id) == "string" and string.format("the string %q", id) or tostring(id)))
  end
  return id
end

-- the BPE model into C: tokens as raw bytes, merges as (left, right, merged)
local function build_model(self, m, byte_level)
  if type(m) ~= "table" or m.type ~= "BPE" then
    fail("the model " .. tostring(type(m) == "table" and m.type or m) .. " is not supported (loom reads BPE models)")
  end
  for _, k in ipairs { "continuing_subword_prefix", "end_of_word_suffix", "dropout" } do
    if m[k] ~= nil and m[k] ~= NULL then fail("BPE models with " .. k .. " are not supported") end
  end
  if type(m.vocab) ~= "table" then fail("model.vocab: expected an object") end
  local n = 0
  for tok, id in pairs(m.vocab) do
    check_id(id, "model.vocab[" .. tok .. "]")
    n = math.max(n, id + 1)
  end
  for _, a in ipairs(self.added) do n = math.max(n, a.id) end
  self.vocab_size = n
  local bpe = C.lm_bpe_new(n)
  if bpe == nil then fail(ffi.string(C.lm_last_error())) end
  self.bpe = ffi.gc(bpe, C.lm_bpe_free)
  local pieces, byte_ids = {}, ffi.new("int32_t[256]", -1)
  for i = 0, 255 do byte_ids[i] = -1 end
  for tok, id in pairs(m.vocab) do
    local raw = byte_level and byte_level_bytes(tok) or tok
    if raw ~= "" and C.lm_bpe_add_token(self.bpe, raw, #raw, id) ~= 0 then fail(ffi.string(C.lm_last_error())) end
    pieces[id + 1] = raw
    local hex = not byte_level and m.byte_fallback and tok:match("^<0x(%x%x)>$")
    if hex then byte_ids[tonumber(hex, 16)] = id end
  end
  local merges = m.merges or {}
  if type(merges) ~= "table" then fail("model.merges: expected an array") end
  for rank, mg in ipairs(merges) do
    local a, b
    if type(mg) == "string" then a, b = mg:match("^(.-) (.*)$")
    elseif type(mg) == "table" then a, b = mg[1], mg[2] end
    local l, r = m.vocab[a or false], m.vocab[b or false]
    local merged = a and b and m.vocab[a .. b]
    if not (l and r and merged) then fail("merge " .. rank .. " (" .. tostring(a) .. " " .. tostring(b) .. ") is out of the vocabulary") end
    if C.lm_bpe_add_merge(self.bpe, l, r, merged, rank - 1) ~= 0 then fail(ffi.string(C.lm_last_error())) end
  end
  local unk = (m.unk_token ~= nil and m.unk_token ~= NULL) and m.vocab[m.unk_token] or -1
  C.lm_bpe_set_options(self.bpe, byte_level and 1 or 0, m.ignore_merges == true and 1 or 0, unk,
                       m.byte_fallback and byte_ids or nil)
  self.pieces = pieces   -- 1-based id -> what it decodes to (before the decoder)
end

-- from_file(path) -> tokenizer (path: a tokenizer.json, or a model's
-- directory holding one); from_json(table) the same from a decoded one
function M.from_file(path)
  if type(path) == "string" and require("loom.fs").is_dir(path) then path = path:gsub("/*$", "") .. "/tokenizer.json" end
  return M.from_json(read_json(path))
end

function M.from_json(j)
  if type(j) ~= "table" then fail("expected a tokenizer.json object") end
  local self = setmetatable({ added = {}, token_to_id = {} }, Tokenizer)
  for i, a in ipairs(j.added_tokens or {}) do
    if type(a) ~= "table" or type(a.content) ~= "string" or a.content == "" then fail("added_tokens[" .. i .. "]: expected {id, content}") end
    if a.single_word == true then fail("added token " .. a.content .. ": single_word is not supported") end
    local e = { id = check_id(a.id, "added_tokens[" .. i .. "].id") + 1, content = a.content, special = a.special == true,
                lstrip = a.lstrip == true, rstrip = a.rstrip == true }
    self.added[#self.added + 1] = e
  end
  self.normalize = pipeline.normalizer(j.normalizer)
  self.pre = pipeline.pretokenizer(j.pre_tokenizer)
  build_model(self, j.model, self.pre.byte_level)
  for _, a in ipairs(self.added) do
    self.pieces[a.id] = a.content
    self.token_to_id[a.content] = a.id
  end
  for tok, id in pairs(j.model.vocab) do self.token_to_id[tok] = self.token_to_id[tok] or id + 1 end
  self.special = {}
  for _, a in ipairs(self.added) do if a.special then self.special[a.id] = true end end
  self.post = pipeline.post_processor(j.post_processor)
  self.dec = pipeline.decoder(j.decoder)
  local pad = j.padding ~= NULL and type(j.padding) == "table" and j.padding.pad_id
  self.pad_id = pad and pad + 1 or self.token_to_id["<pad>"]
  -- added tokens, longest first, for splitting the input on them
  self.split_on = {}
  for _, a in ipairs(self.added) do self.split_on[#self.split_on + 1] = a end
  table.sort(self.split_on, function(x, y) return #x.content > #y.content end)
  return self
end

-- the next added token in text at or after i: start, stop, id (leftmost,
-- then longest); lstrip / rstrip take the (ASCII) whitespace beside it
local function next_added(self, text, i)
  local best_a, best_b, best
  for _, a in ipairs(self.split_on) do
    local s, e = text:find(a.content, i, true)
    if s and (not best_a or s < best_a) then best_a, best_b, best = s, e, a end
  end
  if not best then return nil end
  if best.lstrip then while best_a > i and text:find("^%s", best_a - 1) do best_a = best_a - 1 end end
  if best.rstrip then while text:find("^%s", best_b + 1) do best_b = best_b + 1 end end
  return best_a, best_b, best.id
end

-- the model's ids of a segment of plain text (between added tokens) into out
local buf, buf_n = nil, 0
local function encode_segment(self, seg, first, out)
  if self.normalize then seg = self.normalize(seg) end
  local text, starts, stops = pipeline.pieces(self.pre, seg, first)
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

-- encode(text, {add_special_tokens = true}) -> a Lua table of 1-based ids
function Tokenizer:encode(text, opts)
  if type(text) ~= "string" then error("Tokenizer:encode: text: expected a string, got " .. type(text), 2) end
  opts = opts or {}
  local out, i, first = {}, 1, true
  while i <= #text do
    local a, b, id = next_added(self, text, i)
    local stop = (a or #text + 1) - 1
    if stop >= i then encode_segment(self, text:sub(i, stop), first, out) end
    if not a then break end
    out[#out + 1] = id
    i, first = b + 1, false
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
  local d, parts = self.dec, {}
  for i, id in ipairs(ids) do
    local piece = self.pieces[id]
    if piece == nil then error(string.format("Tokenizer:decode: ids[%d] = %s is not a token id", i, tostring(id)), 2) end
    if not (skip and self.special[id]) then
      local hex = d.byte_fallback and piece:match("^<0x(%x%x)>$")
      if hex then piece = string.char(tonumber(hex, 16))
      elseif d.replace then piece = pipeline.plain_replace(piece, d.replace[1], d.replace[2]) end
      parts[#parts + 1] = piece
    end
  end
  local s = table.concat(parts)
  for _ = 1, d.strip_start do if s:sub(1, 1) == " " then s = s:sub(2) end end
  return s
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

function Tokenizer:id_to_token(id) return self.pieces[id] end
function Tokenizer:get_vocab_size() return self.vocab_size end

return M
