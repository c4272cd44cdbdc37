-- sp_warning_spec.lua: SequenceParallel keeps each rank's values of the
-- norms' parameters (from_local); it warns when they differ between the
-- ranks, naming the parameter, and says nothing for a seeded model (the
-- README's own example used to print the warning). Two ranks, through
-- scripts/loomrun.
local sys = require("support.sys")

local script = [[
local loom = require "loom"
local dist = require "loom.distributed"
local tp = require "loom.parallel"
local mesh = dist.init_device_mesh("cpu", { 2 }, { mesh_dim_names = { "tp" } })
loom.manual_seed(0)
local model = loom.models.transformer.new { vocab_size = 65, dim = 32, n_layers = 2, n_heads = 4 }
if arg[1] == "differ" then
  loom.no_grad(function() model.layers[2].ffn_norm.weight:narrow(1, 3, 1):fill_(1 + dist.rank()) end)
end
tp.parallelize_module(model, mesh["tp"], loom.models.transformer.tp_plan({ sequence_parallel = true }, model))
print("done")
]]

describe("SequenceParallel's warning", function()
  local path
  setup(function() path = sys.tmpfile(script, ".lua") end)
  teardown(function() os.remove(path) end)

  it("is silent when the parameters are equal on every rank", function()
    local rc, out = sys.sh_clean(sys.root .. "scripts/loomrun -n 2 --timeout 60 " .. path)
    assert.equal(0, rc, out)
    assert.is_nil(out:find("warning", 1, true), out)
  end)

  it("names a parameter that differs", function()
    local rc, out = sys.sh_clean(sys.root .. "scripts/loomrun -n 2 --timeout 60 " .. path .. " differ")
    assert.equal(0, rc, out)
    local _, n = out:gsub("loom warning: SequenceParallel", "")
    assert.equal(1, n, out)
    assert.truthy(out:find("layers.2.ffn_norm.weight differs between the ranks", 1, true), out)
  end)
end)
