-- rock_spec.lua: the rock installs with Debian's Lua libraries and no
-- rocks server (scripts/install-rock picks --deps-mode=none), into a
-- scratch tree, saying nothing alarming and ending with the one line that
-- puts the tree on the paths; from outside the checkout, `require("loom")`,
-- the installed loomrun and the installed loom REPL work (the commands
-- also with no paths set). (The first install builds
-- libloom in build.luarocks/, minutes; later ones reuse it.)
local sys = require("support.sys")

local root = (debug.getinfo(1, "S").source:match("^@(.*)spec/rock_spec%.lua$") or "./")
if root == "" then root = "./" end
root = io.popen("cd " .. root .. " && pwd"):read("*l") .. "/"

describe("the rock", function()
  local tree, away
  setup(function()
    tree, away = sys.tmpdir(), sys.tmpdir()
  end)
  teardown(function()
    sys.rmtree(tree)
    sys.rmtree(away)
  end)

  it("installs with Debian's libraries and no server, and runs from outside the checkout", function()
    -- no server to ask: an unreachable proxy for anything luarocks would fetch
    local rc, out = sys.sh("cd " .. away .. " && http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 "
                           .. root .. "scripts/install-rock --tree " .. tree)
    assert.equal(0, rc, out)
    assert.truthy(out:find("--deps-mode=none", 1, true), out)
    -- nothing alarming, and the one line that puts the tree on the paths
    assert.is_nil(out:find("Missing dependencies", 1, true), out)
    assert.truthy(out:find('eval "$(luarocks --lua-version=5.1 --tree ' .. tree .. ' path --bin)"', 1, true), out)
    -- the installed commands run as they are, with no paths set
    rc, out = sys.sh("cd " .. away .. " && unset LUA_PATH LUA_CPATH && echo 'loom.ones(2):sum():item()' | "
                     .. tree .. "/bin/loom")
    assert.equal(0, rc, out)
    assert.equal("2\n", out)
    local env = "cd " .. away .. ' && eval "$(luarocks --lua-version=5.1 --tree ' .. tree .. ' path)" && '
    rc, out = sys.sh(env .. [[luajit -e 'local loom = require("loom")
print(loom.ones(2, 3):sum():item(), package.searchpath("loom", package.path))']])
    assert.equal(0, rc, out)
    assert.equal("6\t" .. tree .. "/share/lua/5.1/loom/init.lua\n", out)
    sys.write(away .. "/ws.lua", 'print("world", require("loom.distributed").get_world_size())\n')
    rc, out = sys.sh(env .. tree .. "/bin/loomrun -n 2 --timeout 60 ws.lua")
    assert.equal(0, rc, out)
    assert.truthy(out:find("[0] world\t2", 1, true) and out:find("[1] world\t2", 1, true), out)
    rc, out = sys.sh(env .. "echo 'loom.ones(2, 3):size()' | " .. tree .. "/bin/loom")
    assert.equal(0, rc, out)
    assert.equal("loom.Size{2, 3}\n", out)
  end)
end)
