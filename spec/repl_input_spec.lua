-- repl_input_spec.lua: how the REPL reads its input: a chunk ends on the
-- line that completes it (blocks, brackets, long strings and comments
-- across lines), a mistake shows at once, and a long chunk is read in
-- linear time (the pending chunk is compiled only when it may be whole,
-- not again on every line: counted, not timed). Also `return` echoes.
local repl = require("loom.repl")
local session = require("loom.repl.session")
local sys = require("support.sys")

-- a reader over a list of lines; reader.asked counts the lines handed out
local function reader_of(lines)
  local r = { asked = 0 }
  function r.line(self)
    self.asked = self.asked + 1
    return lines[self.asked]
  end
  return r
end

local function split(src)
  local out = {}
  for l in (src .. "\n"):gmatch("([^\n]*)\n") do out[#out + 1] = l end
  return out
end

describe("the REPL's input", function()
  it("ends each chunk on the line that completes it", function()
    local chunks = {
      "x = 1",
      "for i = 1, 3 do\n  x = x + i\nend",
      "function f(a)\n  if a then\n    return 1\n  elseif not a then\n    return 2\n  else return 3 end\nend",
      "repeat\n  x = x - 1\nuntil x < 0",
      "t = {\n  a = 1,\n  b = { 2, 3 },\n}",
      "s = [[\nend end end\n]]",
      "s = [==[\n]]\n]==]",
      "--[[ a comment\nthat says do and function\n]] y = 2",
      "print(\n  'a',\n  \"b\"\n)",
      "z = t[\n1]",
      "while false do end",
      "local g = function() return 'do' end",
      "w = 1 -- do function if",
      "if x then\n  s = 'end'\nend",
    }
    local r = reader_of(split(table.concat(chunks, "\n")))
    for _, c in ipairs(chunks) do
      assert.equal(c, repl.read_chunk(r))
    end
    assert.is_nil(repl.read_chunk(r))
  end)

  it("returns a chunk with a mistake as soon as it is typed, for the error to show", function()
    local r = reader_of({ "for i = 1, 3 do x = = 1", "end" })
    assert.equal("for i = 1, 3 do x = = 1", repl.read_chunk(r))
    r = reader_of({ "for i = 1, 3 do", "x = = 1", "end" })
    assert.equal("for i = 1, 3 do\nx = = 1", repl.read_chunk(r))
    r = reader_of({ "end end", "x = 1" })
    assert.equal("end end", repl.read_chunk(r))
  end)

  it("compiles a long chunk a few times, not once a line", function()
    local lines = { "do local s = 0" }
    for i = 1, 5000 do lines[#lines + 1] = "  s = s + " .. (i % 7) end
    lines[#lines + 1] = "  total = s end"
    local r = reader_of(lines)
    local before = session.compiles
    local src = repl.read_chunk(r)
    local compiles = session.compiles - before
    assert.equal(5002, r.asked)
    assert.equal(table.concat(lines, "\n"), src)
    -- every line would be 5002 (the reading before); small chunks compile
    -- each line (about 100 lines of 1 KB here), then at each doubling
    assert.is_true(compiles < 150, compiles .. " compiles for 5002 lines")
  end)

  it("runs a piped 5000-line chunk and the chunks after it", function()
    local lines = { "do local s = 0" }
    for i = 1, 5000 do lines[#lines + 1] = "  s = s + " .. (i % 7) end
    lines[#lines + 1] = "  total = s end"
    lines[#lines + 1] = "total"
    lines[#lines + 1] = "require('loom.repl.session').compiles"
    local rc, out = sys.sh_input(sys.root .. "scripts/loom", table.concat(lines, "\n") .. "\n")
    assert.equal(0, rc, out)
    local total, compiles = out:match("^(%d+)\n(%d+)\n$")
    local want = 0
    for i = 1, 5000 do want = want + i % 7 end
    assert.equal(want, tonumber(total), out)
    assert.is_true(tonumber(compiles) < 150, out)
  end)

  it("echoes what a chunk returns, as an expression's values", function()
    local s, out = session.new(), {}
    local function w(text) out[#out + 1] = text end
    assert.is_true(s:run("return 2 + 2", w))
    assert.is_true(s:run("return 1, 'a'", w))
    assert.is_true(s:run("return", w))
    assert.is_true(s:run("local x = 3 return x", w))
    assert.is_true(s:run("{ n = 2 }", w))
    assert.same({ "4\n", "1\ta\n", "3\n", "{n = 2}\n" }, out)
  end)
end)
