-- regex.lua: Unicode regular expressions through PCRE2 (Debian's
-- libpcre2-8-0, called through the FFI), for the pre-tokenizers' patterns
-- (GPT-2's, Llama 3's: \p{L}, \p{N}, lookahead). Patterns compile with
-- UTF and UCP, as Oniguruma (which HF tokenizers uses) reads them, and are
-- JIT-compiled when PCRE2 can.
local ffi = require("ffi")

ffi.cdef [[
typedef struct pcre2_real_code_8 pcre2_code_8;
typedef struct pcre2_real_match_data_8 pcre2_match_data_8;
pcre2_code_8 *pcre2_compile_8(const uint8_t *, size_t, uint32_t, int *, size_t *, void *);
void pcre2_code_free_8(pcre2_code_8 *);
int pcre2_jit_compile_8(pcre2_code_8 *, uint32_t);
pcre2_match_data_8 *pcre2_match_data_create_from_pattern_8(const pcre2_code_8 *, void *);
void pcre2_match_data_free_8(pcre2_match_data_8 *);
int pcre2_match_8(const pcre2_code_8 *, const char *, size_t, size_t, uint32_t, pcre2_match_data_8 *, void *);
size_t *pcre2_get_ovector_pointer_8(pcre2_match_data_8 *);
int pcre2_get_error_message_8(int, uint8_t *, size_t);
]]

local UTF, UCP, JIT_COMPLETE, NO_UTF_CHECK, NOMATCH = 0x00080000, 0x00020000, 1, 0x40000000, -1

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
  pcre2().pcre2_get_error_message_8(code, buf, 256)
  return ffi.string(buf)
end

local Regex = {}
Regex.__index = Regex

-- compile(pattern) -> a regex; a Lua error naming the pattern when it is bad
local function compile(pattern)
  if type(pattern) ~= "string" then error("regex: pattern: expected a string, got " .. type(pattern), 2) end
  local L = pcre2()
  local err, off = ffi.new("int[1]"), ffi.new("size_t[1]")
  local code = L.pcre2_compile_8(ffi.cast("const uint8_t *", pattern), #pattern, UTF + UCP, err, off, nil)
  if code == nil then
    error(string.format("regex: cannot compile %q at offset %d: %s", pattern, tonumber(off[0]), message(err[0])), 2)
  end
  -- the finalizers hold L: a library whose namespace is collected (busted
  -- unloads modules between files) is closed, and a pointer into it would
  -- dangle
  code = ffi.gc(code, function(c) L.pcre2_code_free_8(c) end)
  L.pcre2_jit_compile_8(code, JIT_COMPLETE)   -- the interpreter when the JIT is not there
  local md = ffi.gc(L.pcre2_match_data_create_from_pattern_8(code, nil), function(m) L.pcre2_match_data_free_8(m) end)
  return setmetatable({ code = code, md = md, ov = L.pcre2_get_ovector_pointer_8(md), pattern = pattern }, Regex)
end

-- split(s, from, to, fn): calls fn(start, stop) (0-based, stop exclusive) for
-- each match of s[from, to) and each gap between matches, in order (HF's
-- "Isolated" behaviour). The first search checks that s is valid UTF-8.
function Regex:split(s, from, to, fn)
  local L, ov = lib, self.ov   -- s itself is passed: a pointer cast from it would not keep it alive
  local pos, flags = from, 0
  while pos < to do
    local rc = L.pcre2_match_8(self.code, s, to, pos, flags, self.md, nil)
    if rc == NOMATCH then break end
    if rc < 0 then error("regex: " .. message(rc) .. " (is the text valid UTF-8?)", 3) end
    flags = NO_UTF_CHECK
    local a, b = tonumber(ov[0]), tonumber(ov[1])
    if a > pos then fn(pos, a) end
    if b == a then   -- an empty match: step over one character
      b = a + 1
      while b < to and bit.band(s:byte(b + 1), 0xC0) == 0x80 do b = b + 1 end
      fn(a, b)
    else
      fn(a, b)
    end
    pos = b
  end
  if pos < to then fn(pos, to) end
end

return { compile = compile }
