-- decoder.lua: the decoder of a tokenizer.json, HF's chain over the list of
-- token strings: ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace
-- and Sequence, each as HF tokenizers applies it (per token, then joined).
-- Bytes that are not UTF-8 become U+FFFD as HF's do.
local F = require("loom.text.fields")
local unicode = require("loom.text.unicode")
local pipeline = require("loom.text.pipeline")

local M = {}
local NULL = F.NULL

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

-- byte_level_bytes(tok): the raw bytes a byte-level token stands for, or
-- nil when it has a character outside GPT-2's map
function M.byte_level_bytes(tok)
  local map, out = byte_map(), {}
  for ch in tok:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
    local b = map[ch]
    if not b then return nil end
    out[#out + 1] = b
  end
  return table.concat(out)
end

local function strip_chars(tok, ch, left, right)
  local a, b = 1, #tok
  for _ = 1, left do if tok:sub(a, a + #ch - 1) == ch then a = a + #ch else break end end
  for _ = 1, right do if b - #ch + 1 >= a and tok:sub(b - #ch + 1, b) == ch then b = b - #ch else break end end
  return tok:sub(a, b)
end

-- each step: fn(tokens) -> tokens
local bytes_of = {}   -- token -> its bytes, or false (bounded by the vocabularies decoded)
local function byte_level(toks)
  local out = {}
  for i, t in ipairs(toks) do
    local b = bytes_of[t]
    if b == nil then b = M.byte_level_bytes(t) or false bytes_of[t] = b end
    out[i] = b or t
  end
  return { unicode.lossy(table.concat(out)) }
end

local function byte_fallback(toks)
  local out, bytes = {}, {}
  local function flush()
    if #bytes == 0 then return end
    local s = table.concat(bytes)
    if unicode.lossy(s) == s then out[#out + 1] = s
    else for _ = 1, #bytes do out[#out + 1] = "\239\191\189" end end
    bytes = {}
  end
  for _, t in ipairs(toks) do   -- <0xAB>, as HF parses it (Rust's from_str_radix: either case, or "+A")
    local hex = #t == 6 and (t:match("^<0x(%x%x)>$") or t:match("^<0x%+(%x)>$"))
    if hex then bytes[#bytes + 1] = string.char(tonumber(hex, 16))
    else flush() out[#out + 1] = t end
  end
  flush()
  return out
end

-- decoder(json) -> fn(list of token strings) -> text
function M.decoder(j)
  local steps = {}
  local function add(x, path)
    if x == nil or x == NULL then return end
    F.object(x, path)
    local t = F.need(x, "type", "string", path)
    if t == "Sequence" then
      for i, y in ipairs(F.need(x, "decoders", "array", path)) do add(y, path .. ".decoders[" .. i .. "]") end
    elseif t == "ByteLevel" then steps[#steps + 1] = byte_level
    elseif t == "Fuse" then steps[#steps + 1] = function(toks) return { table.concat(toks) } end
    elseif t == "ByteFallback" then steps[#steps + 1] = byte_fallback
    elseif t == "Replace" then
      local m, lit = pipeline.pattern(x.pattern, path .. ".pattern")
      local to = F.need(x, "content", "string", path)
      steps[#steps + 1] = function(toks)
        local out = {}
        for i, tok in ipairs(toks) do out[i] = lit and pipeline.plain_replace(tok, lit, to) or pipeline.replace(m, tok, to) end
        return out
      end
    elseif t == "Strip" then
      local ch = F.need(x, "content", "string", path)
      local left, right = F.get(x, "start", "integer", path, 0), F.get(x, "stop", "integer", path, 0)
      steps[#steps + 1] = function(toks)
        local out = {}
        for i, tok in ipairs(toks) do out[i] = strip_chars(tok, ch, left, right) end
        return out
      end
    elseif t == "Metaspace" then
      local rep = F.get(x, "replacement", "string", path, "▁")
      local add_prefix = F.get(x, "add_prefix_space", "boolean", path, true)
      local scheme = F.get(x, "prepend_scheme", "string", path, add_prefix and "always" or "never")
      steps[#steps + 1] = function(toks)   -- every ▁ of the first token goes, as in HF
        local out = {}
        for i, tok in ipairs(toks) do out[i] = pipeline.plain_replace(tok, rep, (i == 1 and scheme ~= "never") and "" or " ") end
        return out
      end
    else
      error(string.format("Tokenizer: %s: the decoder %s is not supported", path, t), 0)
    end
  end
  add(j, "decoder")
  if #steps == 0 then   -- no decoder: HF joins the tokens with spaces
    return function(toks) return table.concat(toks, " ") end
  end
  return function(toks)
    for _, f in ipairs(steps) do toks = f(toks) end
    return table.concat(toks)
  end
end

return M
