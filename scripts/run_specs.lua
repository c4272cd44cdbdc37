-- run_specs.lua: busted's runner inside this LuaJIT process (no re-exec, so it
-- works the same under mpirun), with the checkout's lua/ on the path and
-- spec/support/helper.lua as busted's helper (as .busted names it).
-- Usage: luajit scripts/run_specs.lua [busted options] spec/...
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/run_specs%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
arg = arg or {}
table.insert(arg, 1, "--ignore-lua")
table.insert(arg, 2, "--helper=" .. root .. "spec/support/helper.lua")
require("busted.runner") ({ standalone = false })
