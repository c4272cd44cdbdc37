-- loom.nn: modules (Module and the layers) and nn.utils.
local Module = require "loom.nn.module"
local layers = require "loom.nn.layers"

local nn = { Module = Module, utils = require "loom.nn.utils" }
for k, v in pairs(layers) do nn[k] = v end
return nn
