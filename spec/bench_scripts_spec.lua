-- bench_scripts_spec.lua: every benchmark script (scripts/bench_*.lua)
-- loads its modules and answers --help with its usage and exit 0: as
-- `luajit scripts/bench_x.lua` when it finds loom itself (it sets
-- package.path), else under `scripts/loomrun -n 1` (the multi-rank ones).
-- Two of them once required a module the Lua packages had moved (loom.bench
-- became loom.train.bench) and failed at their first line; nothing ran them.
local sys = require("support.sys")

local function scripts()
  local list = {}
  local p = io.popen("ls " .. sys.root .. "scripts/bench_*.lua")
  for f in p:lines() do list[#list + 1] = f:match("scripts/bench_[%w_]+%.lua$") end
  p:close()
  return list
end

describe("scripts/bench_*.lua", function()
  local list = scripts()
  it("are there", function() assert.is_true(#list >= 10, "found " .. #list) end)
  for _, f in ipairs(list) do
    it(f .. " --help prints its usage and exits 0", function()
      local standalone = sys.read(sys.root .. f):find("package.path", 1, true) ~= nil
      local launch = standalone and "luajit " or "scripts/loomrun -n 1 "
      local rc, out = sys.sh_clean(launch .. f .. " --help")
      assert.equal(0, rc, out)
      assert.truthy(out:lower():find("usage", 1, true), out)
    end)
  end
end)
