-- pipeline.lua: the stages of a Hugging Face tokenizer.json around the BPE
-- model, each built from its JSON object: the normalizer (text -> text),
-- the pre-tokenizer (text -> pieces) and the post-processor (ids -> ids
-- with the template's special tokens); loom.text.decoder has the decoder.
-- A stage loom does not implement is a Lua error naming its type; a field
-- of the wrong JSON type one naming the field.
local regex = require("loom.text.regex")
local unicode = require("loom.text.unicode")
local F = require("loom.text.fields")

local M = {}
local NULL = F.NULL

local function unsupported(what, obj, path)
  local name = type(obj) == "table" and (obj.type or "without a type") or tostring(obj)
  error(string.format("Tokenizer: %s: %s %s is not supported", path, what, tostring(name)), 0)
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

-- pattern(j, path) -> a matcher (loom.text.regex) of {"String": s} or {"Regex": r}
function M.pattern(j, path)
  F.object(j, path)
  local s, r = F.get(j, "String", "string", path), F.get(j, "Regex", "string", path)
  if s and not r then return regex.literal(s), s end
  if r and not s then return regex.from_onig(r), nil end
  F.fail(path, "{\"String\": ...} or {\"Regex\": ...}", j)
end

-- replace(matcher, s, content): each match of s replaced by content
local function replace(m, s, content, newer)
  local out = {}
  m:matches(s, 0, #s, function(a, b, is_match) out[#out + 1] = is_match and content or s:sub(a + 1, b) end, newer)
  return table.concat(out)
end
M.replace = replace

-- normalizer(json, path) -> fn(text, newer) -> text, or nil (newer: the
-- text holds code points newer than PCRE2's Unicode tables, see loom.text.regex)
function M.normalizer(j, path)
  path = path or "normalizer"
  if j == nil or j == NULL then return nil end
  F.object(j, path)
  local t = F.need(j, "type", "string", path)
  if t == "Sequence" then
    local fns = {}
    for i, n in ipairs(F.array(F.need(j, "normalizers", "array", path), path .. ".normalizers")) do
      fns[#fns + 1] = M.normalizer(n, path .. ".normalizers[" .. i .. "]")
    end
    return function(s, newer) for _, f in ipairs(fns) do s = f(s, newer) end return s end
  elseif t == "NFC" or t == "NFD" or t == "NFKC" or t == "NFKD" then
    return function(s) return unicode.normalize(s, t) end
  elseif t == "Prepend" then
    local p = F.need(j, "prepend", "string", path)
    return function(s) return s ~= "" and p .. s or s end
  elseif t == "Replace" then
    local m, lit = M.pattern(j.pattern, path .. ".pattern")
    local to = F.need(j, "content", "string", path)
    if lit then return function(s) return plain_replace(s, lit, to) end end
    return function(s, newer) return replace(m, s, to, newer) end
  elseif t == "Strip" then
    local left, right = F.get(j, "strip_left", "boolean", path, false), F.get(j, "strip_right", "boolean", path, false)
    return function(s)
      local a, b = 1, #s
      if left then a = unicode.space_after(s, 1) end
      if right then b = unicode.space_before(s, #s, a) - 1 end
      return s:sub(a, b)
    end
  end
  unsupported("the normalizer", j, path)
end

M.GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

local BEHAVIORS = { Removed = true, Isolated = true, MergedWithPrevious = true, MergedWithNext = true, Contiguous = true }

-- A pre-tokenizer is a list of steps; each step either rewrites the
-- segment's text (a prefix space, Metaspace's ▁) or splits pieces further
-- (a matcher and HF's behavior). pretokenizer(json) -> {steps, byte_level}
function M.pretokenizer(j)
  local pt = { steps = {}, byte_level = false }
  local function add(s, path)
    if s == nil or s == NULL then return end
    F.object(s, path)
    local t = F.need(s, "type", "string", path)
    if t == "Sequence" then
      for i, x in ipairs(F.need(s, "pretokenizers", "array", path)) do add(x, path .. ".pretokenizers[" .. i .. "]") end
    elseif t == "ByteLevel" then
      pt.byte_level = true
      if F.need(s, "add_prefix_space", "boolean", path) then   -- required, as HF reads it
        if #pt.steps > 0 then unsupported("a ByteLevel pre-tokenizer with add_prefix_space after another one:", s, path) end
        pt.steps[#pt.steps + 1] = { prefix = " " }
      end
      if F.get(s, "use_regex", "boolean", path, true) then
        pt.steps[#pt.steps + 1] = { split = regex.from_onig(M.GPT2_REGEX), behavior = "Isolated" }
      end
    elseif t == "Split" then
      local behavior = F.need(s, "behavior", "string", path)
      if not BEHAVIORS[behavior] then unsupported("a Split pre-tokenizer with behavior", behavior, path .. ".behavior") end
      pt.steps[#pt.steps + 1] = { split = M.pattern(s.pattern, path .. ".pattern"), behavior = behavior,
                                  invert = F.get(s, "invert", "boolean", path, false) }
    elseif t == "Metaspace" then
      if #pt.steps > 0 then unsupported("a Metaspace pre-tokenizer after another one:", s, path) end
      local rep = F.get(s, "replacement", "string", path, "▁")
      local add_prefix = F.get(s, "add_prefix_space", "boolean", path, true)
      local scheme = F.get(s, "prepend_scheme", "string", path, add_prefix and "always" or "never")
      if scheme ~= "always" and scheme ~= "first" and scheme ~= "never" then
        F.fail(path .. ".prepend_scheme", "always, first or never", scheme)
      end
      pt.steps[#pt.steps + 1] = { replace = rep, prefix = scheme ~= "never" and rep or nil, first_only = scheme == "first" }
      if F.get(s, "split", "boolean", path, true) then
        pt.steps[#pt.steps + 1] = { split = regex.literal(rep), behavior = "MergedWithNext" }
      end
    else
      unsupported("the pre-tokenizer", s, path)
    end
  end
  add(j, "pre_tokenizer")
  return pt
end

-- HF's SplitDelimiterBehavior over a covering list of (start, stop, is_match)
local function fold(list, behavior)
  local out, prev_match = {}, false
  local n = #list
  if behavior == "MergedWithNext" then
    for i = n, 1, -1 do
      local x = list[i]
      if x[3] and not prev_match and #out > 0 then out[#out][1] = x[1] else out[#out + 1] = { x[1], x[2] } end
      prev_match = x[3]
    end
    for i = 1, math.floor(#out / 2) do out[i], out[#out + 1 - i] = out[#out + 1 - i], out[i] end
    return out
  end
  for i = 1, n do
    local x = list[i]
    if behavior == "Removed" then
      if not x[3] then out[#out + 1] = { x[1], x[2] } end
    elseif behavior == "MergedWithPrevious" and x[3] and not prev_match and #out > 0 then out[#out][2] = x[2]
    elseif behavior == "Contiguous" and x[3] == prev_match and #out > 0 then out[#out][2] = x[2]
    else out[#out + 1] = { x[1], x[2] } end
    prev_match = x[3]
  end
  return out
end

local function split_piece(st, text, a, b, emit, newer)
  local list = {}
  st.split:matches(text, a, b, function(x, y, m)
    if st.invert then m = not m end
    list[#list + 1] = { x, y, m }
  end, newer)
  for _, p in ipairs(fold(list, st.behavior)) do
    if p[2] > p[1] then emit(p[1], p[2]) end
  end
end

-- pieces(pt, text, first, newer) -> text', starts, stops (0-based, stop
-- exclusive). first: the segment starts the input (Metaspace's "first"
-- scheme); newer: it holds code points newer than PCRE2's Unicode tables
function M.pieces(pt, text, first, newer)
  if text == "" then return text, {}, {} end   -- (HF prepends nothing to an empty piece)
  local starts, stops = { 0 }, { #text }
  for _, st in ipairs(pt.steps) do
    if not st.split then
      if st.replace then text = plain_replace(text, " ", st.replace) end
      if st.prefix and (first or not st.first_only) and text:sub(1, #st.prefix) ~= st.prefix then text = st.prefix .. text end
      starts, stops = { 0 }, { #text }
    elseif st.behavior == "Isolated" then   -- the common case: every match and gap, at once
      local ns, ne = {}, {}
      for i = 1, #starts do st.split:isolated(text, starts[i], stops[i], ns, ne, newer) end
      starts, stops = ns, ne
    else
      local ns, ne = {}, {}
      local function emit(a, b) ns[#ns + 1], ne[#ne + 1] = a, b end
      for i = 1, #starts do split_piece(st, text, starts[i], stops[i], emit, newer) end
      starts, stops = ns, ne
    end
  end
  return text, starts, stops
end

-- post_processor(json, check_id) -> fn(ids) -> ids (the single template), or nil
-- check_id(id, path) checks a 0-based id of the file and returns it
function M.post_processor(j, check_id, path)
  path = path or "post_processor"
  if j == nil or j == NULL then return nil end
  F.object(j, path)
  local t = F.need(j, "type", "string", path)
  if t == "Sequence" then
    local fns = {}
    for i, p in ipairs(F.need(j, "processors", "array", path)) do
      fns[#fns + 1] = M.post_processor(p, check_id, path .. ".processors[" .. i .. "]")
    end
    return function(ids) for _, f in ipairs(fns) do ids = f(ids) end return ids end
  elseif t == "ByteLevel" then
    return nil
  elseif t == "TemplateProcessing" then
    local before, after, seen = {}, {}, false
    local specials = F.get(j, "special_tokens", "object", path, {})
    for i, item in ipairs(F.need(j, "single", "array", path)) do
      local ip = path .. ".single[" .. i .. "]"
      F.object(item, ip)
      if item.Sequence ~= nil then
        if seen then F.fail(ip, "one Sequence in the template", item) end
        seen = true
      elseif item.SpecialToken ~= nil then
        local name = F.need(F.object(item.SpecialToken, ip .. ".SpecialToken"), "id", "string", ip .. ".SpecialToken")
        local spec = specials[name]
        local sp = path .. ".special_tokens[" .. string.format("%q", name) .. "]"
        if spec == nil then error("Tokenizer: " .. ip .. ": the template's special token " .. name .. " is not in special_tokens", 0) end
        F.object(spec, sp)
        for k, id in ipairs(F.need(spec, "ids", "array", sp)) do
          table.insert(seen and after or before, check_id(id, sp .. ".ids[" .. k .. "]") + 1)
        end
      else
        F.fail(ip, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", item)
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
  unsupported("the post-processor", j, path)
end

return M
