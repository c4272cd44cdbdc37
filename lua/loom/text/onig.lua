-- onig.lua: reads a regex of a tokenizer.json, written for Oniguruma (what
-- HF tokenizers runs, Ruby syntax), and returns the PCRE2 pattern that
-- matches the same text, or refuses it naming the construct. Only what both
-- engines read the same way (checked against HF tokenizers 0.23) passes:
--   literals, escaped punctuation, \t \n \r \f, \xHH (ASCII), \x{H..},
--   \uHHHH, \d \D (Nd), \s \S (White_Space; PCRE2's own \s differs),
--   \p{..} \P{..} of general categories (with the code points assigned after
--   PCRE2's Unicode 14.0 as Oniguruma classes them, for texts that hold one:
--   loom.text.unicode_newer), classes [..] [^..] with ranges,
--   groups ( ) (?: ) (?i: ) (?i) (?= ) (?! ) (?<= ) (?<! ) (?> ),
--   quantifiers ? * + {n} {n,} {n,m}, lazy and possessive, |, . ^ $ \A \z \Z.
-- Refused: \w \b \h \v \R \X \K \G, back-references, named groups, other
-- inline options, scripts and Cn in \p{}, nested classes and && (Oniguruma's set
-- operations), {,n} and {n}? / {n,m}+ (read otherwise by Ruby syntax), and
-- under (?i) anything but ASCII literals without a multi-character case fold
-- (Oniguruma's (?i:ss) matches "ß", PCRE2's does not).
local M = {}

local CATEGORIES = {}
for c in ("L Lu Ll Lt Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Co Cn Cs")
    :gmatch("%S+") do CATEGORIES[c] = true end

-- Oniguruma's \s is White_Space: tab to CR, U+0085 and the separators Z.
-- PCRE2's own \s (UCP) is that and U+180E (checked over every code point):
-- the fast pattern keeps \s, the exact one (for a text holding U+180E)
-- spells White_Space out (it has not changed since Unicode 6.3)
local SPACE_IN_CLASS = "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

-- pairs that Unicode case folding makes of one character (ß -> ss, ﬁ -> fi, ...)
local MULTI_FOLDS = { "ss", "ff", "fi", "fl", "st" }

-- the categories of the code points assigned after Unicode 14.0 (PCRE2
-- 10.42's version) as HF's Oniguruma (Unicode 16.0) has them
local NEWER = require("loom.text.unicode_newer").categories

-- the ranges of those code points in category name (L: Lu, Ll, Lt, Lm, Lo; Lu: itself)
local function newer_ranges(name)
  local out = {}
  for cat, list in pairs(NEWER) do
    if cat == name or cat:sub(1, 1) == name then
      for _, r in ipairs(list) do out[#out + 1] = string.format("\\x{%X}-\\x{%X}", r[1], r[2]) end
    end
  end
  table.sort(out)
  return table.concat(out)
end

local function refuse(pattern, pos, what)
  error(string.format("Tokenizer: the regex %q: %s at offset %d is read differently by HF's Oniguruma and PCRE2 "
                      .. "(or not at all); loom refuses the tokenizer rather than give other ids", pattern, what, pos - 1), 0)
end

-- one escape at pattern[i] == "\\": returns the PCRE2 text, the next index
-- and what it is ("class" for a set, "char" for one character). newer: the
-- property classes take the code points Unicode assigned after 14.0 too.
local function escape(p, i, in_class, caseless, newer)
  local c = p:sub(i + 1, i + 1)
  if c == "" then refuse(p, i, "a trailing backslash") end
  if caseless and not c:match("[%p ]") then refuse(p, i, "\\" .. c .. " under (?i)") end
  if c == "t" or c == "n" or c == "r" or c == "f" then return "\\" .. c, i + 2, "char" end
  local name, len
  if c == "d" or c == "D" then name, len = "Nd", 2
  elseif c == "p" or c == "P" then
    name = p:match("^{([^}]*)}", i + 2)
    if not name then refuse(p, i, "\\" .. c .. " without {name}") end
    if not CATEGORIES[name] then refuse(p, i, "\\" .. c .. "{" .. name .. "} (only general categories are read)") end
    if name == "C" or name == "Cn" then refuse(p, i, "\\" .. c .. "{" .. name .. "} (unassigned code points: the engines' Unicode versions differ)") end
    len = #name + 4
  end
  if name then   -- a general category, and the code points newer than PCRE2's tables that Oniguruma puts in it
    local extra = newer and newer_ranges(name) or ""
    local positive = c == "d" or c == "p"
    if in_class and not positive then refuse(p, i, "\\" .. c .. (c == "P" and "{" .. name .. "}" or "") .. " inside a class") end
    if extra == "" then return "\\" .. (c == "d" and "p" or c == "D" and "P" or c) .. "{" .. name .. "}", i + len, "class" end
    if in_class then return "\\p{" .. name .. "}" .. extra, i + len, "class" end
    return (positive and "[" or "[^") .. "\\p{" .. name .. "}" .. extra .. "]", i + len, "class"
  end
  if c == "s" then
    if not newer then return "\\s", i + 2, "class" end
    return in_class and SPACE_IN_CLASS or "[" .. SPACE_IN_CLASS .. "]", i + 2, "class"
  end
  if c == "S" then
    if in_class then refuse(p, i, "\\S inside a class") end
    return newer and "[^" .. SPACE_IN_CLASS .. "]" or "\\S", i + 2, "class"
  end
  if c == "x" then
    local hex = p:match("^{(%x+)}", i + 2)
    if hex then return "\\x{" .. hex .. "}", i + 4 + #hex, "char" end
    hex = p:match("^%x%x", i + 2)
    if hex and tonumber(hex, 16) < 0x80 then return "\\x{" .. hex .. "}", i + 4, "char" end
    refuse(p, i, "\\x other than \\x{H..} or an ASCII \\xHH")
  end
  if c == "u" then
    local hex = p:match("^%x%x%x%x", i + 2)
    if not hex then refuse(p, i, "\\u without four hex digits") end
    return "\\x{" .. hex .. "}", i + 6, "char"
  end
  if c == "A" or c == "z" or c == "Z" then
    if in_class then refuse(p, i, "\\" .. c .. " inside a class") end
    return "\\" .. c, i + 2, "anchor"
  end
  if c:match("[%w]") then refuse(p, i, "\\" .. c) end
  -- punctuation, space, control or a non-ASCII character: itself (its first byte here; the rest follows as literals)
  return "\\" .. c, i + 2, "char"
end

-- a class [...] at pattern[i] == "[": returns the PCRE2 text and the next index
local function class(p, i, caseless, newer)
  if caseless then refuse(p, i, "a class under (?i)") end
  local out, j = { "[" }, i + 1
  if p:sub(j, j) == "^" then out[2] = "^" j = j + 1 end
  if p:sub(j, j) == "]" then refuse(p, j, "a ] first in a class") end
  while true do
    local c = p:sub(j, j)
    if c == "" then refuse(p, i, "a class without its ]") end
    if c == "]" then out[#out + 1] = "]" return table.concat(out), j + 1 end
    if c == "[" then refuse(p, j, "[ inside a class (a nested set)") end
    if c == "&" and p:sub(j + 1, j + 1) == "&" then refuse(p, j, "&& inside a class (an intersection)") end
    if c == "\\" then
      local s, nj = escape(p, j, true, false, newer)
      out[#out + 1] = s
      j = nj
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
end

-- translate(pattern, exact) -> the PCRE2 pattern (compiled with UTF, UCP
-- and MULTILINE: Ruby's ^ and $ are line anchors), or a Lua error naming
-- the construct loom cannot read as HF does. exact: the \p{..} classes hold
-- the code points assigned after Unicode 14.0 as Oniguruma classes them,
-- and \s is White_Space spelled out (a slower pattern, for the texts that
-- hold such a character or U+180E; the fast one is the same on the others)
function M.translate(p, newer)
  local out, i, n = { "(*LF)" }, 1, #p
  local groups = {}        -- one entry per open group: was the scope caseless before it
  local caseless = false
  local last = nil         -- what the last item was, for the quantifiers' checks
  while i <= n do
    local c = p:sub(i, i)
    if c == "\\" then
      local s, ni, kind = escape(p, i, false, caseless, newer)
      out[#out + 1] = s
      i, last = ni, kind
    elseif c == "[" then
      local s, ni = class(p, i, caseless, newer)
      out[#out + 1] = s
      i, last = ni, "class"
    elseif c == "(" then
      local head = p:match("^%(%?[^)]?[=!:>]?", i)
      local rest = p:sub(i, i + 3)
      groups[#groups + 1] = caseless
      if rest:sub(2, 2) ~= "?" then out[#out + 1] = "(" i = i + 1
      elseif rest:sub(1, 3) == "(?:" or rest:sub(1, 3) == "(?=" or rest:sub(1, 3) == "(?!" or rest:sub(1, 3) == "(?>" then
        out[#out + 1] = rest:sub(1, 3) i = i + 3
      elseif rest == "(?<=" or rest == "(?<!" then out[#out + 1] = rest i = i + 4
      elseif rest == "(?i:" then out[#out + 1] = rest i = i + 4 caseless = true
      elseif rest == "(?i)" then   -- to the end of the enclosing group, in both
        groups[#groups] = nil
        out[#out + 1] = rest i = i + 4 caseless = true
      else
        refuse(p, i, "the group " .. (head or rest) .. " (only (?: (?i: (?i) (?= (?! (?<= (?<! (?> are read)")
      end
      last = "open"
    elseif c == ")" then
      if #groups == 0 then refuse(p, i, "an unmatched )") end
      caseless = table.remove(groups)
      out[#out + 1] = ")"
      i, last = i + 1, "group"
    elseif c == "|" then
      out[#out + 1] = "|"
      i, last = i + 1, "open"
    elseif c == "*" or c == "+" or c == "?" or c == "{" then
      local q, ni = c, i + 1
      if c == "{" then
        local body = p:match("^{(%d*,?%d*)}", i)
        if not body or body == "" or body == "," then refuse(p, i, "a { that is not a quantifier (escape it)") end
        if body:sub(1, 1) == "," then refuse(p, i, "{,n} (Oniguruma: {0,n}; PCRE2: text)") end
        q, ni = "{" .. body .. "}", i + #body + 2
        local nxt = p:sub(ni, ni)
        if nxt == "+" then refuse(p, i, "{..}+ (Ruby syntax: a repeat of the repeat; PCRE2: possessive)") end
        if nxt == "?" and not body:find(",") then refuse(p, i, "{n}? (Ruby syntax: optional; PCRE2: exactly n)") end
      end
      if last == nil or last == "open" or last == "quant" or last == "anchor" then refuse(p, i, "a quantifier with nothing to repeat") end
      local mod = p:sub(ni, ni)
      if mod == "?" or mod == "+" then q, ni = q .. mod, ni + 1 end
      if p:sub(ni, ni):match("[%*%+%?{]") then refuse(p, ni, "a quantifier after a quantifier") end
      out[#out + 1] = q
      i, last = ni, "quant"
    elseif c == "]" or c == "}" then
      refuse(p, i, "an unescaped " .. c)
    elseif c == "^" or c == "$" then
      out[#out + 1] = c
      i, last = i + 1, "anchor"
    else
      if caseless and c:byte() >= 0x80 then refuse(p, i, "a non-ASCII character under (?i)") end
      if caseless and c:match("%a") then
        local pair = p:sub(i, i + 1):lower()
        for _, f in ipairs(MULTI_FOLDS) do
          if pair == f then refuse(p, i, "\"" .. p:sub(i, i + 1) .. "\" under (?i) (a character folds to it in Oniguruma only)") end
        end
      end
      out[#out + 1] = c
      i, last = i + 1, "char"
    end
  end
  if #groups > 0 then refuse(p, n + 1, "an unclosed (") end
  return table.concat(out)
end

return M
