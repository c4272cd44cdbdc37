-- helper.lua: busted's helper (named in .busted and passed by
-- scripts/run_specs.lua). It puts spec/ on package.path, so a spec reaches
-- the shared support modules with a plain `require("support.ref")` (see
-- spec/support/*.lua), from any directory and under mpirun alike.
local spec_dir = debug.getinfo(1, "S").source:match("^@(.-)support/helper%.lua$") or "spec/"
package.path = spec_dir .. "?.lua;" .. package.path
