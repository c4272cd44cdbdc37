-- user_script_spec.lua: a user's own script, outside the checkout, finds
-- loom after the one line the README shows: eval "$(scripts/loom --env)"
-- (LUA_PATH to the checkout's lua/; libloom is found beside it). Without
-- it, luajit says "module 'loom' not found", as any Lua module would.
local sys = require("support.sys")

describe("a script beside the checkout", function()
  local dir
  setup(function()
    dir = sys.tmpdir()
    sys.write(dir .. "/mine.lua", 'local loom = require "loom"\nprint(loom.ones(2, 3):sum():item())\n')
  end)
  teardown(function() sys.rmtree(dir) end)

  local root = io.popen("cd " .. sys.root .. " && pwd"):read("*l")

  it("finds loom after eval \"$(scripts/loom --env)\"", function()
    local rc, out = sys.sh("cd " .. dir .. " && unset LUA_PATH LUA_CPATH && eval \"$(" .. root
                           .. "/scripts/loom --env)\" && luajit mine.lua")
    assert.equal(0, rc, out)
    assert.equal("6\n", out)
    -- a world of one under plain luajit, and the same line again changes nothing
    rc, out = sys.sh("unset LUA_PATH; eval \"$(" .. root .. "/scripts/loom --env)\"; a=$LUA_PATH; eval \"$("
                     .. root .. "/scripts/loom --env)\"; [ \"$a\" = \"$LUA_PATH\" ] && echo same")
    assert.equal(0, rc, out)
    assert.equal("same\n", out)
  end)

  it("does not without it (what the line is for)", function()
    local rc, out = sys.sh("cd " .. dir .. " && unset LUA_PATH LUA_CPATH && luajit mine.lua")
    assert.are_not.equal(0, rc)
    assert.truthy(out:find("module 'loom' not found", 1, true), out)
  end)
end)
