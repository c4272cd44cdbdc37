-- loom.nn: modules (Module and the layers) and nn.utils.
local Module = require("loom.nn.module")
require("loom.nn.module_to")   -- Module:to, to_empty, init_weights
local layers = require("loom.nn.layers")

local nn = { Module = Module, utils = require("loom.nn.utils"), init = require("loom.nn.weights") }
for k, v in pairs(layers) do nn[k] = v end
local moe = require("loom.nn.moe")   -- mixture of experts: nn.MoE (and its experts, nn.MoEExperts)
nn.MoE, nn.MoEExperts = moe.MoE, moe.MoEExperts
nn.MoE.load_balancing_loss = moe.load_balancing_loss
return nn
