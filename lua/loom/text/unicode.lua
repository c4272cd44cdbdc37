-- unicode.lua: Unicode normalization (NFC, NFD, NFKC, NFKD) and White_Space
-- through utf8proc (Debian's libutf8proc2, called through the FFI), for the
-- tokenizers' normalizers and the added tokens' lstrip/rstrip. Declared under
-- loom's own names (asm), so a script's declarations of utf8proc never clash.
local ffi = require("ffi")

ffi.cdef [[
int64_t loom_utf8proc_decompose(const uint8_t *str, int64_t len, int32_t *buf, int64_t bufsize, int options)
  asm("utf8proc_decompose");
int64_t loom_utf8proc_reencode(int32_t *buf, int64_t len, int options) asm("utf8proc_reencode");
int loom_utf8proc_category(int32_t cp) asm("utf8proc_category");
const char *loom_utf8proc_errmsg(int64_t code) asm("utf8proc_errmsg");
const char *loom_utf8proc_unicode_version(void) asm("utf8proc_unicode_version");
]]

local M = {}
local STABLE, COMPAT, COMPOSE, DECOMPOSE = 2, 4, 8, 16
local FORMS = { NFC = STABLE + COMPOSE, NFD = STABLE + DECOMPOSE, NFKC = STABLE + COMPOSE + COMPAT,
                NFKD = STABLE + DECOMPOSE + COMPAT }

local lib
local function utf8proc()
  if lib then return lib end
  for _, name in ipairs { "utf8proc", "libutf8proc.so.2", "libutf8proc.so.3" } do
    local ok, l = pcall(ffi.load, name)
    if ok then lib = l return l end
  end
  error("loom.text.unicode: libutf8proc is not installed (apt-get install libutf8proc2)", 3)
end

function M.unicode_version() return ffi.string(utf8proc().loom_utf8proc_unicode_version()) end

local buf, buf_n = nil, 0

-- normalize(s, form) -> s in NFC / NFD / NFKC / NFKD. Text of code points
-- below U+0300 only (no byte from 0xCC up) is already NFC and NFD: it is
-- returned as it is, without a call.
-- The code points that HF's NFC (older tables, about Unicode 9) neither
-- reorders nor composes while utf8proc (Unicode 15.0) does: marks added
-- since, U+11930 (Dives Akuru's composition, 13.0), and U+11A7 (utf8proc 2.8
-- composes it into a Hangul syllable, dropping it, though the trailing
-- consonants are U+11A8..U+11C2). A text holding one is normalized in parts
-- with each of them alone, as HF in effect does (to it they are starters
-- with no composition). scripts/make_unicode_newer.py found them.
local isolate
local function isolated_chars()
  if isolate then return isolate end
  local class = {}
  for _, r in ipairs(require("loom.text.unicode_newer").nfc_isolate) do
    class[#class + 1] = string.format("\\x{%X}-\\x{%X}", r[1], r[2])
  end
  isolate = require("loom.text.regex").compile("[" .. table.concat(class) .. "]")
  return isolate
end

local normalize_one

function M.normalize(s, form)
  local opts = FORMS[form]
  if not opts then error("unicode.normalize: form: expected NFC, NFD, NFKC or NFKD, got " .. tostring(form), 2) end
  if (form == "NFC" or form == "NFD") and not s:find("[\204-\255]") then return s end
  if #s == 0 or not s:find("[\223-\255]") then return normalize_one(s, opts) end   -- (below U+07C0: none of them)
  local out = {}
  isolated_chars():matches(s, 0, #s, function(a, b, is_match)
    out[#out + 1] = is_match and s:sub(a + 1, b) or normalize_one(s:sub(a + 1, b), opts)
  end)
  return table.concat(out)
end

function normalize_one(s, opts)
  if #s == 0 then return s end
  local L = utf8proc()
  local n = L.loom_utf8proc_decompose(s, #s, buf, buf_n, opts)
  if n > buf_n then   -- a decomposition is longer than its text in code points: ask again with room
    buf_n = tonumber(n) + 64
    buf = ffi.new("int32_t[?]", buf_n)
    n = L.loom_utf8proc_decompose(s, #s, buf, buf_n, opts)
  end
  if n < 0 then error("unicode: " .. ffi.string(L.loom_utf8proc_errmsg(n)) .. " (is the text valid UTF-8?)", 3) end
  local bytes = L.loom_utf8proc_reencode(buf, n, opts)   -- composes, then writes UTF-8 over buf (4 bytes per code point at most)
  if bytes < 0 then error("unicode: " .. ffi.string(L.loom_utf8proc_errmsg(bytes)), 3) end
  return ffi.string(buf, bytes)
end

-- utf8proc's categories 23-25: Zs, Zl, Zp
local ZS, ZP = 23, 25

-- is_space(cp): the White_Space property (Rust's char::is_whitespace): the
-- separators Zs/Zl/Zp, tab to carriage return and U+0085
function M.is_space(cp)
  if cp <= 0x20 then return cp == 0x20 or (cp >= 9 and cp <= 13) end
  if cp < 0x85 then return false end
  if cp == 0x85 then return true end
  local c = utf8proc().loom_utf8proc_category(cp)
  return c >= ZS and c <= ZP
end

-- decode one UTF-8 character of s ending just before byte i + 1 (1-based i):
-- its code point and its first byte's index
local function char_before(s, i)
  local j = i
  while j > 1 and bit.band(s:byte(j), 0xC0) == 0x80 do j = j - 1 end
  local c = s:byte(j)
  local cp
  if c < 0x80 then cp = c
  elseif c >= 0xF0 then cp = bit.band(c, 7)
  elseif c >= 0xE0 then cp = bit.band(c, 15)
  else cp = bit.band(c, 31) end
  for k = j + 1, i do cp = cp * 64 + bit.band(s:byte(k), 63) end
  return cp, j
end

local function char_at(s, i)
  local c = s:byte(i)
  local len = c < 0x80 and 1 or c >= 0xF0 and 4 or c >= 0xE0 and 3 or 2
  local cp = len == 1 and c or bit.band(c, len == 2 and 31 or len == 3 and 15 or 7)
  for k = i + 1, math.min(i + len - 1, #s) do cp = cp * 64 + bit.band(s:byte(k), 63) end
  return cp, len
end

-- space_before(s, i, floor): the index where the run of White_Space ending
-- at byte i (1-based, inclusive) starts, not before floor
function M.space_before(s, i, floor)
  while i >= floor do
    local cp, j = char_before(s, i)
    if j < floor or not M.is_space(cp) then break end
    i = j - 1
  end
  return i + 1
end

-- space_after(s, i): the index after the run of White_Space starting at byte i
function M.space_after(s, i)
  while i <= #s do
    local cp, len = char_at(s, i)
    if not M.is_space(cp) then break end
    i = i + len
  end
  return i
end

-- lossy(s): s with each maximal invalid UTF-8 subsequence replaced by one
-- U+FFFD, as Rust's String::from_utf8_lossy (HF's decoders) does
local REPLACEMENT = "\239\191\189"
function M.lossy(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n, start, byte = {}, 1, #s, 1, string.byte
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local need, lo, hi = 0, 0x80, 0xBF   -- the second byte's range (Unicode's table 3-7)
      if c >= 0xC2 and c <= 0xDF then need = 1
      elseif c == 0xE0 then need, lo = 2, 0xA0
      elseif c == 0xED then need, hi = 2, 0x9F
      elseif c >= 0xE1 and c <= 0xEF then need = 2
      elseif c == 0xF0 then need, lo = 3, 0x90
      elseif c == 0xF4 then need, hi = 3, 0x8F
      elseif c >= 0xF1 and c <= 0xF3 then need = 3 end
      local j, ok = i + 1, need > 0
      for k = 1, need do
        local d = byte(s, j)
        if not d or d < (k == 1 and lo or 0x80) or d > (k == 1 and hi or 0xBF) then ok = false break end
        j = j + 1
      end
      if not ok then   -- bytes i .. j - 1: the maximal subpart, one U+FFFD
        out[#out + 1] = s:sub(start, i - 1)
        out[#out + 1] = REPLACEMENT
        start = j
      end
      i = j
    end
  end
  out[#out + 1] = s:sub(start)
  return table.concat(out)
end

return M
