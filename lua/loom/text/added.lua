-- added.lua: finds a tokenizer's added tokens in text as HF tokenizers does
-- (an Aho-Corasick automaton, leftmost then longest, non-overlapping, with
-- lstrip / rstrip taking the White_Space beside a match). Here a byte trie:
-- string.find jumps to the next byte that starts some token, then the trie
-- walks from it, so a text costs its length times the depth walked (the
-- longest token at worst), not the number of tokens.
local unicode = require("loom.text.unicode")

local M = {}
local Matcher = {}
Matcher.__index = Matcher

-- new(entries) -> a matcher; each entry {content, id, lstrip, rstrip}, contents distinct
function M.new(entries)
  local root, firsts, seen = {}, {}, {}
  for _, e in ipairs(entries) do
    local node = root
    for i = 1, #e.content do
      local b = e.content:byte(i)
      node[b] = node[b] or {}
      node = node[b]
    end
    node.entry = e
    local b = e.content:byte(1)
    if not seen[b] then
      seen[b] = true
      local ch = string.char(b)
      firsts[#firsts + 1] = b == 0 and "%z" or ch:match("[%w\128-\255]") and ch or "%" .. ch
    end
  end
  local class = #firsts > 0 and "[" .. table.concat(firsts) .. "]" or nil
  return setmetatable({ root = root, class = class }, Matcher)
end

-- the longest token starting at byte i of s: its entry and last byte, or nil
local function longest_at(root, s, i, n)
  local node, best, best_j = root, nil, nil
  local byte = string.byte
  for j = i, n do
    node = node[byte(s, j)]
    if not node then break end
    if node.entry then best, best_j = node.entry, j end
  end
  return best, best_j
end

-- split(s, fn): calls fn(a, b, entry) for each piece of s in order (1-based,
-- inclusive; entry nil for the text between tokens, empty pieces left out)
function Matcher:split(s, fn)
  local n, pos, done = #s, 1, 1   -- pos: where the search goes on; done: what is already passed on
  local class, root = self.class, self.root
  if n == 0 then return end
  while class and pos <= n do
    local i = s:find(class, pos)
    if not i then break end
    local e, j = longest_at(root, s, i, n)
    if not e then
      pos = i + 1
    else
      local a, b = i, j
      if e.lstrip then a = math.max(unicode.space_before(s, a - 1, 1), done) end
      if e.rstrip then b = unicode.space_after(s, b + 1) - 1 end
      if done < a then fn(done, a - 1, nil) end
      fn(a, b, e)
      done, pos = b + 1, j + 1   -- the search goes on after the match itself, as HF's does
    end
  end
  if done <= n then fn(done, n, nil) end
end

return M
