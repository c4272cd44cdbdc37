-- train.lua: trains a decoder model (Llama-style, GPT-2, or any family
-- loom imports from Hugging Face with --init-from) on a text file
-- (tinyshakespeare by default) at any parallel layout. The program is
-- loom.train (lua/loom/train/); `luajit examples/train.lua --help` lists
-- the flags.
local root = debug.getinfo(1, "S").source:match("^@(.*)examples/train%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path

require("loom.train.cli").run("train.lua", require("loom.train.main").main, arg or {}, root)
