-- luacheck's settings for loom's Lua (scripts/lint.sh runs it in the suite)
std = "luajit"
max_line_length = false   -- long lines are long error messages and tables
unused_args = false       -- methods and callbacks keep the signature they are called with
-- 'not (x < y)' is written on purpose where x may be NaN
ignore = { "581" }
files["spec"] = { std = "+busted" }
files["scripts/run_specs.lua"] = { globals = { "arg" } }   -- busted's runner reads its own arguments from arg
exclude_files = { "build*/**", ".gpu/**" }
