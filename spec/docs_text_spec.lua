-- docs_text_spec.lua: the Lua blocks of docs/text.md run, in order, as one
-- chunk (a later block uses an earlier one's locals), with print silenced.
local sys = require "support.sys"

describe("docs/text.md", function()
  it("runs its Lua blocks", function()
    local blocks = {}
    for code in sys.read("docs/text.md"):gmatch("\n```lua\n(.-)\n```") do blocks[#blocks + 1] = code end
    assert.is_true(#blocks >= 4, #blocks .. " Lua blocks")
    local chunk = assert(loadstring(table.concat(blocks, "\n"), "=docs/text.md"))
    local printed = {}
    local env = setmetatable({ print = function(...) printed[#printed + 1] = select("#", ...) end }, { __index = _G })
    setfenv(chunk, env)
    chunk()
    assert.is_true(#printed >= 3)
  end)
end)
