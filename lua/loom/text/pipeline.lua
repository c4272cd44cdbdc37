-- pipeline.lua: the stages of a Hugging Face tokenizer.json around the BPE
-- model, each built from its JSON object: the normalizer (text -> text),
-- the pre-tokenizer (text -> pieces), the post-processor (ids -> ids with
-- the template's special tokens) and the decoder (token strings -> text).
-- A stage loom does not implement is a Lua error naming its type.
local regex = require("loom.text.regex")

local M = {}
local NULL = require("cjson").null

local function unsupported(what, obj)
  local name = type(obj) == "table" and (obj.type or "without a type") or tostring(obj)
  error(string.format("Tokenizer: %s %s is not supported", what, tostring(name)), 0)
end

local function plain_replace(s, from, to)
  if from == "" then return s end
  local out, i = {}, 1
  while true do
    local a, b = s:find(from, i, true)
    if not a then break end
    out[#out + 1] = s:sub(i, a - 1)
    out[#out + 1] = to
    i = b + 1
  end
  if i == 1 then return s end
  out[#out + 1] = s:sub(i)
  return table.concat(out)
end
M.plain_replace = plain_replace

local function string_pattern(p, what)
  if type(p) ~= "table" or type(p.String) ~= "string" then unsupported(what .. " with a pattern other than a String", p) end
  return p.String
end

-- normalizer(json) -> fn(text) -> text, or nil
function M.normalizer(j)
  if j == nil or j == NULL then return nil end
  if j.type == "Sequence" then
    local fns = {}
    for _, n in ipairs(j.normalizers or {}) do fns[#fns + 1] = M.normalizer(n) end
    return function(s) for _, f in ipairs(fns) do s = f(s) end return s end
  elseif j.type == "Prepend" then
    local p = j.prepend
    return function(s) return s ~= "" and p .. s or s end
  elseif j.type == "Replace" then
    local from, to = string_pattern(j.pattern, "Replace"), j.content
    return function(s) return plain_replace(s, from, to) end
  end
  unsupported("the normalizer", j)
end

M.GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

-- A pre-tokenizer is a list of steps; each step either rewrites the
-- segment's text (prefix space, Metaspace's ▁) or splits pieces further.
-- pretokenizer(json) -> {steps, byte_level}
function M.pretokenizer(j)
  local pt = { steps = {}, byte_level = false }
  local function add(s)
    if s == nil or s == NULL then return end
    if s.type == "Sequence" then
      for _, x in ipairs(s.pretokenizers or {}) do add(x) end
    elseif s.type == "ByteLevel" then
      pt.byte_level = true
      if s.add_prefix_space then
        if #pt.steps > 0 then unsupported("a ByteLevel pre-tokenizer with add_prefix_space after another one:", s) end
        pt.steps[#pt.steps + 1] = { prefix = " ", when = "always" }
      end
      if s.use_regex ~= false then pt.steps[#pt.steps + 1] = { split = regex.compile(M.GPT2_REGEX) } end
    elseif s.type == "Split" then
      if s.behavior ~= "Isolated" or s.invert then unsupported("a Split pre-tokenizer with behavior", s.behavior) end
      local p = s.pattern
      if type(p) == "table" and type(p.Regex) == "string" then
        pt.steps[#pt.steps + 1] = { split = regex.compile(p.Regex) }
      else
        local lit = string_pattern(p, "Split")   -- a literal: escaped for PCRE2
        pt.steps[#pt.steps + 1] = { split = regex.compile("\\Q" .. lit .. "\\E") }
      end
    elseif s.type == "Metaspace" then
      if #pt.steps > 0 then unsupported("a Metaspace pre-tokenizer after another one:", s) end
      local rep = s.replacement or "▁"
      local scheme = s.prepend_scheme or (s.add_prefix_space == false and "never" or "always")
      pt.steps[#pt.steps + 1] = { replace = rep }
      if scheme ~= "never" then pt.steps[#pt.steps + 1] = { prefix = rep, when = scheme } end
      if s.split ~= false then pt.steps[#pt.steps + 1] = { merged_with_next = rep } end
    else
      unsupported("the pre-tokenizer", s)
    end
  end
  add(j)
  return pt
end

-- pieces(pt, text, first) -> text', starts, stops (0-based, stop exclusive)
-- first: the segment starts the input (Metaspace's "first" scheme)
function M.pieces(pt, text, first)
  local starts, stops = { 0 }, { #text }
  for _, st in ipairs(pt.steps) do
    if st.replace then
      text = plain_replace(text, " ", st.replace)
      starts, stops = { 0 }, { #text }
    elseif st.prefix then
      if (st.when == "always" or first) and text:sub(1, #st.prefix) ~= st.prefix then text = st.prefix .. text end
      starts, stops = { 0 }, { #text }
    else
      local ns, ne = {}, {}
      local function emit(a, b) ns[#ns + 1], ne[#ne + 1] = a, b end
      for i = 1, #starts do
        if st.split then
          st.split:split(text, starts[i], stops[i], emit)
        else   -- split before each delimiter (the delimiter starts the next piece)
          local d, cur, pos = st.merged_with_next, starts[i], starts[i]
          while true do
            local f = text:find(d, pos + 1, true)
            if not f or f - 1 >= stops[i] then break end
            if f - 1 > cur then emit(cur, f - 1) cur = f - 1 end
            pos = f - 1 + #d
          end
          if stops[i] > cur then emit(cur, stops[i]) end
        end
      end
      starts, stops = ns, ne
    end
  end
  return text, starts, stops
end

-- post(json, token_id) -> fn(ids, add_special) -> ids (the single template)
-- token_id(name) gives the 1-based id of a special token
function M.post_processor(j, special_ids)
  if j == nil or j == NULL then return nil end
  if j.type == "Sequence" then
    local fns = {}
    for _, p in ipairs(j.processors or {}) do fns[#fns + 1] = M.post_processor(p, special_ids) end
    return function(ids) for _, f in ipairs(fns) do ids = f(ids) end return ids end
  elseif j.type == "ByteLevel" then
    return nil
  elseif j.type == "TemplateProcessing" then
    local before, after, seen = {}, {}, false
    for _, item in ipairs(j.single or {}) do
      if item.Sequence then seen = true
      elseif item.SpecialToken then
        local spec = (j.special_tokens or {})[item.SpecialToken.id]
        if type(spec) ~= "table" or type(spec.ids) ~= "table" then
          error("Tokenizer: the template's special token " .. tostring(item.SpecialToken.id) .. " has no ids", 0)
        end
        for _, id in ipairs(spec.ids) do table.insert(seen and after or before, id + 1) end
      end
    end
    return function(ids)
      if #before == 0 and #after == 0 then return ids end
      local out = {}
      for _, id in ipairs(before) do out[#out + 1] = id end
      for _, id in ipairs(ids) do out[#out + 1] = id end
      for _, id in ipairs(after) do out[#out + 1] = id end
      return out
    end
  end
  unsupported("the post-processor", j)
end

-- decoder(json) -> {replace = {from, to}, byte_fallback, strip_start = n}
-- (the SentencePiece chain; ByteLevel needs nothing: tokens hold raw bytes)
function M.decoder(j)
  local d = { strip_start = 0 }
  local function add(x)
    if x == nil or x == NULL then return end
    if x.type == "Sequence" then for _, y in ipairs(x.decoders or {}) do add(y) end
    elseif x.type == "ByteLevel" or x.type == "Fuse" then -- luacheck: ignore 542 (nothing to do)
    elseif x.type == "ByteFallback" then d.byte_fallback = true
    elseif x.type == "Replace" then d.replace = { string_pattern(x.pattern, "Replace"), x.content }
    elseif x.type == "Strip" then
      if x.content ~= " " or (x.stop or 0) ~= 0 then unsupported("a Strip decoder other than leading spaces:", x) end
      d.strip_start = x.start or 0
    elseif x.type == "Metaspace" then
      d.replace = { x.replacement or "▁", " " }
      local scheme = x.prepend_scheme or (x.add_prefix_space == false and "never" or "always")
      if scheme ~= "never" then d.strip_start = 1 end
    else unsupported("the decoder", x) end
  end
  add(j)
  return d
end

return M
