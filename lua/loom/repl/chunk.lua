-- chunk.lua: what the REPL does to a chunk before running it. Each chunk
-- is its own function, so a top-level `local x = 1` would be gone by the
-- next line; as Torch7's `th` does, the top-level `local`s become
-- assignments to the session's globals (`local x = 1` -> `x = 1`,
-- `local function f` -> `function f`, `local x` -> `x = nil`). Locals
-- inside functions and blocks stay locals.
local M = {}

local OPEN = { ["function"] = true, ["do"] = true, ["if"] = true, ["repeat"] = true }
local CLOSE = { ["end"] = true, ["until"] = true }

-- tokens(src): a list of {kind, text, from, to}: "name" (identifiers and
-- keywords), "sym" and "other" (strings, numbers, comments)
local function tokens(src)
  local out, i, n = {}, 1, #src
  local function add(kind, a, b) out[#out + 1] = { kind = kind, text = src:sub(a, b), from = a, to = b } end
  while i <= n do
    local c = src:sub(i, i)
    local lb = src:match("^%[(=*)%[", i) or src:match("^%-%-%[(=*)%[", i)
    if c:match("%s") then
      i = i + 1
    elseif lb and (c == "[" or src:sub(i, i + 1) == "--") then   -- long string or comment
      local _, e = src:find("]" .. lb .. "]", i, true)
      e = e or n
      add("other", i, e)
      i = e + 1
    elseif src:sub(i, i + 1) == "--" then
      local e = src:find("\n", i, true) or n
      add("other", i, e)
      i = e + 1
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = src:sub(j, j)
        if d == "\\" then j = j + 1 elseif d == c or d == "\n" then break end
        j = j + 1
      end
      add("other", i, j)
      i = j + 1
    elseif c:match("[%a_]") then
      local e = select(2, src:find("^[%w_]+", i))
      add("name", i, e)
      i = e + 1
    elseif c:match("%d") then
      local e = select(2, src:find("^[%w_%.]+", i))
      add("other", i, e)
      i = e + 1
    else
      add("sym", i, i)
      i = i + 1
    end
  end
  return out
end

-- globalize(src): src with its top-level locals made assignments
function M.globalize(src)
  local toks, depth, edits = tokens(src), 0, {}
  for k, t in ipairs(toks) do
    if t.kind == "name" then
      if OPEN[t.text] then depth = depth + 1
      elseif CLOSE[t.text] then depth = depth - 1
      elseif t.text == "local" and depth == 0 then
        local nxt = toks[k + 1]
        if nxt and nxt.text == "function" then
          edits[#edits + 1] = { t.from, nxt.from - 1, "" }
        elseif nxt and nxt.kind == "name" then
          -- the name list, then "=" or not
          local j = k + 1
          while toks[j + 1] and toks[j + 1].text == "," and toks[j + 2] and toks[j + 2].kind == "name" do j = j + 2 end
          edits[#edits + 1] = { t.from, nxt.from - 1, "" }
          if not (toks[j + 1] and toks[j + 1].text == "=") then
            edits[#edits + 1] = { toks[j].to + 1, toks[j].to, " = nil" }
          end
        end
      end
    end
  end
  for e = #edits, 1, -1 do
    local a, b, s = unpack(edits[e])
    src = src:sub(1, a - 1) .. s .. src:sub(b + 1)
  end
  return src
end

---------------------------------------------------------------------------
-- Scanner: whether the lines read so far may make a whole chunk, line by
-- line, each line scanned once (the REPL compiles the pending chunk only
-- when it may be whole: a 5000-line chunk pasted or piped is read in
-- linear time). It counts the blocks a chunk opens (function, do, if,
-- repeat) and closes (end, until), brackets, and long strings or comments
-- left open; it never says "not whole" of a chunk that is, as long as its
-- counts are only ever too low (a syntax error compiles as soon as it
-- could be the end, and its error shows).
local BLOCK = { ["function"] = 1, ["do"] = 1, ["if"] = 1, ["repeat"] = 1, ["end"] = -1, ["until"] = -1 }
local BRACKET = { ["("] = 1, ["{"] = 1, ["["] = 1, [")"] = -1, ["}"] = -1, ["]"] = -1 }

local Scanner = {}
Scanner.__index = Scanner

function M.scanner() return setmetatable({ depth = 0, long = nil, odd = false }, Scanner) end

-- s:feed(line): scans one more line
function Scanner:feed(line)
  local i, n = 1, #line
  if self.long then   -- inside a long string or comment: find its end
    local _, e = line:find("]" .. self.long .. "]", 1, true)
    if not e then return end
    self.long, i = nil, e + 1
  end
  while i <= n do
    local c = line:sub(i, i)
    if c == "-" and line:sub(i + 1, i + 1) == "-" then
      local lb = line:match("^%-%-%[(=*)%[", i)
      if not lb then return end   -- a comment to the end of the line
      local _, e = line:find("]" .. lb .. "]", i, true)
      if not e then self.long = lb return end
      i = e + 1
    elseif c == "[" and line:match("^%[=*%[", i) then
      local lb = line:match("^%[(=*)%[", i)
      local _, e = line:find("]" .. lb .. "]", i, true)
      if not e then self.long = lb return end
      i = e + 1
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = line:sub(j, j)
        if d == "\\" then j = j + 1 elseif d == c then break end
        j = j + 1
      end
      if j > n then self.odd = true end   -- a string left open (or continued by \): let the compiler say
      i = j + 1
    elseif c:match("[%a_]") then
      local w = line:match("^[%w_]+", i)
      self.depth = self.depth + (BLOCK[w] or 0)
      i = i + #w
    elseif c:match("%d") then
      i = i + #line:match("^[%w_%.]+", i)
    else
      self.depth = self.depth + (BRACKET[c] or 0)
      i = i + 1
    end
  end
end

-- s:maybe_whole(): false only when the chunk surely needs more lines
function Scanner:maybe_whole()
  return self.odd or (self.depth <= 0 and not self.long)
end

return M
