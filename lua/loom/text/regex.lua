-- regex.lua: Unicode regular expressions through PCRE2 (Debian's
-- libpcre2-8-0, called through the FFI under loom's own names), for the
-- tokenizers' patterns (GPT-2's, Llama 3's, Qwen2's: \p{L}, \p{N}, \p{M},
-- lookahead, (?i:...)). Patterns compile with UTF and UCP and are
-- JIT-compiled when PCRE2 can. A tokenizer.json's patterns are Oniguruma's
-- (HF tokenizers runs Oniguruma): from_onig reads them through
-- loom.text.onig, which refuses what the two engines read differently.
local ffi = require("ffi")
local onig = require("loom.text.onig")

ffi.cdef [[
typedef struct pcre2_real_code_8 loom_pcre2_code;
typedef struct pcre2_real_match_data_8 loom_pcre2_match_data;
loom_pcre2_code *loom_pcre2_compile(const uint8_t *, size_t, uint32_t, int *, size_t *, void *) asm("pcre2_compile_8");
void loom_pcre2_code_free(loom_pcre2_code *) asm("pcre2_code_free_8");
int loom_pcre2_jit_compile(loom_pcre2_code *, uint32_t) asm("pcre2_jit_compile_8");
loom_pcre2_match_data *loom_pcre2_match_data_create_from_pattern(const loom_pcre2_code *, void *)
  asm("pcre2_match_data_create_from_pattern_8");
void loom_pcre2_match_data_free(loom_pcre2_match_data *) asm("pcre2_match_data_free_8");
int loom_pcre2_match(const loom_pcre2_code *, const char *, size_t, size_t, uint32_t, loom_pcre2_match_data *, void *)
  asm("pcre2_match_8");
size_t *loom_pcre2_get_ovector_pointer(loom_pcre2_match_data *) asm("pcre2_get_ovector_pointer_8");
int loom_pcre2_get_error_message(int, uint8_t *, size_t) asm("pcre2_get_error_message_8");
size_t loom_pcre2_get_startchar(loom_pcre2_match_data *) asm("pcre2_get_startchar_8");
]]

local UTF, UCP, MULTILINE, JIT_COMPLETE, NO_UTF_CHECK, NOMATCH = 0x00080000, 0x00020000, 0x00000400, 1, 0x40000000, -1
-- PCRE2's errors for invalid UTF-8 run from -3 to -24; the resource limits
local UTF_ERRORS_FROM, UTF_ERRORS_TO = -24, -3
local LIMITS = { [-47] = true, [-52] = true, [-53] = true, [-63] = true }   -- match, depth (recursion), heap

local lib
local function pcre2()
  if lib then return lib end
  for _, name in ipairs { "pcre2-8", "libpcre2-8.so.0" } do
    local ok, l = pcall(ffi.load, name)
    if ok then lib = l return l end
  end
  error("loom.text.regex: libpcre2-8 is not installed (apt-get install libpcre2-8-0)", 3)
end

local function message(code)
  local buf = ffi.new("uint8_t[256]")
  pcre2().loom_pcre2_get_error_message(code, buf, 256)
  return ffi.string(buf)
end

local Regex = {}
Regex.__index = Regex

-- compile(pattern, shown) -> a regex (a PCRE2 pattern; shown: the pattern
-- as its file wrote it, for messages); a Lua error naming it when it is bad
local function compile(pattern, shown)
  if type(pattern) ~= "string" then error("regex: pattern: expected a string, got " .. type(pattern), 2) end
  shown = shown or pattern
  local L = pcre2()
  local err, off = ffi.new("int[1]"), ffi.new("size_t[1]")
  local code = L.loom_pcre2_compile(ffi.cast("const uint8_t *", pattern), #pattern, UTF + UCP + MULTILINE, err, off, nil)
  if code == nil then
    error(string.format("Tokenizer: the regex %q does not compile: %s", shown, message(err[0])), 0)
  end
  -- the finalizers hold L: a library whose namespace is collected (busted
  -- unloads modules between files) is closed, and a pointer into it would
  -- dangle
  code = ffi.gc(code, function(c) L.loom_pcre2_code_free(c) end)
  L.loom_pcre2_jit_compile(code, JIT_COMPLETE)   -- the interpreter when the JIT is not there
  local md = ffi.gc(L.loom_pcre2_match_data_create_from_pattern(code, nil), function(m) L.loom_pcre2_match_data_free(m) end)
  return setmetatable({ code = code, md = md, ov = L.loom_pcre2_get_ovector_pointer(md), pattern = shown }, Regex)
end

-- from_onig(pattern) -> a regex matching what Oniguruma's would
-- (and, when its classes change for them, the regex for texts holding code
-- points newer than PCRE2's Unicode tables: r.newer)
local function from_onig(pattern)
  if type(pattern) ~= "string" then error("regex: pattern: expected a string, got " .. type(pattern), 2) end
  local plain, newer = onig.translate(pattern, false), onig.translate(pattern, true)
  local r = compile(plain, pattern)
  if newer ~= plain then r.newer = compile(newer, pattern) end
  return r
end

local function char_len(s, i)   -- the length of the UTF-8 character at 0-based i
  local c = s:byte(i + 1)
  return c < 0x80 and 1 or c >= 0xF0 and 4 or c >= 0xE0 and 3 or c >= 0xC0 and 2 or 1
end

function Regex:fail(rc, s, from, to, pos)
  if rc >= UTF_ERRORS_FROM and rc <= UTF_ERRORS_TO then
    error(string.format("Tokenizer: the text is not valid UTF-8 (byte %d of %d: %s)",
                        tonumber(lib.loom_pcre2_get_startchar(self.md)) + 1, #s, message(rc)), 0)
  end
  local what = LIMITS[rc] and "reached PCRE2's limit" or "failed"
  error(string.format("Tokenizer: the regex %q %s on a piece of %d bytes (at its byte %d): %s",
                      self.pattern, what, to - from, pos - from + 1, message(rc)), 0)
end

-- matches(s, from, to, fn): calls fn(start, stop, is_match) (0-based, stop
-- exclusive) for each match of s[from, to) and each gap between matches, in
-- order, covering it: HF's find_matches, with Oniguruma's iteration (an
-- empty match right after the previous match is skipped by one character;
-- empty matches are passed on). The first search checks that s is valid UTF-8.
function Regex:matches(s, from, to, fn, newer)
  if newer and self.newer then return self.newer:matches(s, from, to, fn) end
  local L, ov = lib, self.ov   -- s itself is passed: a pointer cast from it would not keep it alive
  local pos, flags, prev, last_end = from, 0, from, -1
  while pos <= to do
    local rc = L.loom_pcre2_match(self.code, s, to, pos, flags, self.md, nil)
    if rc == NOMATCH then break end
    if rc < 0 then self:fail(rc, s, from, to, pos) end
    flags = NO_UTF_CHECK
    local a, b = tonumber(ov[0]), tonumber(ov[1])
    if a == b and b == last_end then
      if pos >= to then break end
      pos = pos + char_len(s, pos)
    else
      if a > prev then fn(prev, a, false) end
      fn(a, b, true)
      prev, pos, last_end = b, b, b
    end
  end
  if prev < to then fn(prev, to, false) end
end

-- isolated(s, from, to, starts, stops): appends the non-empty pieces of
-- matches(), HF's "Isolated" split, to starts and stops (the hot path: no closure)
function Regex:isolated(s, from, to, starts, stops, newer)
  if newer and self.newer then return self.newer:isolated(s, from, to, starts, stops) end
  local L, ov, n = lib, self.ov, #starts
  local pos, flags, prev, last_end = from, 0, from, -1
  while pos <= to do
    local rc = L.loom_pcre2_match(self.code, s, to, pos, flags, self.md, nil)
    if rc == NOMATCH then break end
    if rc < 0 then self:fail(rc, s, from, to, pos) end
    flags = NO_UTF_CHECK
    local a, b = tonumber(ov[0]), tonumber(ov[1])
    if a == b and b == last_end then
      if pos >= to then break end
      pos = pos + char_len(s, pos)
    else
      if a > prev then n = n + 1 starts[n], stops[n] = prev, a end
      if b > a then n = n + 1 starts[n], stops[n] = a, b end
      prev, pos, last_end = b, b, b
    end
  end
  if prev < to then n = n + 1 starts[n], stops[n] = prev, to end
end

-- search(s): whether the regex matches in s; a Lua error when s is not
-- valid UTF-8 (PCRE2 checks the whole subject first)
function Regex:search(s)
  local rc = lib.loom_pcre2_match(self.code, s, #s, 0, 0, self.md, nil)
  if rc < 0 and rc ~= NOMATCH then self:fail(rc, s, 0, #s, 0) end
  return rc >= 0
end

-- a literal pattern (HF's {"String": ...}) with the same matches()
local Literal = {}
Literal.__index = Literal

function Literal:matches(s, from, to, fn)
  local lit, prev = self.pattern, from
  if lit ~= "" then
    while true do
      local a, b = s:find(lit, prev + 1, true)
      if not a or b > to then break end
      if a - 1 > prev then fn(prev, a - 1, false) end
      fn(a - 1, b, true)
      prev = b
    end
  end
  if prev < to then fn(prev, to, false) end
end

function Literal:isolated(s, from, to, starts, stops)
  local n = #starts
  self:matches(s, from, to, function(a, b) if b > a then n = n + 1 starts[n], stops[n] = a, b end end)
end

local function literal(s) return setmetatable({ pattern = s }, Literal) end

-- newer_than_tables(s): whether s holds a code point PCRE2's Unicode tables
-- (14.0) lack, or U+180E, for which from_onig's regexes have r.newer; a Lua error when
-- s is not valid UTF-8 (one search: PCRE2 checks the whole text first)
local unassigned
local function newer_than_tables(s)
  unassigned = unassigned or compile("[\\p{Cn}\\x{180E}]")   -- (and U+180E, which PCRE2's \\s holds)
  return unassigned:search(s)
end

return { compile = compile, from_onig = from_onig, literal = literal, newer_than_tables = newer_than_tables }
